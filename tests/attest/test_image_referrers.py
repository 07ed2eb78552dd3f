"""Issue 37.2/37.3: the images' SLSA provenance and SBOM as Sigstore bundles (v0.3) attached as OCI
referrers (pipeline.attest.images, pipeline.attest.referrers), checked with the consumer's own tools
against the real local registry: cosign's new bundle format and gh's ``--bundle-from-oci``, each refusing
a wrong identity, a wrong predicate type and a bundle about another digest; the statements are clean
in-toto Statement v1 / SLSA v1 (in-toto's own parser, tests/fixtures/slsa.py).

The local registry is Debian's distribution 2.8, which has no referrers API (``GET .../referrers/<digest>``
answers 404): every attachment goes through the referrers tag schema's fallback index (``sha256-<hex>``),
which go-containerregistry inside cosign and gh reads on that 404.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from pipeline.attest.images import (
    IMAGE_BUILD_TYPE,
    BuildInvocation,
    ImageSigner,
    SigstoreEndpoints,
    image_identity,
    image_statement,
    provenance_predicate,
)
from pipeline.attest.referrers import BUNDLE_MEDIA_TYPE, OCI_INDEX, OCI_MANIFEST, attach_bundle
from pipeline.core.digests import parse_ref
from pipeline.core.documents import TEST_RESULT
from pipeline.core.errors import CheckFailed
from pipeline.local import sigstore as sigstore_local
from pipeline.local.sigstore import GitHubJob
from pipeline.verify.external import CYCLONEDX, SLSA_PROVENANCE, cosign_environment, image_check_args
from pipeline.verify.gh import gh_verify_image, trusted_root_lines
from tests.fixtures.sigstore import push_unique_image
from tests.fixtures.slsa import strict_provenance

pytestmark = pytest.mark.slow
COMMIT = "e" * 40
JOB = GitHubJob(repository="acme/app", ref="refs/tags/v2.0.0", sha=COMMIT, workflow_file="tag.yml")
INVOCATION = BuildInvocation(repository="acme/app", ref="refs/tags/v2.0.0", commit=COMMIT,
                             workflow_ref="acme/app/.github/workflows/tag.yml@refs/tags/v2.0.0",
                             run_url="https://github.com/acme/app/actions/runs/7/attempts/1")
POLICY = image_identity("acme/app", "v2.0.0", COMMIT)
COSIGN_SIGN = "https://sigstore.dev/cosign/sign/v1"  # the predicate of cosign 3's image signature bundle
SBOM = {"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1, "components": []}


@pytest.fixture(scope="module")
def endpoints(sigstore_instance: Any) -> SigstoreEndpoints:
    return SigstoreEndpoints.private(sigstore_instance.url, sigstore_instance.trusted_root)


@pytest.fixture(scope="module")
def root_jsonl(sigstore_instance: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trusted_root_lines(sigstore_instance.trusted_root, tmp_path_factory.mktemp("gh") / "trusted_root.jsonl")


def _signer(instance: Any, endpoints: SigstoreEndpoints, job: GitHubJob = JOB) -> ImageSigner:
    session = sigstore_local.open_actions_session(instance, job)
    return ImageSigner(endpoints, allow_http_registry=True, actions_env=session.environ())


@pytest.fixture(scope="module")
def signed(sigstore_instance: Any, endpoints: SigstoreEndpoints, tmp_path_factory: pytest.TempPathFactory) -> str:
    ref = push_unique_image("benchseal-attest-test/referrers", "signed")
    sbom = tmp_path_factory.mktemp("sbom") / "sbom.cdx.json"
    sbom.write_text(json.dumps(SBOM))
    _signer(sigstore_instance, endpoints).sign_and_attest(
        ref, provenance=provenance_predicate(parse_ref(ref), "runner", INVOCATION), sbom=sbom)
    return ref


def _cosign(cosign_bin: Path, args: list[str], endpoints: SigstoreEndpoints, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cosign_bin), *args], env=cosign_environment(endpoints.environ(tmp_path)),
                          capture_output=True, text=True, check=False, timeout=120)


def _attestation_args(ref: str, predicate_type: str, endpoints: SigstoreEndpoints, policy: Any = POLICY) -> list[str]:
    """The argv benchseal runs and prints for one attestation (image_check_args), with ``predicate_type``."""
    (args,) = [a for a in image_check_args(ref, policy, offline=True, trusted_root=endpoints.trusted_root)[1:]
               if a[a.index("--type") + 1] == SLSA_PROVENANCE]
    return [predicate_type if i > 0 and args[i - 1] == "--type" else arg for i, arg in enumerate(args)]


def _statement(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    envelope = json.loads(done.stdout.splitlines()[0])
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    return json.loads(base64.b64decode(envelope["payload"]))  # type: ignore[no-any-return]


def _registry_get(ref: str, kind: str, reference: str, accept: str = OCI_INDEX) -> requests.Response:
    image = parse_ref(ref)
    return requests.get(f"http://{image.registry}/v2/{image.repository}/{kind}/{reference}", timeout=10,
                        headers={"Accept": accept})


def _referrers(ref: str) -> set[tuple[str, str]]:
    """(predicate type, referrer manifest digest) of each entry of the image's fallback index, read from the
    referrer manifest itself: go-containerregistry (inside cosign) indexes cosign's own signature bundle with
    no annotations and the config's media type as its ``artifactType``."""
    index = _registry_get(ref, "manifests", parse_ref(ref).digest.replace(":", "-")).json()
    found = set()
    for entry in index["manifests"]:
        manifest = _registry_get(ref, "manifests", entry["digest"], accept=OCI_MANIFEST).json()
        assert manifest["artifactType"] == BUNDLE_MEDIA_TYPE
        assert manifest["subject"]["digest"] == parse_ref(ref).digest
        found.add((manifest["annotations"]["dev.sigstore.bundle.predicateType"], entry["digest"]))
    return found


