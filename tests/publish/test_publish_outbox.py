"""The outbox: rows written with the terminal transition, delivered with retries, across restarts, once in effect."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import DispatchPayload, GradeCounts, Grading, PublicationRequest
from pipeline.core.layout import PUBLISHER_ERROR
from pipeline.dispatch.client import make_client
from pipeline.infra.queue.sql import SqliteQueue
from pipeline.publish.outbox import OutboxConfig, deliver_pending, publish_request
from pipeline.publish.targets import GitHubTarget, LocalTarget, Target
from tests.fixtures.github import tag_release_commit

RUNNER = "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64
API = "127.0.0.1:5055/benchseal/api@sha256:" + "2" * 64
REPO = "acme/widget"
FAST = OutboxConfig(max_attempts=3, base_delay=0.0, max_delay=0.0, later_delay=0.0, lease_seconds=0.3)


def _terminal_run(queue: SqliteQueue, correlation: str, make_artifacts: Any,
                  publication: dict[str, Any]) -> tuple[str, Path]:
    payload = DispatchPayload.model_validate({
        "schema": "benchseal.dispatch/v1", "correlation_id": correlation,
        "source": {"repository": REPO, "commit": "c" * 40, "tag": publication["tag"]},
        "runner": RUNNER, "api": API,
    })
    run_id, _ = queue.enqueue(payload, max_attempts=2)
    record = queue.claim("test-worker", 60)
    assert record is not None and record.lease_token
    art = make_artifacts(run_id, run_id=run_id)
    grading = Grading(run_id=run_id, status="SUCCEEDED", suite="smoke", agent="oracle",
                      counts=GradeCounts(total=3, completed=3, resolved=3, unresolved=0, infra_errors=0),
                      score=1.0, runner_ref=RUNNER, api_ref=API, started_at="2026-01-01T00:00:00Z",
                      finished_at="2026-01-01T00:01:00Z")
    request = PublicationRequest(run_id=run_id, artifacts_dir=str(art), **publication)
    queue.complete(run_id, record.lease_token, grading, [request])
    return run_id, art


def test_local_delivery_once_and_across_restart(tmp_path: Path, make_artifacts: Any) -> None:
    db = tmp_path / "queue.sqlite3"
    root = tmp_path / "dist"
    with SqliteQueue(db) as queue:
        run_id, art = _terminal_run(queue, "corr-local-0001", make_artifacts,
                                    {"target": "local", "tag": "v1.0.0", "options": {"root": str(root)}})
        assert [p.request.run_id for p in queue.pending_publications()] == [run_id]
    # A new process (restart) finds the row and delivers it.
    with SqliteQueue(db) as queue:
        report = deliver_pending(queue, config=FAST, reseal=_no_reseal)
        assert [p["run_id"] for p in report.published] == [run_id] and not report.failed
        assert queue.pending_publications() == []
        (pub,) = queue.list_publications(run_id)
        assert pub.state == "DELIVERED" and pub.result is not None and pub.result["location"] == str(root / "v1.0.0")
        assert (root / "v1.0.0" / "summary.json").read_bytes() == (art / "summary.json").read_bytes()
        assert deliver_pending(queue, config=FAST, reseal=_no_reseal).published == []


def _no_reseal(path: Path) -> None:
    raise AssertionError(f"nothing should fail here ({path})")


class _CrashAfterPublish:
    """The publisher process dies after the target did its work, before mark_published."""

    def __init__(self, inner: Target) -> None:
        self.inner = inner

    def publish(self, bundle: Any, *, manual: bool = False) -> Any:
        self.inner.publish(bundle, manual=manual)
        raise SystemExit("killed")


def test_crash_between_publication_and_mark_is_delivered_once(tmp_path: Path, make_artifacts: Any,
                                                              emulator: Any) -> None:
    emulator.add_repo(REPO)
    tag_release_commit(emulator, REPO, "v1.0.0")
    gh = make_client(base_url=emulator.base_url, token=emulator.token, backoff_factor=0.0)
    gh.get_repo(REPO).create_git_release(tag="v1.0.0", name="v1.0.0", message="Notes")
    db = tmp_path / "queue.sqlite3"

    def target(_: PublicationRequest) -> Target:
        return GitHubTarget(gh.get_repo(REPO))

    with SqliteQueue(db) as queue:
        run_id, art = _terminal_run(queue, "corr-crash-0001", make_artifacts,
                                    {"target": "github", "tag": "v1.0.0", "options": {"repository": REPO}})
        with pytest.raises(SystemExit):
            deliver_pending(queue, targets=lambda r: _CrashAfterPublish(target(r)), config=FAST, reseal=_no_reseal)
        (pub,) = queue.list_publications(run_id)
        assert pub.state == "PENDING"
    uploads = emulator.count("repos/upload-release-asset")
    patches = emulator.count("repos/update-release")
    time.sleep(FAST.lease_seconds + 0.1)  # the dead publisher's lease expires
    with SqliteQueue(db) as queue:
        report = deliver_pending(queue, targets=target, config=FAST, reseal=_no_reseal)
        assert [p["run_id"] for p in report.published] == [run_id]
        assert set(report.published[0]["assets"].values()) == {"kept"}
        (pub,) = queue.list_publications(run_id)
        assert pub.state == "DELIVERED" and pub.attempts == 2
    assert emulator.count("repos/upload-release-asset") == uploads
    assert emulator.count("repos/update-release") == patches
    release = emulator.release(REPO, "v1.0.0")
    assert sorted(a.name for a in release.assets) == sorted(p.name for p in art.iterdir())
    assert release.body.count("<!-- benchseal:start -->") == 1


def test_retry_budget_writes_signed_publisher_error_and_keeps_row(tmp_path: Path, make_artifacts: Any,
                                                                  emulator: Any, signer_v1: Any) -> None:
    from pipeline.publish.outbox import default_resealer

    emulator.add_repo(REPO)  # no release for the tag yet: every attempt fails (retryable)
    tag_release_commit(emulator, REPO, "v1.0.0")
    gh = make_client(base_url=emulator.base_url, token=emulator.token, backoff_factor=0.0)

    def target(_: PublicationRequest) -> Target:
        return GitHubTarget(gh.get_repo(REPO))

    reseal = default_resealer(signer_v1)
    with SqliteQueue(tmp_path / "queue.sqlite3") as queue:
        run_id, art = _terminal_run(queue, "corr-budget-0001", make_artifacts,
                                    {"target": "github", "tag": "v1.0.0", "options": {"repository": REPO}})
        for attempt in range(1, FAST.max_attempts + 1):
            report = deliver_pending(queue, targets=target, config=FAST, reseal=reseal)
            assert [f["attempts"] for f in report.failed] == [attempt]
            assert (art / PUBLISHER_ERROR).exists() == (attempt >= FAST.max_attempts)
        (pub,) = queue.list_publications(run_id)
        assert pub.state == "PENDING" and pub.attempts == FAST.max_attempts and "no release" in (pub.last_error or "")
        error = json.loads((art / PUBLISHER_ERROR).read_text())
        assert error["run_id"] == run_id and error["attempts"] == FAST.max_attempts
        assert "no release for tag v1.0.0" in error["error"]
        # Covered by SHA256SUMS (sha256sum -c passes) and SHA256SUMS re-signed.
        assert PUBLISHER_ERROR in (art / "SHA256SUMS").read_text()
        subprocess.run(["sha256sum", "--strict", "-c", "SHA256SUMS"], cwd=art, check=True, capture_output=True)
        bundle = json.loads((art / "SHA256SUMS.sigstore.json").read_text())
        assert "verificationMaterial" in bundle
        # The release appears later: the kept row is delivered, publisher-error.json with it.
        gh.get_repo(REPO).create_git_release(tag="v1.0.0", name="v1.0.0", message="")
        report = deliver_pending(queue, targets=target, config=FAST, reseal=reseal)
        assert [p["run_id"] for p in report.published] == [run_id]
    names = {a.name for a in emulator.release(REPO, "v1.0.0").assets}
    assert PUBLISHER_ERROR in names and "SHA256SUMS" in names


def test_wrong_run_artifacts_are_refused(tmp_path: Path, make_artifacts: Any) -> None:
    art = make_artifacts("x", run_id="run-other")
    request = PublicationRequest(run_id="run-mine", target="local", tag="v1.0.0", artifacts_dir=str(art))
    from pipeline.publish.targets import PublishError

    with pytest.raises(PublishError, match="run-other") as info:
        publish_request(request, LocalTarget(tmp_path / "dist"))
    assert not info.value.retryable and not (tmp_path / "dist").exists()


def test_backoff_grows_then_waits_long() -> None:
    config = OutboxConfig(max_attempts=5, base_delay=2, max_delay=20, later_delay=3600)
    assert [config.delay(n) for n in range(1, 6)] == [2, 4, 8, 16, 3600]
    assert config.delay(4) <= config.max_delay


def test_failure_that_cannot_heal_uses_the_budget_at_once(tmp_path: Path, make_artifacts: Any,
                                                          signer_v1: Any) -> None:
    from pipeline.publish.outbox import default_resealer

    config = OutboxConfig(max_attempts=5, later_delay=3600)
    with SqliteQueue(tmp_path / "queue.sqlite3") as queue:
        run_id, art = _terminal_run(queue, "corr-manual-0001", make_artifacts,
                                    {"target": "local", "tag": "v1.0.0", "options": {"root": str(tmp_path / "d")}})
        # The artifacts now claim another run: retrying cannot fix that.
        make_artifacts(run_id, run_id="run-someone-else")
        report = deliver_pending(queue, config=config, reseal=default_resealer(signer_v1))
        assert [f["attempts"] for f in report.failed] == [1]
        error = json.loads((art / PUBLISHER_ERROR).read_text())
        assert error["attempts"] == 1 and "run-someone-else" in error["error"]
        (pub,) = queue.list_publications(run_id)
        assert pub.state == "PENDING" and queue.pending_publications() == []  # retried an hour later
        assert (pub.next_attempt_at.timestamp() - time.time()) > 3000
    assert not (tmp_path / "d").exists()


def test_delivery_of_one_run_leaves_the_others(tmp_path: Path, make_artifacts: Any) -> None:
    root = tmp_path / "dist"
    with SqliteQueue(tmp_path / "queue.sqlite3") as queue:
        mine, _ = _terminal_run(queue, "corr-mine-00001", make_artifacts,
                                {"target": "local", "tag": "v1.0.0", "options": {"root": str(root)}})
        other, _ = _terminal_run(queue, "corr-other-0001", make_artifacts,
                                 {"target": "local", "tag": "v2.0.0", "options": {"root": str(root)}})
        report = deliver_pending(queue, config=FAST, reseal=_no_reseal, run_id=mine)
        assert [p["run_id"] for p in report.published] == [mine]
        assert [p.request.run_id for p in queue.pending_publications()] == [other]
    assert sorted(p.name for p in root.iterdir()) == ["v1.0.0"]


def test_row_for_an_unlisted_repository_is_refused_for_good(tmp_path: Path, make_artifacts: Any) -> None:
    # The outbox row and the summary name a repository the policy does not list (or no longer lists).
    sealed: list[Path] = []
    with SqliteQueue(tmp_path / "queue.sqlite3") as queue:
        run_id, art = _terminal_run(queue, "corr-unlisted-0001", make_artifacts,
                                    {"target": "local", "tag": "v1.0.0", "options": {"root": str(tmp_path / "dist")}})
        summary = json.loads((art / "summary.json").read_text())
        summary["source"]["repository"] = "evil/widget"
        (art / "summary.json").write_text(json.dumps(summary))
        make_artifacts(run_id, **summary)  # re-checksummed: only the policy can refuse it
        report = deliver_pending(queue, config=FAST, reseal=sealed.append)
        assert report.published == [] and len(report.failed) == 1
        assert "not allowed by the infra policy" in report.failed[0]["error"]
        (pub,) = queue.list_publications(run_id)
        assert pub.state == "PENDING" and pub.attempts == 1
    assert sealed == [art]  # not retryable: the budget is used at once, publisher-error.json written
    assert "not allowed" in json.loads((art / PUBLISHER_ERROR).read_text())["error"]
    assert not (tmp_path / "dist").exists()
