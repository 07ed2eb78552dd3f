"""Which workflow refs the infra policy's ``signer`` admits, and how the worker applies them.

``ref: tag`` (the default) is the release workflow at ``refs/tags/<the payload's tag>``. An exact
ref written out in the policy (``refs/heads/main`` for runner-release.yml dispatched on main) is
admitted too, and then only for a run at the payload's commit. A ref the policy does not name
is refused; patterns are refused when the policy is loaded. Real cosign, real signatures made as
the GitHub Actions job through the private instance's token endpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.attest.images import BuildInvocation, ImageSigner, SigstoreEndpoints, image_identity, provenance_predicate
from pipeline.core.contracts import DispatchPayload
from pipeline.core.digests import parse_ref
from pipeline.core.errors import ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.policy import InfraPolicy, SourcePolicy, load_policy
from pipeline.infra.worker.loop import ImageRefused, require_signed_images, signer_identities
from pipeline.local import sigstore as sigstore_local
from pipeline.local.sigstore import GitHubJob
from tests.fixtures.sigstore import push_unique_image

SOURCE, TAG = "acme/app", "v2.0.0"
COMMIT = "a" * 40
OTHER_COMMIT = "b" * 40
# runner-release.yml dispatched on main (workflow_dispatch), building the release at COMMIT.
BRANCH_JOB = GitHubJob(repository=SOURCE, ref="refs/heads/main", sha=COMMIT, workflow_file="runner-release.yml",
                       event_name="workflow_dispatch")


def _policy(tmp_path: Path, signer: Any) -> InfraPolicy:
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    images = {"runner": [{"registry": "127.0.0.1:5055", "repository": "benchseal-signer-refs/runner"}],
              "api": [{"registry": "127.0.0.1:5055", "repository": "benchseal-signer-refs/api"}]}
    data["sources"] = [{"repository": SOURCE, "signer": signer, "images": images}]
    path = tmp_path / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_policy(path)


def _payload(runner: str, api: str, *, commit: str = COMMIT, tag: str = TAG) -> DispatchPayload:
    return DispatchPayload.model_validate({
        "schema": "benchseal.dispatch/v1", "correlation_id": "signer-refs-0001",
        "source": {"repository": SOURCE, "commit": commit, "tag": tag},
        "runner": runner, "api": api, "suite": "smoke", "agent": "nop"})


# --- the policy file ------------------------------------------------------------------------------

def test_signer_defaults_to_the_tag_workflow_at_the_payloads_tag(tmp_path: Path) -> None:
    (source,) = _policy(tmp_path, {"workflow": "tag.yml"}).sources
    (identity,) = signer_identities(_dummy_payload(), source)
    assert identity.identity == f"https://github.com/{SOURCE}/.github/workflows/tag.yml@refs/tags/{TAG}"
    # The tag alone does not name the release (it can be deleted and pushed again): the commit too.
    assert identity.sha == COMMIT and identity.ref == f"refs/tags/{TAG}" and identity.repository == SOURCE


def _dummy_payload() -> DispatchPayload:
    digest = "sha256:" + "1" * 64
    return _payload(f"127.0.0.1:5055/benchseal-signer-refs/runner@{digest}",
                    f"127.0.0.1:5055/benchseal-signer-refs/api@{digest}")


def test_a_branch_ref_must_be_named_and_binds_the_commit(tmp_path: Path) -> None:
    (source,) = _policy(tmp_path, [{"workflow": "tag.yml"},
                                   {"workflow": "runner-release.yml", "ref": "refs/heads/main"}]).sources
    tag_id, branch_id = signer_identities(_dummy_payload(), source)
    assert tag_id.identity.endswith("/tag.yml@refs/tags/" + TAG)
    assert branch_id.identity == f"https://github.com/{SOURCE}/.github/workflows/runner-release.yml@refs/heads/main"
    assert branch_id.sha == COMMIT and "--certificate-github-workflow-sha" in branch_id.flags()


@pytest.mark.parametrize("ref", ["refs/heads/*", "refs/heads/release-*", "main", "refs/heads/", "refs/pull/1/merge",
                                 "refs/heads/../main", "refs/heads/main.lock", "refs/heads/a//b", "*", "any",
                                 "refs/tags/v1 ", ""])
def test_patterns_and_other_refs_are_refused_when_the_policy_loads(tmp_path: Path, ref: str) -> None:
    with pytest.raises(ValidationError, match=r"sources\.0\.signer"):
        _policy(tmp_path, {"workflow": "runner-release.yml", "ref": ref})


def test_an_empty_signer_list_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"sources\.0\.signer"):
        _policy(tmp_path, [])


def test_a_fixed_tag_ref_binds_the_commit_too(tmp_path: Path) -> None:
    (source,) = _policy(tmp_path, {"workflow": "tag.yml", "ref": "refs/tags/v1.0.0"}).sources
    (identity,) = signer_identities(_dummy_payload(), source)
    assert identity.identity.endswith("/tag.yml@refs/tags/v1.0.0") and identity.sha == COMMIT


def test_identity_needs_a_commit_for_every_ref() -> None:
    for ref in ("tag", "refs/heads/main", "refs/tags/v1.0.0"):
        with pytest.raises(ValidationError, match="commit"):
            image_identity(SOURCE, TAG, "", workflow="runner-release.yml", ref=ref)
    with pytest.raises(ValidationError, match="ref"):
        image_identity(SOURCE, TAG, COMMIT, workflow="runner-release.yml", ref="refs/heads/*")


# --- the worker's check, with real signatures ---------------------------------------------------

@pytest.fixture(scope="module")
def branch_signed(sigstore_instance: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """runner and api signed and attested by runner-release.yml on main at COMMIT."""
    endpoints = SigstoreEndpoints.private(sigstore_instance.url, sigstore_instance.trusted_root)
    refs = {"runner": push_unique_image("benchseal-signer-refs/runner", "branch"),
            "api": push_unique_image("benchseal-signer-refs/api", "branch")}
    session = sigstore_local.open_actions_session(sigstore_instance, BRANCH_JOB)
    invocation = BuildInvocation(repository=SOURCE, ref=BRANCH_JOB.ref, commit=COMMIT,
                                 workflow_ref=BRANCH_JOB.job_workflow_ref,
                                 run_url=f"https://github.com/{SOURCE}/actions/runs/1/attempts/1")
    signer = ImageSigner(endpoints, allow_http_registry=True, actions_env=session.environ())
    work = tmp_path_factory.mktemp("signer-refs")
    for role, ref in refs.items():
        sbom = work / f"sbom-{role}.cdx.json"
        sbom.write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1, "components": []}))
        signer.sign_and_attest(ref, provenance=provenance_predicate(parse_ref(ref), role, invocation), sbom=sbom)
    return {"endpoints": endpoints, **refs}


def _source(tmp_path: Path, signer: Any) -> SourcePolicy:
    (source,) = _policy(tmp_path, signer).sources
    return source


@pytest.mark.slow
def test_branch_signed_images_run_when_the_policy_names_that_branch(branch_signed: dict[str, Any],
                                                                    tmp_path: Path) -> None:
    source = _source(tmp_path, [{"workflow": "tag.yml"}, {"workflow": "runner-release.yml", "ref": "refs/heads/main"}])
    require_signed_images(_payload(branch_signed["runner"], branch_signed["api"]), source, branch_signed["endpoints"])


@pytest.mark.slow
@pytest.mark.parametrize(("case", "signer", "commit"), [
    ("tag ref only (the default)", {"workflow": "runner-release.yml"}, COMMIT),
    ("another branch", {"workflow": "runner-release.yml", "ref": "refs/heads/release"}, COMMIT),
    ("another workflow on main", {"workflow": "tag.yml", "ref": "refs/heads/main"}, COMMIT),
    ("main, but another commit", {"workflow": "runner-release.yml", "ref": "refs/heads/main"}, OTHER_COMMIT),
    ("a tag ref written out", {"workflow": "runner-release.yml", "ref": f"refs/tags/{TAG}"}, COMMIT),
])
def test_branch_signed_images_are_refused_otherwise(branch_signed: dict[str, Any], tmp_path: Path, case: str,
                                                    signer: dict[str, str], commit: str) -> None:
    source = _source(tmp_path, signer)
    with pytest.raises(ImageRefused, match=r"runner .* is not signed by https://github\.com/acme/app/") as caught:
        require_signed_images(_payload(branch_signed["runner"], branch_signed["api"], commit=commit), source,
                              branch_signed["endpoints"])
    assert "not verified" in str(caught.value), case