def test_cosign_finds_both_as_bundles_and_the_provenance_is_clean_slsa_v1(
        signed: str, endpoints: SigstoreEndpoints, cosign_bin: Path, tmp_path: Path) -> None:
    provenance = _cosign(cosign_bin, _attestation_args(signed, SLSA_PROVENANCE, endpoints), endpoints, tmp_path)
    assert provenance.returncode == 0, provenance.stderr
    statement = _statement(provenance)
    parsed = strict_provenance(statement)  # Statement v1, invocationId as the spec spells it
    assert parsed.build_definition.build_type == IMAGE_BUILD_TYPE
    assert statement["predicate"]["runDetails"]["metadata"] == {"invocationId": INVOCATION.run_url}
    assert statement["subject"] == [{"name": parse_ref(signed).name,
                                     "digest": {"sha256": parse_ref(signed).digest.removeprefix("sha256:")}}]
    sbom = _cosign(cosign_bin, _attestation_args(signed, CYCLONEDX, endpoints), endpoints, tmp_path)
    assert sbom.returncode == 0, sbom.stderr
    assert _statement(sbom)["predicate"] == SBOM


def test_they_are_referrers_in_the_fallback_index_and_no_legacy_att_exists(
        signed: str, endpoints: SigstoreEndpoints, cosign_bin: Path, tmp_path: Path) -> None:
    digest = parse_ref(signed).digest
    # This registry (distribution 2.8) has no referrers API: the tag schema's index holds them.
    assert _registry_get(signed, "referrers", digest).status_code == 404
    types = sorted(kind for kind, _ in _referrers(signed))
    assert types == sorted([CYCLONEDX, SLSA_PROVENANCE, COSIGN_SIGN])  # cosign 3 signs in the bundle format too
    tags = _registry_get(signed, "tags", "list").json()["tags"]
    assert digest.replace(":", "-") + ".att" not in tags and digest.replace(":", "-") + ".sig" not in tags
    # No silent fallback: cosign's legacy form (cosign 3: asked for explicitly) finds nothing to verify.
    legacy = [a for a in _attestation_args(signed, SLSA_PROVENANCE, endpoints)
              if a not in ("--new-bundle-format", "--trusted-root", str(endpoints.trusted_root))]
    legacy.insert(1, "--new-bundle-format=false")
    done = _cosign(cosign_bin, legacy, endpoints, tmp_path)
    assert done.returncode != 0 and "no matching attestations" in done.stderr


@pytest.mark.parametrize("predicate_type", [SLSA_PROVENANCE, CYCLONEDX])
def test_gh_verifies_each_from_the_registry(signed: str, root_jsonl: Path, predicate_type: str) -> None:
    outcome = gh_verify_image(signed, POLICY, predicate_type, trusted_root_jsonl=root_jsonl)
    assert outcome.ok, outcome.output


@pytest.mark.parametrize("wrong", ["identity", "repository", "commit", "predicate-type"])
def test_wrong_pins_are_refused_by_cosign_and_gh(signed: str, endpoints: SigstoreEndpoints, cosign_bin: Path,
                                                 root_jsonl: Path, tmp_path: Path, wrong: str) -> None:
    """The same image, root and tools that pass with the right pins (above) fail with one pin changed, for
    that pin's reason (gh names only the issuer when the certificate's identity does not match)."""
    policy, predicate_type = POLICY, SLSA_PROVENANCE
    if wrong == "identity":
        policy = image_identity("acme/app", "v2.0.0", COMMIT, workflow="other.yml")
        reasons = ("expected SAN value", "verifying with issuer")
    elif wrong == "repository":
        policy = image_identity("fork/app", "v2.0.0", COMMIT)
        reasons = ("expected SAN value", "verifying with issuer")
    elif wrong == "commit":
        policy = image_identity("acme/app", "v2.0.0", "f" * 40)
        reasons = ("expected GithubWorkflowSHA", "expected SourceRepositoryDigest")
    else:
        predicate_type = TEST_RESULT
        reasons = ("none of the attestations matched the predicate type", "no attestations found with predicate type")
    done = _cosign(cosign_bin, _attestation_args(signed, predicate_type, endpoints, policy), endpoints, tmp_path)
    assert done.returncode != 0 and reasons[0] in done.stderr, done.stderr
    outcome = gh_verify_image(signed, policy, predicate_type, trusted_root_jsonl=root_jsonl)
    assert not outcome.ok and reasons[1] in outcome.output, outcome.output


