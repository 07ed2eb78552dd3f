"""Images are pinned to the payload's commit, for every signer kind (issue 22, point 4).

A release tag can be deleted and pushed again at another commit; the workflow that runs for it
then signs with exactly the same identity (``.../tag.yml@refs/tags/vX``). Only the certificate's
GitHub workflow SHA tells the two builds apart, so every image check (the worker, ``benchseal
verify-image``, ``benchseal verify --images``) pins it, through one expectation
(``image_identity``). Real signatures: cosign signs as the GitHub Actions job through the private
instance's token endpoint and GitHub-shaped Fulcio; the real cosign checks them.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from pipeline.attest.images import BuildInvocation, ImageSigner, SigstoreEndpoints, image_identity, provenance_predicate
from pipeline.attest.images import _cosign as run_cosign
from pipeline.cli.main import app
from pipeline.core.contracts import DispatchPayload
from pipeline.core.digests import parse_ref
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.policy import SourcePolicy, load_policy
from pipeline.infra.worker.loop import ImageRefused, require_signed_images
from pipeline.local import sigstore as sigstore_local
from pipeline.local.sigstore import GitHubJob
from pipeline.verify.external import cosign_environment, image_check_args
from tests.fixtures.sigstore import push_unique_image

pytestmark = pytest.mark.slow

SOURCE, TAG = "acme/pinned", "v3.0.0"
COMMIT = "4" * 39 + "a"
OTHER = "5" * 39 + "b"  # the same tag, deleted and pushed again at another commit
# Each signer kind the infra policy has: (policy entry, the ref the signing job ran at).
KINDS = {
    "tag": ({"workflow": "tag.yml"}, f"refs/tags/{TAG}", "push"),
    "branch": ({"workflow": "runner-release.yml", "ref": "refs/heads/main"}, "refs/heads/main", "workflow_dispatch"),
    "fixed-tag": ({"workflow": "tag.yml", "ref": "refs/tags/stable"}, "refs/tags/stable", "push"),
}
# What a hostile (or sloppy) signing run may carry in its certificate's SHA extension instead of
# the payload's commit: another commit, another case, a prefix, a longer value, padding.
HOSTILE_SHAS = {"other-commit": OTHER, "upper-case": COMMIT.upper(), "prefix": COMMIT[:12],
                "short-prefix": COMMIT[:7], "longer": COMMIT + "0", "padded": COMMIT + " ",
                "refs-prefixed": "refs/" + COMMIT}


@pytest.fixture(scope="module")
def endpoints(sigstore_instance: Any) -> SigstoreEndpoints:
    return SigstoreEndpoints.private(sigstore_instance.url, sigstore_instance.trusted_root)


def sign_as(instance: Any, endpoints: SigstoreEndpoints, work: Path, refs: dict[str, str], *, ref: str, sha: str,
            workflow: str = "tag.yml", event: str = "push", repository: str = SOURCE,
            omits: tuple[str, ...] = ()) -> dict[str, str]:
    """Sign and attest ``refs`` (role -> image) as ``workflow`` of ``repository`` at ``ref``, run at
    ``sha``; ``omits``: claims whose extensions the certificate lacks."""
    job = GitHubJob(repository=repository, ref=ref, sha=sha, workflow_file=workflow, event_name=event,
                    certificate_omits=omits)
    session = sigstore_local.open_actions_session(instance, job)
    invocation = BuildInvocation(repository=repository, ref=ref, commit=sha, workflow_ref=job.job_workflow_ref,
                                 run_url=f"https://github.com/{repository}/actions/runs/3/attempts/1")
    signer = ImageSigner(endpoints, allow_http_registry=True, actions_env=session.environ())
    for role, image in refs.items():
        sbom = work / f"sbom-{role}-{uuid.uuid4().hex[:6]}.cdx.json"
        sbom.write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1, "components": []}))
        signer.sign_and_attest(image, provenance=provenance_predicate(parse_ref(image), role, invocation), sbom=sbom)
    return refs


def _pair(label: str) -> dict[str, str]:
    return {"runner": push_unique_image("benchseal-commit-pin/runner", label),
            "api": push_unique_image("benchseal-commit-pin/api", label)}


def _source(tmp_path: Path, signer: Any) -> SourcePolicy:
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    images = {"runner": [{"registry": "127.0.0.1:5055", "repository": "benchseal-commit-pin/runner"}],
              "api": [{"registry": "127.0.0.1:5055", "repository": "benchseal-commit-pin/api"}]}
    data["sources"] = [{"repository": SOURCE, "signer": signer, "images": images}]
    path = tmp_path / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    (source,) = load_policy(path).sources
    return source


def _payload(images: dict[str, str], commit: str = COMMIT) -> DispatchPayload:
    return DispatchPayload.model_validate({
        "schema": "benchseal.dispatch/v1", "correlation_id": "commit-pin-0001",
        "source": {"repository": SOURCE, "commit": commit, "tag": TAG},
        "runner": images["runner"], "api": images["api"], "suite": "smoke", "agent": "nop"})


@pytest.fixture(scope="module")
def signed(sigstore_instance: Any, endpoints: SigstoreEndpoints,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Per signer kind: a pair signed at the payload's commit, and a pair signed at OTHER (only)."""
    work = tmp_path_factory.mktemp("commit-pin")
    out = {}
    for kind, (entry, ref, event) in KINDS.items():
        for label, sha in (("right", COMMIT), ("other", OTHER)):
            out[f"{kind}/{label}"] = sign_as(sigstore_instance, endpoints, work, _pair(f"{kind}-{label}"), ref=ref,
                                             sha=sha, workflow=entry["workflow"], event=event)
    return out


