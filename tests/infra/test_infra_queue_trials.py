"""The work split below the run, on both backends (SQLite and a real PostgreSQL): a planned run's
trials are claimed in batches by different workers under their own leases; the batch that ends the
LAST trial is handed the run (checked in the same transaction); attempts per trial are bounded;
expired trial leases requeue; the run is terminal once, with its outbox row once."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.core.contracts import DispatchPayload, GradeCounts, Grading, PublicationRequest
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.infra.queue.sql import PlannedTrial


def _payload(make_payload, i: int) -> DispatchPayload:
    return DispatchPayload.model_validate(make_payload(correlation_id=f"split-corr-{i:06d}"))


def _plan(n: int, run_id: str) -> list[PlannedTrial]:
    return [PlannedTrial(task=f"task-{i}", trial_name=f"task-{i}__{run_id[-12:]}") for i in range(n)]


def _grading(run_id: str, payload: DispatchPayload, total: int, completed: int) -> Grading:
    return Grading(
        run_id=run_id, status="SUCCEEDED", suite="smoke", agent="oracle",
        counts=GradeCounts(total=total, completed=completed, resolved=completed, unresolved=0, infra_errors=total - completed),
        score=1.0, runner_ref=payload.runner, api_ref=payload.api,
        started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:00:10Z",
    )


def _planned_run(q, make_payload, i: int, n_trials: int, max_attempts: int = 3) -> tuple[str, DispatchPayload]:
    payload = _payload(make_payload, i)
    run_id, _ = q.enqueue(payload, max_attempts=max_attempts)
    claim = q.claim("planner", 60)
    assert claim is not None and claim.run_id == run_id and claim.lease_token
    q.start(run_id, claim.lease_token)
    assert q.plan_trials(run_id, claim.lease_token, _plan(n_trials, run_id), max_attempts=max_attempts) is None
    # Planning gives up the run's lease: the run now belongs to its trials.
    assert not q.heartbeat(run_id, claim.lease_token, 60)
    with pytest.raises(CheckFailed):
        q.plan_trials(run_id, claim.lease_token, _plan(n_trials, run_id), max_attempts=max_attempts)
    return run_id, payload


def test_workers_share_one_runs_trials_and_the_last_batch_grades_it_once(make_payload, queue_spec):
    with queue_spec.open() as q:
        run_id, payload = _planned_run(q, make_payload, 1, 5)
        record = q.get_run(run_id)
        assert record.state == "RUNNING" and record.trials_planned == 5 and record.lease_token is None
        a = q.claim_trials("host-a", 60, 2)
        b = q.claim_trials("host-b", 60, 2)
        c = q.claim_trials("host-c", 60, 2)
        assert a and b and c and q.claim_trials("host-d", 60, 2) is None
        assert [t.idx for t in a.trials] == [0, 1] and [t.idx for t in b.trials] == [2, 3] and [t.idx for t in c.trials] == [4]
        assert len({a.lease_token, b.lease_token, c.lease_token}) == 3
        assert a.run.run_id == run_id and a.trials[0].task == "task-0" and a.trials[0].attempts == 1
        assert q.stats().trials_in_flight == 5 and q.stats().trials_queued == 0
        # Guards: another batch's token, a trial not in the batch, a batch without every result.
        with pytest.raises(CheckFailed):
            q.complete_trials(run_id, "stolen", {0: "{}", 1: "{}"}, lease_seconds=60)
        with pytest.raises(CheckFailed):
            q.complete_trials(run_id, a.lease_token, {0: "{}", 1: "{}", 2: "{}"}, lease_seconds=60)
        with pytest.raises(ValidationError):
            q.complete_trials(run_id, a.lease_token, {}, lease_seconds=60)
        assert q.heartbeat_trials(run_id, a.lease_token, 60) and not q.heartbeat_trials(run_id, "stolen", 60)
        assert q.complete_trials(run_id, c.lease_token, {4: '{"r": 4}'}, lease_seconds=60) is None
        # A batch records its trials as they finish: each exactly once.
        assert q.complete_trials(run_id, a.lease_token, {1: '{"r": 1}'}, lease_seconds=60) is None
        with pytest.raises(CheckFailed):
            q.complete_trials(run_id, a.lease_token, {1: "{}"}, lease_seconds=60)
        assert q.heartbeat_trials(run_id, a.lease_token, 60)  # trial 0 is still held
        assert q.complete_trials(run_id, a.lease_token, {0: '{"r": 0}'}, lease_seconds=60) is None
        with pytest.raises(CheckFailed):  # nothing of the batch is held any more
            q.complete_trials(run_id, a.lease_token, {0: "{}"}, lease_seconds=60)
        grader = q.complete_trials(run_id, b.lease_token, {2: '{"r": 2}', 3: '{"r": 3}'}, lease_seconds=60)
        assert grader is not None and grader.run_id == run_id and grader.worker == "host-b" and grader.lease_token
        rows = q.trials(run_id)
        assert [(r.idx, r.state, json.loads(r.result or "null")) for r in rows] == [(i, "DONE", {"r": i}) for i in range(5)]
        pub = PublicationRequest(run_id=run_id, target="local", tag="v1.2.3", artifacts_dir="/x")
        ids = q.complete(run_id, grader.lease_token, _grading(run_id, payload, 5, 5), [pub])
        assert len(ids) == 1 and [p.id for p in q.list_publications(run_id)] == ids
        assert q.get_run(run_id).state == "SUCCEEDED"
        with pytest.raises(CheckFailed):
            q.complete(run_id, grader.lease_token, _grading(run_id, payload, 5, 5), [pub])
        names = [e.event for e in q.events(run_id)]
        assert names.count("trials_done") == 1 and names.count("completed") == 1 and names.count("publication_queued") == 1


def _forge_run_lease(spec, run_id: str, token: str) -> None:
    """Write a lease into the run row behind the queue's back (what no queue call can do)."""
    if spec.backend == "sqlite":
        import sqlite3

        conn = sqlite3.connect(spec.target)
        with conn:
            conn.execute("UPDATE runs SET lease_token = ? WHERE run_id = ?", (token, run_id))
        conn.close()
        return
    import psycopg

    with psycopg.connect(spec.target, autocommit=True) as pg:
        pg.execute("UPDATE runs SET lease_token = %s WHERE run_id = %s", (token, run_id))


