"""A queue with a repository's history of scored releases, made the way the worker makes it: each run
enqueued, claimed and completed with its ``ScoredRelease`` (``pipeline.core.history.compare`` against
the previous sealed, ungated release), then its sealed summary's digest recorded."""

from __future__ import annotations

import hashlib
import http.client
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pipeline.core.contracts import DispatchPayload, GradeCounts, Grading, TrialRecord
from pipeline.core.documents import GateRules, HistoryEntry, TaskCounts
from pipeline.core.history import compare
from pipeline.core.scoring import count, grading_noise, score_interval, score_of
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


# --- runs of every end, with trial records: what the drill-down pages show -----------------------

# A reason is the agent's text as much as the machinery's: it must come out as text.
SCRIPT_REASON = "verifier exited 1: <script>alert('reason')</script> & more"
CRASH_REASON = "runner container died: exit 137 <b>oom</b>"
CANARY = "canary-contradiction"


@dataclass(frozen=True)
class Trial:
    task: str
    outcome: str  # resolved, unresolved, infra_error
    reason: str | None = None
    canary: bool = False
    tokens: tuple[int, int, int] | None = None  # model calls, input, output


def _trial_record(run_id: str, index: int, trial: Trial) -> TrialRecord:
    calls, tokens_in, tokens_out = trial.tokens if trial.tokens is not None else (None, None, None)
    return TrialRecord(task=trial.task, trial_name=f"{trial.task[:40]}__{run_id[-6:]}{index}", outcome=trial.outcome,  # type: ignore[arg-type]
                       reward=1.0 if trial.outcome == "resolved" else 0.0 if trial.outcome == "unresolved" else None,
                       agent_name="hello-agent", total_seconds=4.0 + index, agent_seconds=2.5, verifier_seconds=1.0,
                       model_calls=calls, input_tokens=tokens_in, output_tokens=tokens_out, canary=trial.canary,
                       reason=trial.reason if trial.outcome != "resolved" or trial.canary else None)


def add_run(queue: Queue, tag: str, trials: list[Trial], *, status: str = "SUCCEEDED", reason: str | None = None,
            attempt: str = "1", repository: str = REPOSITORY, day: int = 10) -> str:
    """One run of ``tag`` (re-running a tag: the same commit, another correlation id) graded from ``trials``:
    SUCCEEDED with its history entry and comparison (the worker's ``compare``), or FAILED / INFRA_ERROR with
    ``reason`` and no score. Returns its run id."""
    correlation = "outcome-" + hashlib.sha256(f"{repository} {tag} {attempt}".encode()).hexdigest()[:20]
    payload = DispatchPayload.model_validate({
        "schema": "benchseal.dispatch/v1", "correlation_id": correlation,
        "source": {"repository": repository, "commit": commit_of(tag), "tag": tag},
        "runner": RUNNER, "api": API, "suite": SUITE, "agent": "hello-agent"})
    run_id, _ = queue.enqueue(payload, max_attempts=2)
    record = queue.claim("history-worker", lease_seconds=60)
    assert record is not None and record.run_id == run_id and record.lease_token
    records = tuple(_trial_record(run_id, i, t) for i, t in enumerate(trials))
    scored = count(t.outcome for t in records if not t.canary)
    score = score_of(scored) if status == "SUCCEEDED" else None
    finished = datetime(2026, 12, day, 12, 0, tzinfo=UTC)
    grading = Grading(run_id=run_id, status=status, reason=reason, suite=SUITE, agent="hello-agent", counts=scored,  # type: ignore[arg-type]
                      score=score, trials=records, runner_ref=RUNNER, api_ref=API, started_at="2026-12-10T11:00:00Z",
                      finished_at=finished.isoformat())
    release = None
    if status == "SUCCEEDED":
        assert score is not None
        interval, tasks = grading_noise(grading)
        previous = queue.previous_release(repository, SUITE, tag)
        comparison = compare(score=score, interval=interval, tasks=tasks,
                             previous=previous.as_previous() if previous is not None else None,
                             gate=GateRules(interval_below_previous=True, resolved_task_fails=True))
        release = ScoredRelease(entry=HistoryEntry(repository=repository, suite=SUITE, tag=tag, run_id=run_id,
                                                   commit=commit_of(tag), score=score, interval=interval, tasks=tasks,
                                                   gated=comparison.gated, finished_at=finished), comparison=comparison)
    queue.complete(run_id, record.lease_token, grading, [], release=release)
    if release is not None:
        queue.record_summary(run_id, "sha256:" + hashlib.sha256(run_id.encode()).hexdigest())
    return run_id


@dataclass(frozen=True)
class Outcomes:
    rerun: str  # the second run of v1.1.0
    failed: str  # FAILED: the tamper canary passed
    crashed: str  # INFRA_ERROR


def seed_outcomes(queue: Queue) -> Outcomes:
    """After ``seed``: v1.1.0 run again (the same commit), a FAILED v1.3.0 whose tamper canary passed and
    whose trials carry reasons (one of them markup), and a v1.4.0 that ended in INFRA_ERROR."""
    base = [Trial("hello", "resolved", tokens=(3, 1200, 340)), Trial("fail-me", "resolved", tokens=(5, 2100, 512)),
            Trial(HOSTILE_TASK, "resolved"), Trial(CANARY, "unresolved", "canary held: tests contradict", canary=True)]
    rerun = add_run(queue, "v1.1.0", base, attempt="2", day=11)
    failed = add_run(queue, "v1.3.0", [
        Trial("hello", "resolved", tokens=(2, 800, 100)),
        Trial("fail-me", "unresolved", SCRIPT_REASON, tokens=(4, 1500, 400)),
        Trial(HOSTILE_TASK, "unresolved", "agent raised KeyError: 'answer'"),
        Trial(CANARY, "resolved", canary=True)], status="FAILED",
        reason="tampered: the tamper canary canary-contradiction passed", day=12)
    crashed = add_run(queue, "v1.4.0", [
        Trial("hello", "infra_error", CRASH_REASON), Trial("fail-me", "infra_error", CRASH_REASON)],
        status="INFRA_ERROR", reason="infrastructure: " + CRASH_REASON, day=13)
    return Outcomes(rerun=rerun, failed=failed, crashed=crashed)
