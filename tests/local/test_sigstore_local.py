"""Sign -> verify round trips on the private instance (Rekor v1 and v2, artifacts and DSSE)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sigstore.errors import VerificationError
from sigstore.models import Bundle, TrustedRoot
from sigstore.verify import Verifier, policy

from pipeline.core.errors import InfrastructureError
from pipeline.local import sigstore as sigstore_local
from pipeline.local.signing import local_signer
from pipeline.verify.external import cosign_verify, sigstore_js_verify

STATEMENT = (b'{"_type":"https://in-toto.io/Statement/v1","subject":[{"name":"x.bin","digest":{"sha256":"'
             + b"ab" * 32 + b'"}}],"predicateType":"https://slsa.dev/provenance/v1","predicate":{"k":"v"}}')


def _kind(bundle: Path) -> tuple[str, str]:
    entry = json.loads(bundle.read_text())["verificationMaterial"]["tlogEntries"][0]
    return entry["kindVersion"]["kind"], entry["kindVersion"]["version"]


@pytest.mark.parametrize("rekor", [1, 2])
def test_round_trip_artifact_and_dsse(rekor: int, request: pytest.FixtureRequest, sigstore_instance: object,
                                      tmp_path: Path) -> None:
    signer = request.getfixturevalue(f"signer_v{rekor}")
    artifact = tmp_path / "x.bin"
    artifact.write_bytes(b"\x00payload\xff" * 1000)
    statement = tmp_path / "x.intoto.json"
    statement.write_bytes(STATEMENT)
    blob_bundle = signer.sign_file(artifact)
    dsse_bundle = signer.sign_statement(statement)
    assert blob_bundle.name == "x.bin.sigstore.json"
    assert json.loads(blob_bundle.read_text())["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert _kind(blob_bundle) == ("hashedrekord", "0.0.1" if rekor == 1 else "0.0.2")
    assert _kind(dsse_bundle) == (("dsse", "0.0.1") if rekor == 1 else ("hashedrekord", "0.0.2"))

    root = sigstore_instance.trusted_root  # type: ignore[attr-defined]
    verifier = Verifier(trusted_root=TrustedRoot.from_file(str(root)))
    identity = policy.Identity(identity=signer.identity, issuer=signer.issuer)
    verifier.verify_artifact(artifact.read_bytes(), Bundle.from_json(blob_bundle.read_bytes()), identity)
    payload_type, payload = verifier.verify_dsse(Bundle.from_json(dsse_bundle.read_bytes()), identity)
    assert (payload_type, payload) == ("application/vnd.in-toto+json", STATEMENT)

    wrong = policy.Identity(identity=signer.identity + "/other", issuer=signer.issuer)
    with pytest.raises(VerificationError):
        verifier.verify_artifact(artifact.read_bytes(), Bundle.from_json(blob_bundle.read_bytes()), wrong)
    with pytest.raises(VerificationError):
        verifier.verify_artifact(artifact.read_bytes() + b"!", Bundle.from_json(blob_bundle.read_bytes()), identity)

    job = {"identity": signer.identity, "issuer": signer.issuer}
    js = sigstore_js_verify(root, [
        {**job, "bundle": str(blob_bundle), "artifact": str(artifact)},
        {**job, "bundle": str(dsse_bundle), "artifact": None, "payload_file": str(statement)},
        {**job, "bundle": str(blob_bundle), "artifact": str(statement)},
        {**job, "identity": "https://benchseal.invalid/signers/someone-else", "bundle": str(dsse_bundle), "artifact": None},
    ])
    assert [o.ok for o in js] == [True, True, False, False], js


def test_cosign_round_trip_rekor_v1(signer_v1: object, sigstore_instance: object, cosign_bin: Path, tmp_path: Path) -> None:
    artifact = tmp_path / "y.txt"
    artifact.write_text("cosign checks this\n")
    bundle = signer_v1.sign_file(artifact)  # type: ignore[attr-defined]
    root = sigstore_instance.trusted_root  # type: ignore[attr-defined]
    ident, iss = signer_v1.identity, signer_v1.issuer  # type: ignore[attr-defined]
    assert cosign_verify(artifact, bundle, ident, iss, trusted_root=root).ok
    assert not cosign_verify(artifact, bundle, ident + "x", iss, trusted_root=root).ok
    assert not cosign_verify(artifact, bundle, ident, "https://token.actions.githubusercontent.com", trusted_root=root).ok
    artifact.write_text("cosign checks this!\n")
    assert not cosign_verify(artifact, bundle, ident, iss, trusted_root=root).ok


def test_fulcio_rejects_a_forged_token(sigstore_instance: object) -> None:
    """A token not signed by the instance's OIDC key gets no certificate."""
    import base64

    header = base64.urlsafe_b64encode(b'{"alg":"none"}').rstrip(b"=").decode()
    claims = base64.urlsafe_b64encode(json.dumps({
        "iss": sigstore_local.LOCAL_ISSUER, "sub": sigstore_local.LOCAL_IDENTITY, "aud": "sigstore",
        "iat": 1, "exp": 4102444800}).encode()).rstrip(b"=").decode()
    url = sigstore_instance.url + "/api/v2/signingCert"  # type: ignore[attr-defined]
    request = urllib.request.Request(url, data=b'{"certificateSigningRequest": "x"}', method="POST",
                                     headers={"Authorization": f"Bearer {header}.{claims}.", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 401
    assert b"identity token rejected" in info.value.read()


def _post(url: str, body: dict[str, Any], token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """POST JSON; (status, headers, body) for any answer, 4xx included."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _key_request(key: Any, signed: bytes) -> dict[str, Any]:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    proof = key.sign(signed, ec.ECDSA(hashes.SHA256()))
    return {"publicKeyRequest": {"publicKey": {"algorithm": "ECDSA", "content": pem.decode()},
                                 "proofOfPossession": base64.b64encode(proof).decode()}}


def test_fulcio_v2_answers_as_fulcio_does_and_checks_the_proof_of_possession(sigstore_instance: Any) -> None:
    """Fulcio's v2 signingCert answers 200 (sigstore-go, inside cosign 3 and gh, accepts nothing else; only the
    legacy v1 route answers 201), and a public key comes with a signature over the token's subject by that key."""
    from cryptography.hazmat.primitives.asymmetric import ec

    token = sigstore_local.mint_token(sigstore_instance)
    key = ec.generate_private_key(ec.SECP256R1())
    url = sigstore_instance.url + "/api/v2/signingCert"
    status, _, body = _post(url, _key_request(key, sigstore_local.LOCAL_IDENTITY.encode()), token)
    assert status == 200, body
    assert json.loads(body)["signedCertificateEmbeddedSct"]["chain"]["certificates"]
    for proof_of, reason in ((b"someone else", b"proof of possession"), (None, b"needs publicKey.content and proofOfPossession")):
        request = _key_request(key, proof_of or b"")
        if proof_of is None:
            del request["publicKeyRequest"]["proofOfPossession"]
        status, _, body = _post(url, request, token)
        assert status == 400 and reason in body, body
    other = ec.generate_private_key(ec.SECP256R1())  # a proof by another key than the one to certify
    request = _key_request(key, sigstore_local.LOCAL_IDENTITY.encode())
    request["publicKeyRequest"]["proofOfPossession"] = _key_request(other, sigstore_local.LOCAL_IDENTITY.encode())[
        "publicKeyRequest"]["proofOfPossession"]
    status, _, body = _post(url, request, token)
    assert status == 400 and b"proof of possession" in body, body


def test_rekor_v1_answers_the_entry_id_as_rekor_does(sigstore_instance: Any) -> None:
    """Rekor's createLogEntry: 201, the entry keyed by its entry ID (the tree id as 16 hex digits, then the leaf
    hash, 80 hex in all) and that ID as the ETag and at the end of the Location (sigstore-go reads the entry as
    payload[ETag]; without the header cosign 3 panicked on a nil entry)."""
    import hashlib

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    data = b"rekor v1 entry"
    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    proposed = {"apiVersion": "0.0.1", "kind": "hashedrekord", "spec": {
        "signature": {"content": base64.b64encode(key.sign(data, ec.ECDSA(hashes.SHA256()))).decode(),
                      "publicKey": {"content": base64.b64encode(pem).decode()}},
        "data": {"hash": {"algorithm": "sha256", "value": hashlib.sha256(data).hexdigest()}}}}
    status, headers, body = _post(sigstore_instance.url + "/rekor/api/v1/log/entries", proposed)
    assert status == 201, body
    (entry_id, entry), = json.loads(body).items()
    leaf = hashlib.sha256(b"\x00" + base64.b64decode(entry["body"])).hexdigest()
    assert len(entry_id) == 80 and entry_id.endswith(leaf) and re.fullmatch(r"[0-9a-f]{16}", entry_id[:16])
    assert headers["ETag"] == entry_id
    assert headers["Location"] == f"/rekor/api/v1/log/entries/{entry_id}"


def test_signer_reports_an_instance_that_is_gone(tmp_path: Path) -> None:
    state = tmp_path / "short-lived"
    signer = local_signer(state=state)
    sigstore_local.stop(state)
    assert sigstore_local.status(state)["answers"] is False
    artifact = tmp_path / "z"
    artifact.write_text("z")
    with pytest.raises(InfrastructureError):
        signer.sign_file(artifact)


def test_cli_start_status_stop(tmp_path: Path) -> None:
    state = str(tmp_path / "cli-state")
    cli = [sys.executable, "-m", "pipeline", "sigstore"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args, "--state", state], capture_output=True, text=True, timeout=60, check=False)

    started = run("start")
    assert started.returncode == 0, started.stderr
    status = run("status", "--json")
    info = json.loads(status.stdout)
    assert status.returncode == 0 and info["answers"] is True and isinstance(info["pid"], int)
    again = run("start")
    assert again.returncode == 0 and f"pid {info['pid']}" in again.stdout  # idempotent: same process
    assert run("stop").returncode == 0
    assert run("status").returncode == 1
    proc = Path(f"/proc/{info['pid']}/status")
    # Gone, or a zombie awaiting a reaper that is not ours.
    assert not proc.exists() or "State:\tZ" in proc.read_text()


def test_restart_keeps_earlier_bundles_verifiable(tmp_path: Path, cosign_bin: Path) -> None:
    """A restart makes new keys; the old instance's keys stay in trusted_root.json, retired."""
    state = tmp_path / "rotating"

    def sign_and_stop(artifact: Path, text: str) -> tuple[Path, Any]:
        """``artifact`` signed by an instance started for it, which is stopped afterwards; (bundle, signer)."""
        artifact.write_text(text)
        signer = local_signer(state=state)
        bundle: Path = signer.sign_file(artifact)
        signer.close()
        sigstore_local.stop(state)
        return bundle, signer

    old_artifact, new_artifact = tmp_path / "old.txt", tmp_path / "new.txt"
    old_bundle, _ = sign_and_stop(old_artifact, "signed before the restart\n")
    new_bundle, second = sign_and_stop(new_artifact, "signed after the restart\n")

    root_path = state / "trusted_root.json"
    root = json.loads(root_path.read_text())
    assert len(root["certificateAuthorities"]) == 2 and len(root["tlogs"]) == 4
    assert "end" in root["certificateAuthorities"][0]["validFor"]
    verifier = Verifier(trusted_root=TrustedRoot.from_file(str(root_path)))
    ident = policy.Identity(identity=second.identity, issuer=second.issuer)
    for artifact, bundle in ((old_artifact, old_bundle), (new_artifact, new_bundle)):
        verifier.verify_artifact(artifact.read_bytes(), Bundle.from_json(bundle.read_bytes()), ident)
        assert cosign_verify(artifact, bundle, second.identity, second.issuer, trusted_root=root_path).ok
    js = sigstore_js_verify(root_path, [
        {"bundle": str(b), "artifact": str(a), "identity": second.identity, "issuer": second.issuer}
        for a, b in ((old_artifact, old_bundle), (new_artifact, new_bundle))])
    assert [o.ok for o in js] == [True, True], js


def test_gh_attestation_verify_accepts_the_instance_s_entries_and_refuses_each_wrong_pin(
        sigstore_instance: object, tmp_path: Path) -> None:
    """gh (sigstore-go inside) verifies a Rekor v1 entry of the private instance, offline, with the
    trusted root in the JSON Lines form gh reads, as a reusable workflow signs (benchseal's builder,
    called by the infra repository); each pin gh takes refuses a wrong value. Before the instance's
    checkpoints carried a tree id ("<log> - <id>", as Rekor v1's do), sigstore-go took them for Rekor v2
    checkpoints and refused every entry while cosign and sigstore-python accepted them."""
    import hashlib

    from pipeline.local.sigstore import GitHubJob
    from pipeline.verify.gh import GhPins, gh_attestation_verify, trusted_root_lines

    artifact = tmp_path / "summary.json"
    artifact.write_bytes(b'{"score": 1.0}\n')
    statement = tmp_path / "provenance.intoto.json"
    statement.write_text(json.dumps({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "summary.json", "digest": {"sha256": hashlib.sha256(artifact.read_bytes()).hexdigest()}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {"buildDefinition": {"buildType": "https://benchseal.invalid/test", "externalParameters": {}},
                      "runDetails": {"builder": {"id": "https://benchseal.invalid/test"}}}}))
    job = GitHubJob(repository="acme/bench-infra", ref="refs/heads/main", sha="c" * 40, workflow_file="benchmark.yml",
                    workflow_repository="acme/benchseal", workflow_ref="refs/heads/main", workflow_sha="d" * 40,
                    caller_workflow_file="benchmark.yml", event_name="workflow_dispatch")
    signer = local_signer(rekor_version=1, github_job=job, state=sigstore_instance.state)  # type: ignore[attr-defined]
    try:
        bundle = signer.sign_statement(statement)
    finally:
        signer.close()
    # The instance writes gh's form beside its root; trusted_root_lines makes it from any root.
    written = sigstore_instance.trusted_root.with_suffix(".jsonl")  # type: ignore[attr-defined]
    root = trusted_root_lines(sigstore_instance.trusted_root, tmp_path / "trusted_root.jsonl")  # type: ignore[attr-defined]
    assert len(root.read_text().splitlines()) == 1
    assert json.loads(written.read_text()) == json.loads(root.read_text())
    pins = GhPins(repository="acme/bench-infra", identity=job.identity, source_ref="refs/heads/main",
                  predicate_type="https://slsa.dev/provenance/v1")
    assert job.identity == "https://github.com/acme/benchseal/.github/workflows/benchmark.yml@refs/heads/main"
    right = gh_attestation_verify(artifact, bundle, pins, trusted_root_jsonl=root)
    assert right.ok, right.output
    from dataclasses import replace
    wrong = {
        "repository": replace(pins, repository="acme/agent"),  # the source repository is not the one that ran it
        "identity": replace(pins, identity=job.identity.replace("@refs/heads/main", "@refs/heads/dev")),
        "source_ref": replace(pins, source_ref="refs/heads/evil"),
        "predicate_type": replace(pins, predicate_type="https://cyclonedx.org/bom"),
        "issuer": replace(pins, issuer="https://oidc.benchseal.invalid"),
    }
    for field, pinned in wrong.items():
        outcome = gh_attestation_verify(artifact, bundle, pinned, trusted_root_jsonl=root)
        assert not outcome.ok, (field, outcome.output)
    # Another artifact; and the published, pretty-printed root, which gh cannot read.
    other = tmp_path / "other.json"
    other.write_bytes(b'{"score": 0.0}\n')
    assert not gh_attestation_verify(other, bundle, pins, trusted_root_jsonl=root).ok
    pretty = gh_attestation_verify(artifact, bundle, pins, trusted_root_jsonl=sigstore_instance.trusted_root)  # type: ignore[attr-defined]
    assert not pretty.ok