def test_a_run_with_open_trials_cannot_complete(make_payload, queue_spec):
    with queue_spec.open() as q:
        run_id, payload = _planned_run(q, make_payload, 2, 2)
        batch = q.claim_trials("w", 60, 1)
        assert batch is not None
        # Even a lease forged into the run row cannot end the run while a trial is open.
        _forge_run_lease(queue_spec, run_id, "forged")
        with pytest.raises(CheckFailed, match="trials still open"):
            q.complete(run_id, "forged", _grading(run_id, payload, 2, 2), [])
        assert q.get_run(run_id).state == "RUNNING" and q.list_publications(run_id) == []


def test_infra_failures_of_a_trial_are_bounded_and_the_last_failure_hands_over_the_run(make_payload, queue_spec):
    with queue_spec.open() as q:
        run_id, _ = _planned_run(q, make_payload, 3, 2, max_attempts=2)
        first = q.claim_trials("w1", 60, 2)
        assert first is not None
        assert q.complete_trials(run_id, first.lease_token, {0: '{"ok": 0}', 1: '{"ok": 1}'}, lease_seconds=60) is not None
        # A fresh run: trial 1 fails twice (its attempts), trial 0 completes.
        run_id, _ = _planned_run(q, make_payload, 4, 2, max_attempts=2)
        batch = q.claim_trials("w1", 60, 1)
        assert batch is not None and [t.idx for t in batch.trials] == [0]
        assert q.complete_trials(run_id, batch.lease_token, {0: '{"ok": 0}'}, lease_seconds=60) is None
        for attempt in (1, 2):
            batch = q.claim_trials("w2", 60, 1)
            assert batch is not None and batch.trials[0].idx == 1 and batch.trials[0].attempts == attempt
            handed = q.fail_trials(run_id, batch.lease_token, f"engine gone (attempt {attempt})", lease_seconds=60)
            assert (handed is None) == (attempt == 1)
        assert handed is not None and handed.worker == "w2"
        assert q.claim_trials("w3", 60, 5) is None
        rows = q.trials(run_id)
        assert rows[1].state == "DONE" and rows[1].result is None and "attempt 2" in (rows[1].reason or "")
        assert rows[1].attempts == 2