# --- the worker -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(KINDS))
def test_worker_admits_the_images_of_the_payloads_commit(kind: str, signed: dict[str, dict[str, str]],
                                                         endpoints: SigstoreEndpoints, tmp_path: Path) -> None:
    require_signed_images(_payload(signed[f"{kind}/right"]), _source(tmp_path, KINDS[kind][0]), endpoints)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_worker_refuses_the_same_identity_at_another_commit(kind: str, signed: dict[str, dict[str, str]],
                                                            endpoints: SigstoreEndpoints, tmp_path: Path) -> None:
    """The tag deleted and pushed again: same workflow, same ref, same identity, another build."""
    with pytest.raises(ImageRefused, match=rf"runner .* is not signed by .* at commit {COMMIT}"):
        require_signed_images(_payload(signed[f"{kind}/other"]), _source(tmp_path, KINDS[kind][0]), endpoints)


def test_worker_refuses_when_only_the_api_was_built_elsewhere(signed: dict[str, dict[str, str]],
                                                              endpoints: SigstoreEndpoints, tmp_path: Path) -> None:
    mixed = {"runner": signed["tag/right"]["runner"], "api": signed["tag/other"]["api"]}
    with pytest.raises(ImageRefused, match=r"\Aapi .* is not signed by"):
        require_signed_images(_payload(mixed), _source(tmp_path, KINDS["tag"][0]), endpoints)


@pytest.mark.parametrize("case", sorted(HOSTILE_SHAS))
def test_a_certificate_sha_that_is_not_exactly_the_commit_is_refused(
        case: str, sigstore_instance: Any, endpoints: SigstoreEndpoints, tmp_path: Path) -> None:
    images = sign_as(sigstore_instance, endpoints, tmp_path, _pair(f"hostile-{case}"), ref=f"refs/tags/{TAG}",
                     sha=HOSTILE_SHAS[case])
    with pytest.raises(ImageRefused, match="not verified"):
        require_signed_images(_payload(images), _source(tmp_path, KINDS["tag"][0]), endpoints)
    with pytest.raises(CheckFailed, match="not verified"):
        _verify_image_cli(images["runner"], sigstore_instance, "--commit", COMMIT)


@pytest.mark.parametrize(("claim", "flag"), [("sha", "--certificate-github-workflow-sha"),
                                           ("repository", "--certificate-github-workflow-repository"),
                                           ("ref", "--certificate-github-workflow-ref")])
