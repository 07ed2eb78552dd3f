"""GitHub-shaped identities from the private Sigstore instance: tokens with GitHub Actions'
claims, served the way Actions serves them, certified by the local Fulcio with the same SAN
and extensions public-good Fulcio writes; checked by sigstore-python and the real cosign."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from sigstore.models import Bundle, TrustedRoot
from sigstore.verify import Verifier, policy

from pipeline.core.contracts import GITHUB_ISSUER
from pipeline.core.errors import InfrastructureError
from pipeline.evidence.signing import default_signer
from pipeline.local import sigstore as sigstore_local
from pipeline.local.signing import local_signer
from pipeline.local.sigstore import GitHubJob

JOB = GitHubJob(repository="acme/app", ref="refs/tags/v1.2.3", sha="a" * 40, workflow_file="tag.yml")
OTHER_REPO_JOB = GitHubJob(repository="evil/app", ref="refs/tags/v1.2.3", sha="a" * 40, workflow_file="tag.yml")

# Fulcio's extension OIDs (https://github.com/sigstore/fulcio/blob/main/docs/oid-info.md).
OID = {
    "issuer_v2": "1.3.6.1.4.1.57264.1.8",
    "build_signer_uri": "1.3.6.1.4.1.57264.1.9",
    "runner_environment": "1.3.6.1.4.1.57264.1.11",
    "source_repo_uri": "1.3.6.1.4.1.57264.1.12",
    "source_repo_digest": "1.3.6.1.4.1.57264.1.13",
    "source_repo_ref": "1.3.6.1.4.1.57264.1.14",
    "build_config_uri": "1.3.6.1.4.1.57264.1.18",
    "build_trigger": "1.3.6.1.4.1.57264.1.20",
    "legacy_repository": "1.3.6.1.4.1.57264.1.5",
}


def _der_utf8(value: bytes) -> str:
    # Fulcio's v2 extensions are DER UTF8String; the legacy ones (1.1-1.6) raw bytes.
    if value[:1] != b"\x0c":
        return value.decode()
    length, start = value[1], 2
    if length & 0x80:
        count = length & 0x7F
        length, start = int.from_bytes(value[2:2 + count], "big"), 2 + count
    assert start + length == len(value)
    return value[start:].decode()


def _sign(tmp_path: Path, job: GitHubJob, state: Path) -> tuple[Path, Path]:
    artifact = tmp_path / f"{job.repository.replace('/', '-')}.txt"
    artifact.write_text("benchseal\n")
    signer = local_signer(state=state, github_job=job)
    try:
        bundle = signer.sign_file(artifact)
    finally:
        signer.close()
    return artifact, bundle


def test_local_fulcio_certifies_a_github_job_like_public_good(sigstore_instance: object, tmp_path: Path) -> None:
    state = sigstore_instance.state  # type: ignore[attr-defined]
    artifact, bundle_path = _sign(tmp_path, JOB, state)
    bundle = Bundle.from_json(bundle_path.read_bytes())
    cert = bundle.signing_certificate
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        "https://github.com/acme/app/.github/workflows/tag.yml@refs/tags/v1.2.3"]
    ext = {e.oid.dotted_string: e.value.value for e in cert.extensions if isinstance(e.value, x509.UnrecognizedExtension)}
    assert _der_utf8(ext[OID["issuer_v2"]]) == GITHUB_ISSUER
    assert _der_utf8(ext[OID["build_signer_uri"]]) == JOB.identity
    assert _der_utf8(ext[OID["source_repo_uri"]]) == "https://github.com/acme/app"
    assert _der_utf8(ext[OID["source_repo_digest"]]) == "a" * 40
    assert _der_utf8(ext[OID["source_repo_ref"]]) == "refs/tags/v1.2.3"
    assert _der_utf8(ext[OID["runner_environment"]]) == "github-hosted"
    assert _der_utf8(ext[OID["build_trigger"]]) == "push"
    assert _der_utf8(ext[OID["legacy_repository"]]) == "acme/app"

    verifier = Verifier(trusted_root=TrustedRoot.from_file(str(sigstore_instance.trusted_root)))  # type: ignore[attr-defined]
    exact = policy.AllOf([
        policy.Identity(identity=JOB.identity, issuer=GITHUB_ISSUER),
        policy.GitHubWorkflowRepository("acme/app"),
        policy.GitHubWorkflowRef("refs/tags/v1.2.3"),
        policy.GitHubWorkflowSHA("a" * 40),
        policy.GitHubWorkflowTrigger("push"),
    ])
    verifier.verify_artifact(artifact.read_bytes(), bundle, exact)
    from sigstore.errors import VerificationError as SigstoreVerificationError

    for wrong in (policy.Identity(identity=OTHER_REPO_JOB.identity, issuer=GITHUB_ISSUER),
                  policy.Identity(identity=JOB.identity, issuer=sigstore_local.LOCAL_ISSUER),
                  policy.GitHubWorkflowRepository("evil/app")):
        with pytest.raises(SigstoreVerificationError):
            verifier.verify_artifact(artifact.read_bytes(), bundle, wrong)


def test_cosign_checks_github_identity_flags(sigstore_instance: object, cosign_bin: Path, tmp_path: Path) -> None:
    state = sigstore_instance.state  # type: ignore[attr-defined]
    artifact, bundle = _sign(tmp_path, JOB, state)
    root = str(sigstore_instance.trusted_root)  # type: ignore[attr-defined]

    def cosign(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(cosign_bin), "verify-blob", "--new-bundle-format", "--offline", "--trusted-root", root,
                               "--bundle", str(bundle), *flags, str(artifact)], capture_output=True, text=True, check=False)

    good = ["--certificate-identity", JOB.identity, "--certificate-oidc-issuer", GITHUB_ISSUER]
    ok = cosign(*good, "--certificate-github-workflow-repository", "acme/app",
                "--certificate-github-workflow-ref", "refs/tags/v1.2.3", "--certificate-github-workflow-sha", "a" * 40,
                "--certificate-github-workflow-trigger", "push")
    assert ok.returncode == 0, ok.stderr
    wrongs = [
        ["--certificate-identity", OTHER_REPO_JOB.identity, "--certificate-oidc-issuer", GITHUB_ISSUER],
        ["--certificate-identity", JOB.identity, "--certificate-oidc-issuer", sigstore_local.LOCAL_ISSUER],
        [*good, "--certificate-github-workflow-repository", "evil/app"],
        [*good, "--certificate-github-workflow-ref", "refs/tags/v9.9.9"],
        [*good, "--certificate-github-workflow-sha", "b" * 40],
    ]
    for flags in wrongs:
        assert cosign(*flags).returncode != 0, flags


def test_actions_token_endpoint_serves_the_ambient_path(sigstore_instance: object, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The production code path (default_signer -> ambient credential) end to end, with the
    token served the way Actions serves it and the local instance's trust config."""
    from sigstore.models import ClientTrustConfig

    from pipeline.evidence.signing import ambient_signer

    session = sigstore_local.open_actions_session(sigstore_instance, JOB)  # type: ignore[arg-type]
    for key, value in session.environ().items():
        monkeypatch.setenv(key, value)
    config = ClientTrustConfig.from_json(sigstore_instance.signing_config.read_text())  # type: ignore[attr-defined]
    signer = ambient_signer(trust_config=config, trusted_root=sigstore_instance.trusted_root)  # type: ignore[attr-defined]
    assert (signer.identity, signer.issuer) == (JOB.identity, GITHUB_ISSUER)
    artifact = tmp_path / "summary.json"
    artifact.write_text("{}\n")
    bundle = signer.sign_file(artifact)
    signer.close()
    Verifier(trusted_root=TrustedRoot.from_file(str(sigstore_instance.trusted_root))).verify_artifact(  # type: ignore[attr-defined]
        artifact.read_bytes(), Bundle.from_json(bundle.read_bytes()),
        policy.Identity(identity=JOB.identity, issuer=GITHUB_ISSUER))


