"""The SQLite queue: guarded claims (threads and processes), leases, attempt limit, outbox."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pipeline.contracts import DispatchPayload, GradeCounts, Grading, PublicationRequest
from pipeline.errors import CheckFailed
from pipeline.infra.queue import SqliteQueue


def _payload(make_payload, i: int) -> DispatchPayload:
    return DispatchPayload.model_validate(make_payload(correlation_id=f"release-corr-{i:06d}"))


def _grading(run_id: str, payload: DispatchPayload, status: str = "SUCCEEDED") -> Grading:
    return Grading(
        run_id=run_id, status=status, suite="smoke", agent="oracle",  # type: ignore[arg-type]
        counts=GradeCounts(total=3, completed=3, resolved=3, unresolved=0, infra_errors=0),
        score=1.0 if status == "SUCCEEDED" else None, runner_ref=payload.runner, api_ref=payload.api,
        started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:00:10Z",
    )


def test_state_machine_and_audit_trail(make_payload, queue_db):
    with SqliteQueue(queue_db) as q:
        payload = _payload(make_payload, 1)
        run_id, created = q.enqueue(payload, max_attempts=3)
        assert created
        claim = q.claim("w1", lease_seconds=60)
        assert claim is not None and claim.run_id == run_id and claim.state == "CLAIMED" and claim.attempts == 1
        assert q.claim("w2", lease_seconds=60) is None  # nothing else queued
        assert claim.lease_token
        with pytest.raises(CheckFailed):
            q.start(run_id, "not-the-token")
        q.start(run_id, claim.lease_token)
        assert q.heartbeat(run_id, claim.lease_token, 60)
        assert not q.heartbeat(run_id, "stolen", 60)
        pub = PublicationRequest(run_id=run_id, target="local", tag="v1.2.3", artifacts_dir=str(q.run_dir(run_id) / "artifacts"))
        with pytest.raises(CheckFailed):
            q.complete(run_id, "stolen", _grading(run_id, payload), [pub])
        assert q.list_publications(run_id) == []  # the refused completion left nothing behind
        q.complete(run_id, claim.lease_token, _grading(run_id, payload), [pub])
        record = q.get_run(run_id)
        assert record.state == "SUCCEEDED" and record.grading is not None and record.grading.score == 1.0
        assert record.lease_token is None
        with pytest.raises(CheckFailed):  # terminal: the old lease cannot touch it again
            q.complete(run_id, claim.lease_token, _grading(run_id, payload), [])
        events = [(e.event, e.to_state) for e in q.events(run_id)]
        assert events[:4] == [("accepted", "QUEUED"), ("claimed", "CLAIMED"), ("started", "RUNNING"), ("completed", "SUCCEEDED")]
        status = json.loads((q.run_dir(run_id) / "run.json").read_text())
        assert status["state"] == "SUCCEEDED" and status["score"] == 1.0 and status["attempts"] == 1


def test_publication_outbox(make_payload, queue_db):
    with SqliteQueue(queue_db) as q:
        payload = _payload(make_payload, 2)
        run_id, _ = q.enqueue(payload, max_attempts=3)
        claim = q.claim("w1", 60)
        assert claim and claim.lease_token
        pubs = [PublicationRequest(run_id=run_id, target=t, tag="v1.2.3", artifacts_dir="/x") for t in ("local", "github")]
        q.complete(run_id, claim.lease_token, _grading(run_id, payload), pubs)
        pending = q.pending_publications()
        assert [p.request.target for p in pending] == ["local", "github"]
        assert all(p.state == "PENDING" and p.attempts == 0 for p in pending)
        first = pending[0]
        assert q.claim_publication(first.id, lease_seconds=30)
        assert not q.claim_publication(first.id, lease_seconds=30)  # leased: a second deliverer loses
        assert [p.id for p in q.pending_publications()] == [pending[1].id]
        q.record_publication_failure(first.id, "HTTP 502", retry_at=datetime.now(UTC) + timedelta(seconds=60))
        assert first.id not in [p.id for p in q.pending_publications()]
        later = q.pending_publications(now=datetime.now(UTC) + timedelta(seconds=120))
        retried = next(p for p in later if p.id == first.id)
        assert retried.last_error == "HTTP 502" and retried.attempts == 1
        assert q.claim_publication(pending[1].id, 30)
        q.mark_published(pending[1].id, {"url": "file:///x"})
        assert q.get_publication(pending[1].id).state == "DELIVERED"
        assert q.get_publication(pending[1].id).result == {"url": "file:///x"}
        assert not q.claim_publication(pending[1].id, 30)


def test_concurrent_thread_claimers_never_double_claim(make_payload, queue_db):
    n_runs, n_threads = 40, 8
    with SqliteQueue(queue_db) as q:
        for i in range(n_runs):
            q.enqueue(_payload(make_payload, 100 + i), max_attempts=3)
    claimed: list[str] = []
    lock = threading.Lock()

    def claimer(name: str) -> None:
        with SqliteQueue(queue_db) as mine:
            while (record := mine.claim(name, 60)) is not None:
                with lock:
                    claimed.append(record.run_id)

    threads = [threading.Thread(target=claimer, args=(f"t{i}",)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claimed) == n_runs
    assert len(set(claimed)) == n_runs


def _process_claimer(db: str, name: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    got = []
    with SqliteQueue(Path(db)) as q:
        while (record := q.claim(name, 60)) is not None:
            got.append(record.run_id)
    out.put(got)


def test_concurrent_process_claimers_never_double_claim(make_payload, queue_db):
    n_runs, n_procs = 60, 4
    with SqliteQueue(queue_db) as q:
        for i in range(n_runs):
            q.enqueue(_payload(make_payload, 200 + i), max_attempts=3)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_process_claimer, args=(str(queue_db), f"p{i}", out)) for i in range(n_procs)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    claimed = [r for batch in results for r in batch]
    assert len(claimed) == n_runs and len(set(claimed)) == n_runs
    with SqliteQueue(queue_db) as q:
        assert {r.state for r in q.list_runs()} == {"CLAIMED"}
        assert all(r.attempts == 1 for r in q.list_runs())


def test_lease_expiry_requeues_then_attempt_limit_ends_in_infra_error(make_payload, queue_db):
    with SqliteQueue(queue_db) as q:
        run_id, _ = q.enqueue(_payload(make_payload, 3), max_attempts=2)
        first = q.claim("dead-worker", lease_seconds=10)
        assert first and first.lease_token
        q.start(run_id, first.lease_token)
        assert q.requeue_expired() == []  # still leased
        later = datetime.now(UTC) + timedelta(seconds=11)
        assert q.requeue_expired(now=later) == [run_id]
        assert q.get_run(run_id).state == "QUEUED"
        # The dead worker's token is void after the requeue.
        assert not q.heartbeat(run_id, first.lease_token, 60)
        with pytest.raises(CheckFailed):
            q.complete(run_id, first.lease_token, _grading(run_id, first.payload), [])
        second = q.claim("w2", lease_seconds=10)
        assert second and second.attempts == 2
        assert q.requeue_expired(now=datetime.now(UTC) + timedelta(seconds=11)) == [run_id]
        record = q.get_run(run_id)
        assert record.state == "INFRA_ERROR" and "attempts exhausted" in (record.reason or "")
        assert q.claim("w3", 10) is None


def test_infra_errors_requeue_up_to_the_attempt_limit(make_payload, queue_db):
    with SqliteQueue(queue_db) as q:
        run_id, _ = q.enqueue(_payload(make_payload, 4), max_attempts=3)
        states = []
        for _ in range(3):
            claim = q.claim("w", 60)
            assert claim and claim.lease_token
            states.append(q.fail_infra(run_id, claim.lease_token, "registry unavailable"))
        assert states == ["QUEUED", "QUEUED", "INFRA_ERROR"]
        assert q.get_run(run_id).attempts == 3
        assert q.claim("w", 60) is None


def test_release_does_not_use_up_an_attempt(make_payload, queue_db):
    with SqliteQueue(queue_db) as q:
        run_id, _ = q.enqueue(_payload(make_payload, 5), max_attempts=1)
        claim = q.claim("w", 60)
        assert claim and claim.lease_token
        q.release(run_id, claim.lease_token, "SIGTERM")
        record = q.get_run(run_id)
        assert record.state == "QUEUED" and record.attempts == 0
        assert q.claim("w", 60) is not None


def test_heartbeat_failures_never_stop_the_heartbeat_thread(make_payload, queue_db):
    from pipeline.infra.worker import _Heartbeat

    q = SqliteQueue(queue_db)
    run_id, _ = q.enqueue(_payload(make_payload, 6), max_attempts=3)
    claim = q.claim("w", 60)
    assert claim and claim.lease_token
    beat = _Heartbeat(q, run_id, claim.lease_token, lease=60, every=0.02)
    beat.start()
    q.close()  # every heartbeat now raises (closed database)
    # Bounded: a heartbeat that stopped beating fails here instead of hanging the suite.
    deadline = time.monotonic() + 30
    while beat.failures < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert beat.is_alive() and beat.failures >= 3, f"{beat.failures} heartbeat failures in 30 s"
    beat.done.set()
    beat.join(timeout=5)
    assert not beat.is_alive()


def test_accept_under_sudo_refuses_db_and_policy_overrides(make_payload, tmp_path, queue_db):
    import os
    import subprocess
    import sys

    payload = tmp_path / "p.json"
    payload.write_text(json.dumps(make_payload()))
    result = subprocess.run([sys.executable, "-m", "pipeline", "infra", "accept", "--payload", str(payload), "--db", str(queue_db)],
                            capture_output=True, text=True, env={**os.environ, "SUDO_UID": "1000"}, check=False)
    assert result.returncode == 2 and "under sudo" in result.stderr
    assert not queue_db.exists()