def test_release_gives_trials_back_without_using_an_attempt(make_payload, queue_spec):
    with queue_spec.open() as q:
        run_id, _ = _planned_run(q, make_payload, 5, 1)
        batch = q.claim_trials("w1", 60, 1)
        assert batch is not None
        q.release_trials(run_id, batch.lease_token, "SIGTERM")
        with pytest.raises(CheckFailed):
            q.release_trials(run_id, batch.lease_token, "again")
        again = q.claim_trials("w2", 60, 1)
        assert again is not None and again.trials[0].attempts == 1


def test_expired_trial_leases_requeue_then_end_and_queue_the_run_for_grading(make_payload, queue_spec):
    with queue_spec.open() as q:
        run_id, _ = _planned_run(q, make_payload, 6, 1, max_attempts=2)
        past = datetime.now(UTC) - timedelta(seconds=120)
        dead = q.claim_trials("dead-1", 60, 1, now=past)
        assert dead is not None
        assert q.stats().expired_leases == 1
        assert q.requeue_expired() == [run_id]
        with pytest.raises(CheckFailed):  # the dead worker's lease is gone
            q.complete_trials(run_id, dead.lease_token, {0: "{}"}, lease_seconds=60)
        dead2 = q.claim_trials("dead-2", 60, 1, now=past)
        assert dead2 is not None and dead2.trials[0].attempts == 2
        q.requeue_expired()
        # Its final attempt expired: the trial ends with no result, and as it was the last one the
        # run waits for any worker to grade it (phase finalize).
        row = q.trials(run_id)[0]
        assert row.state == "DONE" and row.result is None and "final attempt" in (row.reason or "")
        grader = q.claim("grader", 60)
        assert grader is not None and grader.run_id == run_id and grader.phase == "finalize" and grader.trials_planned == 1


def test_a_dead_grader_is_replaced_by_a_finalize_claim(make_payload, queue_spec):
    with queue_spec.open() as q:
        run_id, payload = _planned_run(q, make_payload, 7, 1)
        batch = q.claim_trials("w1", 60, 1, now=None)
        assert batch is not None
        grader = q.complete_trials(run_id, batch.lease_token, {0: "{}"}, lease_seconds=-1)  # expires at once
        assert grader is not None and grader.lease_token
        assert run_id in q.requeue_expired()
        with pytest.raises(CheckFailed):
            q.complete(run_id, grader.lease_token, _grading(run_id, payload, 1, 1), [])
        again = q.claim("w2", 60)
        assert again is not None and again.phase == "finalize" and again.trials_planned == 1 and again.lease_token
        q.complete(run_id, again.lease_token, _grading(run_id, payload, 1, 1), [])
        assert [e.event for e in q.events(run_id)].count("completed") == 1


def test_concurrent_last_batches_hand_the_run_to_exactly_one_worker(make_payload, queue_spec):
    n = 8
    with queue_spec.open() as q:
        run_id, _ = _planned_run(q, make_payload, 8, n)
        batches = [q.claim_trials(f"w{i}", 60, 1) for i in range(n)]
    assert all(batches)
    barrier = threading.Barrier(n)
    handed: list[str] = []
    lock = threading.Lock()

    def finish(i: int) -> None:
        batch = batches[i]
        assert batch is not None
        with queue_spec.open() as mine:  # one connection per "host"
            barrier.wait()
            got = mine.complete_trials(run_id, batch.lease_token, {batch.trials[0].idx: "{}"}, lease_seconds=60)
        if got is not None:
            with lock:
                handed.append(got.worker or "")

    threads = [threading.Thread(target=finish, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(handed) == 1
    with queue_spec.open() as q:
        assert [e.event for e in q.events(run_id)].count("trials_done") == 1
        assert {r.state for r in q.trials(run_id)} == {"DONE"}