def test_actions_token_endpoint_refuses_a_wrong_request_token(sigstore_instance: object) -> None:
    session = sigstore_local.open_actions_session(sigstore_instance, JOB)  # type: ignore[arg-type]
    for token in ("", "x" * 48, session.request_token + "0"):
        request = urllib.request.Request(session.request_url + "&audience=sigstore", headers={"Authorization": f"bearer {token}"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 401
    request = urllib.request.Request(session.request_url + "&audience=other",
                                     headers={"Authorization": f"bearer {session.request_token}"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 400


def test_github_tokens_need_every_actions_claim(sigstore_instance: object) -> None:
    instance = sigstore_instance
    for missing in ("repository", "ref", "sha", "job_workflow_ref", "workflow_ref", "event_name", "runner_environment"):
        claims = {k: v for k, v in JOB.claims().items() if k != missing}
        request = urllib.request.Request(instance.token_url, data=json.dumps({"github_job": claims}).encode(),  # type: ignore[attr-defined]
                                         method="POST", headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 400, missing


def test_fulcio_refuses_a_github_token_signed_by_another_key(sigstore_instance: object) -> None:
    import jwt
    from cryptography.hazmat.primitives.asymmetric import ec

    forged = jwt.encode({"iss": GITHUB_ISSUER, "aud": "sigstore", "sub": "repo:acme/app:ref:refs/heads/main",
                         "exp": 4102444800, **JOB.claims()}, ec.generate_private_key(ec.SECP256R1()), algorithm="ES256")
    request = urllib.request.Request(sigstore_instance.url + "/api/v2/signingCert",  # type: ignore[attr-defined]
                                     data=json.dumps({"credentials": {"oidcIdentityToken": forged},
                                                      "certificateSigningRequest": ""}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 401


def test_default_signer_never_falls_back_to_the_local_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCHSEAL_HOME", str(tmp_path))
    for env in ({}, {"GITHUB_ACTIONS": "true"}, {"ACTIONS_ID_TOKEN_REQUEST_URL": "http://127.0.0.1:9/x"}):
        for key in ("GITHUB_ACTIONS", "ACTIONS_ID_TOKEN_REQUEST_URL", "ACTIONS_ID_TOKEN_REQUEST_TOKEN"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        with pytest.raises(InfrastructureError, match="--signer local"):
            default_signer()
    assert not (tmp_path / "sigstore").exists() or not any((tmp_path / "sigstore").iterdir())


def test_local_fulcio_certifies_a_reusable_workflow_like_public_good(sigstore_instance: object, tmp_path: Path) -> None:
    """A job of benchseal's reusable release.yml, called by acme/app's release.yml at a tag: the token
    carries GitHub's claims for a called workflow (job_workflow_ref/_sha the called file at the pinned
    commit, workflow_ref/_sha the caller's), and the certificate the matching extensions: the SAN and
    Build Signer URI/Digest name the builder, Build Config URI/Digest and Source Repository the caller."""
    builder_sha = "b" * 40
    job = GitHubJob(repository="acme/app", ref="refs/tags/v1.2.3", sha="a" * 40, workflow_file="release.yml",
                    workflow_repository="benchseal/benchseal", workflow_ref=builder_sha, workflow_sha=builder_sha,
                    caller_workflow_file="ship.yml")
    claims = job.claims()
    assert claims["job_workflow_ref"] == f"benchseal/benchseal/.github/workflows/release.yml@{builder_sha}"
    assert claims["job_workflow_sha"] == builder_sha
    assert (claims["workflow_ref"], claims["workflow_sha"]) == ("acme/app/.github/workflows/ship.yml@refs/tags/v1.2.3",
                                                                "a" * 40)
    state = sigstore_instance.state  # type: ignore[attr-defined]
    _, bundle_path = _sign(tmp_path, job, state)
    cert = Bundle.from_json(bundle_path.read_bytes()).signing_certificate
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    builder = f"https://github.com/benchseal/benchseal/.github/workflows/release.yml@{builder_sha}"
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [builder]
    ext = {e.oid.dotted_string: e.value.value for e in cert.extensions if isinstance(e.value, x509.UnrecognizedExtension)}
    assert _der_utf8(ext[OID["build_signer_uri"]]) == builder
    assert _der_utf8(ext["1.3.6.1.4.1.57264.1.10"]) == builder_sha  # Build Signer Digest
    assert _der_utf8(ext[OID["build_config_uri"]]) == "https://github.com/acme/app/.github/workflows/ship.yml@refs/tags/v1.2.3"
    assert _der_utf8(ext["1.3.6.1.4.1.57264.1.19"]) == "a" * 40  # Build Config Digest
    assert _der_utf8(ext[OID["source_repo_uri"]]) == "https://github.com/acme/app"
    assert _der_utf8(ext[OID["source_repo_digest"]]) == "a" * 40
    assert _der_utf8(ext[OID["source_repo_ref"]]) == "refs/tags/v1.2.3"
    assert _der_utf8(ext[OID["legacy_repository"]]) == "acme/app"
