"""The infra policy in the run's signed evidence (issue 38.7): summary.json ``policy_digest`` (the sha256 of the
policy file the worker ran and graded under), the test-result statement's ``policy`` configuration, the release
body's line; ``benchseal verify`` shows it and, when the consumer pins it (``--infra-policy-digest``), refuses
another one, or none, in one line (exit 1); a malformed pin is a usage error (exit 2).

The fast cases build summary.json from a grading; the slow one signs a release with the local instance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.contracts import DispatchPayload, Grading
from pipeline.core.documents import ReleaseSummary, ResultStatement
from pipeline.core.errors import PolicyDigestMismatch, ValidationError
from pipeline.evidence.artifacts import build_summary
from pipeline.publish.body import facts_from_summary, render_section
from pipeline.verify.release import check_policy_pin, verify_release
from tests.fixtures.sigstore import make_inputs

REPO = Path(__file__).resolve().parents[2]
SOURCE_REPO, SOURCE_TAG = "acme/widget", "v9.9.9"
POLICY = "sha256:" + "c" * 64
IMAGES = {"runner": f"127.0.0.1:5055/acme/runner@sha256:{'a' * 64}", "api": f"127.0.0.1:5055/acme/api@sha256:{'b' * 64}"}


def _inputs(images: dict[str, str], policy: str | None = POLICY) -> tuple[Grading, DispatchPayload]:
    grading, payload = make_inputs(images)
    return grading.model_copy(update={"policy_digest": policy}), payload


def _summary(policy: str | None = POLICY) -> ReleaseSummary:
    return build_summary(*_inputs(IMAGES, policy))


def test_summary_json_records_the_graded_policy_and_the_test_result_configuration_names_it() -> None:
    summary = _summary()
    assert summary.policy_digest == POLICY and summary.to_json_dict()["policy_digest"] == POLICY
    configuration = ResultStatement.for_summary(summary, "0" * 64).predicate.configuration
    assert [(d.name, d.digest) for d in configuration][-1] == ("policy", {"sha256": "c" * 64})
    # A summary without one (sealed before it was recorded) carries neither the field nor the descriptor.
    older = _summary(None)
    assert "policy_digest" not in older.to_json_dict()
    assert [d.name for d in ResultStatement.for_summary(older, "0" * 64).predicate.configuration] == [
        "suite", "dataset", "agent"]


def test_the_release_body_names_the_policy() -> None:
    section = render_section(facts_from_summary(_summary(), SOURCE_TAG))
    assert f"| Infra policy (sha256 of policies/infra.yaml) | `{POLICY}` |" in section.splitlines()
    assert "Infra policy" not in render_section(facts_from_summary(_summary(None), SOURCE_TAG))


def test_the_pin_accepts_the_recorded_policy_and_refuses_another_or_none() -> None:
    check_policy_pin(_summary(), POLICY)
    check_policy_pin(_summary(), None)  # no pin: any
    check_policy_pin(_summary(None), None)
    for summary, recorded in ((_summary("sha256:" + "d" * 64), "sha256:" + "d" * 64),
                              (_summary(None), "no infra policy digest")):
        with pytest.raises(PolicyDigestMismatch) as refused:
            check_policy_pin(summary, POLICY)
        assert refused.value.subject == "summary.json" and refused.value.exit_code == 1
        assert str(refused.value) == (f"summary.json: policy_digest: the run was run and graded under {recorded}, "
                                      f"not the infra policy you pinned ({POLICY})")


@pytest.fixture(scope="module")
def pinned_release(tmp_path_factory: pytest.TempPathFactory, evidence_images: dict[str, str],
                   signer_v1: object) -> Path:
    """A signed release whose grading records POLICY."""
    from tests.fixtures.sigstore import write_signed_release

    return write_signed_release(tmp_path_factory, *_inputs(evidence_images), signer_v1)


def _cli(release: Path, root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", "verify", str(release), "--repo", SOURCE_REPO, "--tag",
                           SOURCE_TAG, "--trusted-root", str(root), "--offline", *extra],
                          capture_output=True, text=True, check=False, timeout=120, cwd=REPO)


@pytest.mark.slow
def test_verify_shows_the_policy_and_holds_it_to_the_consumers_pin(pinned_release: Path, root: Path) -> None:
    done = verify_release(pinned_release, repository=SOURCE_REPO, tag=SOURCE_TAG, trusted_root=root, offline=True,
                          infra_policy_digest=POLICY)
    assert done.policy_digest == POLICY and done.to_json_dict()["policy_digest"] == POLICY
    shown = _cli(pinned_release, root)
    assert shown.returncode == 0, shown.stderr
    assert f"  policy:     {POLICY} (the infra policy it ran and was graded under)" in shown.stdout.splitlines()
    pinned = _cli(pinned_release, root, "--infra-policy-digest", POLICY, "--json")
    assert pinned.returncode == 0 and json.loads(pinned.stdout)["policy_digest"] == POLICY, pinned.stderr
    other = "sha256:" + "e" * 64
    refused = _cli(pinned_release, root, "--infra-policy-digest", other)
    assert refused.returncode == 1 and refused.stdout == ""
    (line,) = refused.stderr.strip().splitlines()
    assert line.endswith(f"summary.json: policy_digest: the run was run and graded under {POLICY}, not the infra "
                         f"policy you pinned ({other})"), line
    malformed = _cli(pinned_release, root, "--infra-policy-digest", "sha256:" + "E" * 64)
    assert malformed.returncode == 2 and "--infra-policy-digest" in malformed.stderr
    with pytest.raises(ValidationError, match="--infra-policy-digest"):
        verify_release(pinned_release, repository=SOURCE_REPO, tag=SOURCE_TAG, trusted_root=root, offline=True,
                       infra_policy_digest="c" * 64)
