"""Images signed by a reusable workflow (the builder) for a source repository: the expectation pins
BOTH, and each is checked against a real certificate from the private Sigstore instance.

The builder's exact job_workflow_ref is the certificate identity; the workflow repository, ref and
SHA extensions are the caller's (the source), as Fulcio certifies them for a reusable workflow.
Refused, each signed for real: the adopter's own workflow instead of the builder; the builder for
another repository, another tag or another commit; another version of the builder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.infra.intake.policy import SignerPolicy
from pipeline.verify.external import image_identity
from tests.fixtures.sigstore import push_unique_image

pytestmark = [pytest.mark.docker]

SOURCE, TAG, COMMIT = "acme/widget", "v1.2.3", "0123456789abcdef0123456789abcdef01234567"
BUILDER_SHA = "ab" * 20
BUILDER = f"benchseal/benchseal/.github/workflows/release.yml@{BUILDER_SHA}"


def _signed(sigstore_instance: Any, tmp_path: Path, *, repository: str = SOURCE, tag: str = TAG,
            commit: str = COMMIT, builder_ref: str | None = BUILDER_SHA) -> tuple[str, Any]:
    """A fresh image signed (and attested) by a job of ``repository`` at ``tag``/``commit``; through the
    builder's reusable workflow at ``builder_ref``, or (None) by the repository's own release.yml."""
    from pipeline.attest.images import BuildInvocation, ImageSigner, SigstoreEndpoints, attest_images
    from pipeline.local import sigstore as sigstore_local

    ref = push_unique_image("benchseal-builder-test/runner", f"{repository} {tag} {commit} {builder_ref}")
    job = sigstore_local.GitHubJob(repository=repository, ref=f"refs/tags/{tag}", sha=commit, workflow_file="release.yml",
                                   workflow_repository="benchseal/benchseal" if builder_ref else None,
                                   workflow_ref=builder_ref)
    endpoints = SigstoreEndpoints.private(sigstore_instance.url, sigstore_instance.trusted_root)
    session = sigstore_local.open_actions_session(sigstore_instance, job)
    invocation = BuildInvocation(repository=repository, ref=job.ref, commit=commit, workflow_ref=job.job_workflow_ref,
                                 run_url=f"https://github.com/{repository}/actions/runs/1/attempts/1")
    attest_images({"runner": ref}, ImageSigner(endpoints, allow_http_registry=True, actions_env=session.environ()),
                  invocation, tmp_path / "sboms")
    return ref, endpoints


def _verify(ref: str, endpoints: Any) -> None:
    from pipeline.attest.images import verify_image

    verify_image(ref, image_identity(SOURCE, TAG, COMMIT, builder=BUILDER), endpoints, allow_http_registry=True)


def test_the_builders_signature_for_the_source_passes(sigstore_instance: Any, tmp_path: Path) -> None:
    ref, endpoints = _signed(sigstore_instance, tmp_path)
    _verify(ref, endpoints)


@pytest.mark.parametrize(("case", "signed_as"), [
    ("the adopter's own workflow", {"builder_ref": None}),
    ("the builder for another repository", {"repository": "evil/widget"}),
    ("the builder for another tag", {"tag": "v1.2.4"}),
    ("the builder at another commit of the source", {"commit": "f" * 40}),
    ("another version of the builder", {"builder_ref": "cd" * 20}),
    ("the builder at a tag instead of the pinned commit", {"builder_ref": "refs/tags/v1"}),
])
def test_anything_else_is_refused(sigstore_instance: Any, tmp_path: Path, case: str, signed_as: dict[str, Any]) -> None:
    ref, endpoints = _signed(sigstore_instance, tmp_path, **signed_as)
    with pytest.raises(CheckFailed) as refused:
        _verify(ref, endpoints)
    # cosign ran and found the image signed (cosign 3: its bundles), by a certificate that is not the pinned one.
    assert "no matching CertificateIdentity found" in str(refused.value), str(refused.value)


@pytest.mark.parametrize("builder", [
    "benchseal/benchseal/.github/workflows/release.yml@main",
    "benchseal/benchseal/.github/workflows/release.yml@refs/heads/*",
    "benchseal/benchseal/.github/workflows/release.yml",
    "benchseal/.github/workflows/release.yml@" + "ab" * 20,
    "benchseal/benchseal/.github/workflows/release.yml@" + "AB" * 20,
    "benchseal/benchseal/.github/workflows/release.yml@refs/tags/v1..2",
    "benchseal/benchseal/.github/workflows/../release.yml@" + "ab" * 20,
])
def test_a_builder_is_one_exact_workflow_at_one_exact_ref(builder: str) -> None:
    with pytest.raises(ValidationError, match="builder"):
        image_identity(SOURCE, TAG, COMMIT, builder=builder)
    with pytest.raises(ValueError):
        SignerPolicy.model_validate({"builder": builder})


def test_the_policy_entry_pins_the_builder_and_the_source() -> None:
    signer = SignerPolicy.model_validate({"builder": BUILDER})
    expected = image_identity(SOURCE, TAG, COMMIT, ref=signer.ref, builder=signer.builder)
    assert expected.identity == f"https://github.com/{BUILDER}"
    assert (expected.repository, expected.ref, expected.sha) == (SOURCE, f"refs/tags/{TAG}", COMMIT)
    flags = expected.flags()
    assert flags[flags.index("--certificate-github-workflow-repository") + 1] == SOURCE
    with pytest.raises(ValueError, match="exclude each other"):
        SignerPolicy.model_validate({"builder": BUILDER, "workflow": "tag.yml"})


def test_the_worker_expects_the_builder_its_policy_names(make_payload: Any) -> None:
    from pipeline.core.contracts import DispatchPayload
    from pipeline.infra.intake.policy import SourcePolicy
    from pipeline.infra.worker.loop import signer_identities

    source = SourcePolicy.model_validate({
        "repository": SOURCE, "signer": [{"builder": BUILDER}, {"workflow": "tag.yml"}],
        "images": {"runner": [{"registry": "127.0.0.1:5055", "repository": "r"}],
                   "api": [{"registry": "127.0.0.1:5055", "repository": "a"}]}})
    payload = DispatchPayload.model_validate(make_payload(source={"repository": SOURCE, "commit": COMMIT, "tag": TAG}))
    builder, own = signer_identities(payload, source)
    assert builder.identity == f"https://github.com/{BUILDER}" and builder.sha == COMMIT
    assert own.identity == f"https://github.com/{SOURCE}/.github/workflows/tag.yml@refs/tags/{TAG}"