def test_cosign_tree_shows_every_referrer_from_the_fallback_index(
        sigstore_instance: Any, endpoints: SigstoreEndpoints, cosign_bin: Path, tmp_path: Path) -> None:
    """Issue 37.2: ``cosign tree`` (cosign 3: OCI referrers by default, read through the tag schema's fallback
    index on this registry's 404) lists the runner's signature, SLSA provenance, SBOM and test result, each as
    the referrer manifest the index names."""
    runner = parse_ref(push_unique_image("benchseal-attest-test/referrers", "tree"))
    sbom = tmp_path / "sbom.cdx.json"
    sbom.write_text(json.dumps(SBOM))
    signer = _signer(sigstore_instance, endpoints)
    signer.sign_and_attest(runner.ref, provenance=provenance_predicate(runner, "runner", INVOCATION), sbom=sbom)
    statement = tmp_path / "test-result.intoto.json"
    statement.write_bytes(image_statement(runner, TEST_RESULT, {"result": "PASSED", "configuration": []}))
    bundle_signer = signer._bundle_signer(signer._credential_env())
    try:
        bundle = bundle_signer.sign_statement(statement).read_bytes()
    finally:
        bundle_signer.close()
    attach_bundle(runner, bundle, TEST_RESULT)
    expected = _referrers(runner.ref)
    assert {kind for kind, _ in expected} == {COSIGN_SIGN, SLSA_PROVENANCE, CYCLONEDX, TEST_RESULT}
    done = subprocess.run([str(cosign_bin), "tree", "--allow-http-registry", runner.ref], env=cosign_environment({}),
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = set(re.findall(r"(\S+) artifacts via OCI referrer: \S+@(sha256:[0-9a-f]{64})", done.stdout))
    assert shown == expected, done.stdout


def test_a_bundle_about_another_digest_is_refused(sigstore_instance: Any, endpoints: SigstoreEndpoints,
                                                  cosign_bin: Path, root_jsonl: Path, tmp_path: Path) -> None:
    """A valid bundle by the right identity whose statement names image A, attached to image B: A
    verifies with it, B does not (cosign and gh both hold the statement's subject to the digest)."""
    a = parse_ref(push_unique_image("benchseal-attest-test/referrers", "a"))
    b = parse_ref(push_unique_image("benchseal-attest-test/referrers", "b"))
    statement = tmp_path / "a.intoto.json"
    statement.write_bytes(image_statement(a, SLSA_PROVENANCE, provenance_predicate(a, "runner", INVOCATION)))
    signer = _signer(sigstore_instance, endpoints)._bundle_signer(
        sigstore_local.open_actions_session(sigstore_instance, JOB).environ())
    try:
        bundle = signer.sign_statement(statement).read_bytes()
    finally:
        signer.close()
    attach_bundle(a, bundle, SLSA_PROVENANCE)
    attach_bundle(b, bundle, SLSA_PROVENANCE)
    assert _cosign(cosign_bin, _attestation_args(a.ref, SLSA_PROVENANCE, endpoints), endpoints, tmp_path).returncode == 0
    assert gh_verify_image(a.ref, POLICY, SLSA_PROVENANCE, trusted_root_jsonl=root_jsonl).ok
    refused = _cosign(cosign_bin, _attestation_args(b.ref, SLSA_PROVENANCE, endpoints), endpoints, tmp_path)
    assert refused.returncode != 0 and "artifact digest does not match any digest in statement" in refused.stderr
    assert not gh_verify_image(b.ref, POLICY, SLSA_PROVENANCE, trusted_root_jsonl=root_jsonl).ok


def test_the_worker_check_refuses_an_image_without_the_bundles(sigstore_instance: Any, endpoints: SigstoreEndpoints,
                                                               tmp_path: Path) -> None:
    """Signed (cosign sign) but with no attestation referrer: verify_image refuses the provenance."""
    from pipeline.attest.images import verify_image

    ref = push_unique_image("benchseal-attest-test/referrers", "sig-only")
    signer = _signer(sigstore_instance, endpoints)
    env = {**endpoints.environ(tmp_path), **signer._credential_env()}
    from pipeline.attest.images import _cosign as run_cosign

    run_cosign(["sign", "--yes", "--oidc-provider", "github-actions", *endpoints.sign_flags(tmp_path), "--allow-http-registry",
                ref], env, "signing")
    verify_image(ref, POLICY, endpoints, allow_http_registry=True, attestations=())
    with pytest.raises(CheckFailed, match=f"{SLSA_PROVENANCE} attestation by .*not verified"):
        verify_image(ref, POLICY, endpoints, allow_http_registry=True)