def test_a_certificate_without_the_extension_is_refused(claim: str, flag: str, sigstore_instance: Any,
                                                        endpoints: SigstoreEndpoints, tmp_path: Path,
                                                        cosign_bin: Path) -> None:
    """Signed by the right workflow at the right ref and commit, but the certificate lacks the
    extension (1.3.6.1.4.1.57264.1.3 / .5 / .6 and their v2 forms): nothing pins it, refused."""
    images = sign_as(sigstore_instance, endpoints, tmp_path, _pair(f"no-{claim}"), ref=f"refs/tags/{TAG}",
                     sha=COMMIT, omits=(claim,))
    with pytest.raises(ImageRefused, match="not verified"):
        require_signed_images(_payload(images), _source(tmp_path, KINDS["tag"][0]), endpoints)
    with pytest.raises(CheckFailed, match="not verified"):
        _verify_image_cli(images["runner"], sigstore_instance, "--commit", COMMIT)
    # Without that one pin the same signature verifies: the missing extension is the refusal.
    (signature, *_) = image_check_args(images["runner"], image_identity(SOURCE, TAG, COMMIT), offline=True,
                                       trusted_root=endpoints.trusted_root)
    at = signature.index(flag)
    unpinned = signature[:at] + signature[at + 2:]
    done = subprocess.run([str(cosign_bin), *unpinned], env=cosign_environment(endpoints.environ(tmp_path)),
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_signature_of_the_commit_with_attestations_of_another_is_refused(
        sigstore_instance: Any, endpoints: SigstoreEndpoints, tmp_path: Path) -> None:
    """The signature was made at the payload's commit, but the provenance and SBOM that come with the
    image were attested by the other build: each of the three checks pins the commit."""
    images = _pair("mixed")
    job = GitHubJob(repository=SOURCE, ref=f"refs/tags/{TAG}", sha=COMMIT, workflow_file="tag.yml")
    signer = ImageSigner(endpoints, allow_http_registry=True,
                         actions_env=sigstore_local.open_actions_session(sigstore_instance, job).environ())
    env = {**endpoints.environ(tmp_path), **signer._credential_env()}
    for image in images.values():
        run_cosign(["sign", "--yes", "--oidc-provider", "github-actions", *endpoints.sign_flags(tmp_path), "--allow-http-registry",
                 image], env, f"signing {image}")
    sign_as(sigstore_instance, endpoints, tmp_path, images, ref=f"refs/tags/{TAG}", sha=OTHER)
    with pytest.raises(ImageRefused, match=r"https://slsa.dev/provenance/v1 attestation by .* at commit " + COMMIT):
        require_signed_images(_payload(images), _source(tmp_path, KINDS["tag"][0]), endpoints)


def test_signed_at_both_commits_the_payloads_is_the_one_that_counts(
        sigstore_instance: Any, endpoints: SigstoreEndpoints, tmp_path: Path) -> None:
    """An image signed by both builds is admitted for the payload whose commit is one of them only."""
    images = _pair("both")
    sign_as(sigstore_instance, endpoints, tmp_path, images, ref=f"refs/tags/{TAG}", sha=OTHER)
    source = _source(tmp_path, KINDS["tag"][0])
    with pytest.raises(ImageRefused):
        require_signed_images(_payload(images), source, endpoints)
    sign_as(sigstore_instance, endpoints, tmp_path, images, ref=f"refs/tags/{TAG}", sha=COMMIT)
    require_signed_images(_payload(images), source, endpoints)
    require_signed_images(_payload(images, OTHER), source, endpoints)
    with pytest.raises(ImageRefused):
        require_signed_images(_payload(images, "6" * 40), source, endpoints)


# --- benchseal verify-image -----------------------------------------------------------------------

def _verify_image_cli(ref: str, instance: Any, *args: str) -> Any:
    base = ["verify-image", ref, "--repo", SOURCE, "--tag", TAG, "--sigstore-url", instance.url,
            "--trusted-root", str(instance.trusted_root)]
    done = CliRunner().invoke(app, [*base, *args])
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        raise done.exception
    return done


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_verify_image_pins_the_commit_for_every_signer_kind(kind: str, signed: dict[str, dict[str, str]],
                                                            sigstore_instance: Any) -> None:
    entry = KINDS[kind][0]
    kind_args = ["--workflow", entry["workflow"], "--ref", entry.get("ref", "tag")]
    for role in ("runner", "api"):
        ok = _verify_image_cli(signed[f"{kind}/right"][role], sigstore_instance, *kind_args, "--commit", COMMIT)
        assert ok.exit_code == 0 and f"at commit {COMMIT}" in ok.output, ok.output
        with pytest.raises(CheckFailed, match="not verified"):
            _verify_image_cli(signed[f"{kind}/other"][role], sigstore_instance, *kind_args, "--commit", COMMIT)
        # The other build verifies for its own commit: the refusal is the commit pin, nothing else.
        assert _verify_image_cli(signed[f"{kind}/other"][role], sigstore_instance, *kind_args,
                                 "--commit", OTHER).exit_code == 0


def test_verify_image_refuses_a_commit_that_is_not_40_lowercase_hex(signed: dict[str, dict[str, str]],
                                                                    sigstore_instance: Any) -> None:
    for bad in (COMMIT.upper(), COMMIT[:7], "", COMMIT + "0"):
        done = CliRunner().invoke(app, ["verify-image", signed["tag/right"]["runner"], "--repo", SOURCE, "--tag", TAG,
                                        "--commit", bad, "--sigstore-url", sigstore_instance.url,
                                        "--trusted-root", str(sigstore_instance.trusted_root)])
        assert isinstance(done.exception, ValidationError) and done.exception.exit_code == 2, (bad, done.output)
        assert "commit" in str(done.exception)


def test_one_expectation_for_every_check() -> None:
    """The worker's, verify-image's, verify's and the body's identity are image_identity's."""
    import inspect

    import pipeline.cli.attest
    import pipeline.cli.verify
    import pipeline.infra.worker.loop
    import pipeline.verify.external

    for module in (pipeline.cli.attest, pipeline.cli.verify, pipeline.infra.worker.loop, pipeline.verify.external):
        source = inspect.getsource(module)
        assert "image_identity(" in source, module.__name__
        assert "ImageIdentityPolicy(" not in source.replace("class ImageIdentityPolicy", "").replace(
            "return ImageIdentityPolicy(", ""), module.__name__


def test_image_identity_is_the_full_pin() -> None:
    policy = image_identity(SOURCE, TAG, COMMIT)
    assert policy.describe() == f"https://github.com/{SOURCE}/.github/workflows/tag.yml@refs/tags/{TAG} at commit {COMMIT}"
    assert policy.flags()[-2:] == ["--certificate-github-workflow-sha", COMMIT]
