"""The worker runs only images its source's release workflow signed (cosign, exact identity):
unsigned images, images signed by another repository's workflow or for another tag are refused
as a policy failure (FAILED, unscored, published with the reason), never retried."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.contracts import DigestsFile, Grading
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.accept import accept_payload
from pipeline.infra.intake.policy import load_policy
from pipeline.infra.queue.sql import RunRecord, SqliteQueue
from pipeline.infra.worker.loop import WorkerConfig, run_once
from tests.fixtures.sigstore import push_unique_image

pytestmark = [pytest.mark.docker, pytest.mark.slow]
SOURCE, TAG = "acme/benchseal", "v9.9.9"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def _image(label: str) -> str:
    return push_unique_image("benchseal-trust-test/runner", label)


@pytest.fixture(scope="module")
def trust_setup(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile, sign_release_images: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("image-trust")
    runner, api = built_images.images["runner"], built_images.images["api"]
    trust = sign_release_images(SOURCE, TAG, [runner.ref, api.ref])
    unsigned = _image("unsigned")
    forked = _image("forked")
    sign_release_images("fork/benchseal", TAG, [forked])
    # The release tag deleted and pushed again at another commit: tag.yml at the same tag signs it
    # with the same identity; only the certificate's workflow SHA differs from the payload's commit.
    recreated = _image("recreated")
    sign_release_images(SOURCE, TAG, [recreated], commit=OTHER_COMMIT)
    allowed = {
        "runner": [{"registry": runner.name.partition("/")[0], "repository": runner.name.partition("/")[2]},
                   {"registry": "127.0.0.1:5055", "repository": "benchseal-trust-test/runner"}],
        "api": [{"registry": api.name.partition("/")[0], "repository": api.name.partition("/")[2]}],
    }
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data["sources"] = [{"repository": SOURCE, "signer": {"workflow": "tag.yml"}, "images": allowed}]
    policy_path = root / "infra.yaml"
    policy_path.write_text(yaml.safe_dump(data))
    return {"root": root, "policy": load_policy(policy_path), "trust": trust, "runner": runner.ref, "api": api.ref,
            "unsigned": unsigned, "forked": forked, "recreated": recreated}


def _run(setup: dict[str, Any], name: str, **overrides: Any) -> tuple[Any, list[Grading]]:
    payload: dict[str, Any] = {
        "schema": "benchseal.dispatch/v1", "correlation_id": f"trust-{name}-{uuid.uuid4().hex[:8]}",
        "source": {"repository": SOURCE, "commit": COMMIT, "tag": TAG},
        "runner": setup["runner"], "api": setup["api"], "suite": "smoke", "agent": "nop",
    }
    payload.update(overrides)
    db = setup["root"] / name / "queue.sqlite3"
    accept_payload(payload, db=db, policy=setup["policy"])
    finalized: list[Grading] = []

    def finalize(record: RunRecord, grading: Grading, run_dir: Path) -> list[Any]:
        finalized.append(grading)
        return []

    outcome = run_once(WorkerConfig(db=db, policy=setup["policy"], image_trust=setup["trust"]), finalize=finalize)
    with SqliteQueue(db) as queue:
        assert queue.claim("nobody", 60) is None  # terminal: nothing is requeued
    return outcome, finalized


@pytest.mark.parametrize(("case", "overrides", "why"), [
    ("unsigned", {"runner": "unsigned"}, "no signatures"),
    ("fork", {"runner": "forked"}, "signed by another repository's workflow"),
    ("tag", {"source": {"repository": SOURCE, "commit": COMMIT, "tag": "v9.9.8"}}, "signed for another tag"),
    ("recreated", {"runner": "recreated"}, "signed by the release workflow at the tag, built from another commit"),
    ("commit", {"source": {"repository": SOURCE, "commit": OTHER_COMMIT, "tag": TAG}}, "dispatched for another commit"),
])
def test_images_not_signed_by_the_release_workflow_are_refused(trust_setup: dict[str, Any], case: str,
                                                               overrides: dict[str, Any], why: str) -> None:
    resolved = {k: trust_setup[v] if k == "runner" else v for k, v in overrides.items()}
    outcome, finalized = _run(trust_setup, case, **resolved)
    assert outcome.state == "FAILED", (why, outcome)
    assert outcome.reason and outcome.reason.startswith("refused by policy:"), outcome.reason
    expected_tag = resolved.get("source", {}).get("tag", TAG)
    assert f"https://github.com/{SOURCE}/.github/workflows/tag.yml@refs/tags/{expected_tag}" in outcome.reason
    assert f"at commit {resolved.get('source', {}).get('commit', COMMIT)}" in outcome.reason
    (grading,) = finalized  # published as failed, with the reason, exactly once
    assert grading.status == "FAILED" and grading.score is None and grading.reason == outcome.reason


def test_signed_images_run(trust_setup: dict[str, Any]) -> None:
    outcome, finalized = _run(trust_setup, "signed")
    assert outcome.state == "SUCCEEDED", outcome.reason
    assert len(finalized) == 1 and finalized[0].status == "SUCCEEDED"


def test_worker_without_the_private_root_trusts_only_public_good(trust_setup: dict[str, Any]) -> None:
    """Default trust is public-good: locally signed images do not pass it (no silent local root)."""
    from pipeline.attest.images import SigstoreEndpoints

    assert WorkerConfig().image_trust == SigstoreEndpoints.public_good()
