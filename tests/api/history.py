"""A queue with a repository's history of scored releases, made the way the worker makes it: each run
enqueued, claimed and completed with its ``ScoredRelease`` (``pipeline.core.history.compare`` against
the previous sealed, ungated release), then its sealed summary's digest recorded."""

from __future__ import annotations

import hashlib
import http.client
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pipeline.core.contracts import DispatchPayload, GradeCounts, Grading
from pipeline.core.documents import GateRules, HistoryEntry, TaskCounts
from pipeline.core.history import compare
from pipeline.core.scoring import score_interval
from pipeline.infra.queue.records import ScoredRelease
from pipeline.infra.queue.sql import Queue

REPOSITORY = "acme/widget"
SUITE = "smoke"
RUNNER = "127.0.0.1:5055/benchseal/runner@sha256:" + "a" * 64
API = "127.0.0.1:5055/benchseal/api@sha256:" + "b" * 64
# Task names and gate reasons are the free text a page shows: these must come out as text.
HOSTILE_TASK = "<img src=x onerror=alert(1)>"
AMP_TASK = 'a&b "q" </td>'

# tag -> task -> (attempts, completed, resolved)
RELEASES: dict[str, dict[str, tuple[int, int, int]]] = {
    "v1.0.0": {"hello": (1, 1, 1), HOSTILE_TASK: (1, 1, 1), "fail-me": (1, 1, 0)},
    "v1.1.0": {"hello": (1, 1, 1), HOSTILE_TASK: (1, 1, 1), "fail-me": (1, 1, 1)},
    # The hostile task, resolved in v1.1.0, fails now: gated (and the interval lies below 1.0).
    "v1.2.0": {"hello": (1, 1, 1), HOSTILE_TASK: (1, 1, 0), "fail-me": (1, 1, 1), AMP_TASK: (1, 1, 0)},
}


@dataclass(frozen=True)
class Seeded:
    run_ids: dict[str, str]  # tag -> run id
    gated: set[str]


def commit_of(tag: str) -> str:
    return hashlib.sha1(tag.encode(), usedforsecurity=False).hexdigest()


def seed(queue: Queue, repository: str = REPOSITORY, releases: dict[str, dict[str, tuple[int, int, int]]] | None = None,
         *, api: str = API) -> Seeded:
    run_ids: dict[str, str] = {}
    gated: set[str] = set()
    for index, (tag, tasks) in enumerate((releases or RELEASES).items()):
        payload = DispatchPayload.model_validate({
            "schema": "benchseal.dispatch/v1", "correlation_id": "history-" + hashlib.sha256(f"{repository} {tag}".encode()).hexdigest()[:20],
            "source": {"repository": repository, "commit": commit_of(tag), "tag": tag},
            "runner": RUNNER, "api": api, "suite": SUITE, "agent": "oracle"})
        run_id, _ = queue.enqueue(payload, max_attempts=2)
        record = queue.claim("history-worker", lease_seconds=60)
        assert record is not None and record.run_id == run_id and record.lease_token
        counts = {task: TaskCounts(attempts=a, completed=c, resolved=r) for task, (a, c, r) in sorted(tasks.items())}
        total = sum(c.attempts for c in counts.values())
        completed = sum(c.completed for c in counts.values())
        resolved = sum(c.resolved for c in counts.values())
        grade = GradeCounts(total=total, completed=completed, resolved=resolved, unresolved=completed - resolved,
                            infra_errors=total - completed)
        score = round(resolved / completed, 6)
        finished = datetime(2026, 12, 1 + index, 12, 0, tzinfo=UTC)
        grading = Grading(run_id=run_id, status="SUCCEEDED", suite=SUITE, agent="oracle", counts=grade, score=score,
                          runner_ref=RUNNER, api_ref=api, started_at="2026-12-01T11:00:00Z",
                          finished_at=finished.isoformat())
        interval = score_interval("SUCCEEDED", grade)
        previous = queue.previous_release(repository, SUITE, tag)
        comparison = compare(score=score, interval=interval, tasks=counts,
                             previous=previous.as_previous() if previous is not None else None,
                             gate=GateRules(interval_below_previous=True, resolved_task_fails=True))
        entry = HistoryEntry(repository=repository, suite=SUITE, tag=tag, run_id=run_id, commit=commit_of(tag),
                             score=score, interval=interval, tasks=counts, gated=comparison.gated, finished_at=finished)
        queue.complete(run_id, record.lease_token, grading, [], release=ScoredRelease(entry=entry, comparison=comparison))
        queue.record_summary(run_id, "sha256:" + hashlib.sha256(tag.encode()).hexdigest())
        run_ids[tag] = run_id
        if comparison.gated:
            gated.add(tag)
    return Seeded(run_ids=run_ids, gated=gated)


def http_get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def assert_refuses_queue_writes(queue: Any, correlation_id: str) -> None:
    """A queue opened read-only refuses a write before trying it: an enqueue and a migration."""
    import pytest

    from pipeline.core.errors import InfrastructureError

    payload = DispatchPayload.model_validate({
        "schema": "benchseal.dispatch/v1", "correlation_id": correlation_id,
        "source": {"repository": REPOSITORY, "commit": "e" * 40, "tag": "v9.0.0"},
        "runner": RUNNER, "api": API, "suite": "smoke", "agent": "oracle"})
    with pytest.raises(InfrastructureError, match="opened read-only: refusing to write"):
        queue.enqueue(payload, max_attempts=1)
    with pytest.raises(InfrastructureError, match="read-only"):
        queue.migrate()
