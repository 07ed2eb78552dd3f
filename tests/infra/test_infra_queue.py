"""The queue contract, on both backends (SQLite and a real PostgreSQL): guarded claims (threads and
processes), leases, attempt limit, the finalize phase, redelivery, migrations, the outbox."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.core.contracts import DispatchPayload, GradeCounts, Grading, PublicationRequest
from pipeline.core.errors import CheckFailed
from pipeline.infra.queue.sql import SCHEMA_VERSION, SqliteQueue
from tests.fixtures.infra import QueueSpec


def _payload(make_payload, i: int) -> DispatchPayload:
    return DispatchPayload.model_validate(make_payload(correlation_id=f"release-corr-{i:06d}"))


def _grading(run_id: str, payload: DispatchPayload, status: str = "SUCCEEDED") -> Grading:
    return Grading(
        run_id=run_id, status=status, suite="smoke", agent="oracle",  # type: ignore[arg-type]
        counts=GradeCounts(total=3, completed=3, resolved=3, unresolved=0, infra_errors=0),
        score=1.0 if status == "SUCCEEDED" else None, runner_ref=payload.runner, api_ref=payload.api,
        started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:00:10Z",
    )


def test_state_machine_and_audit_trail(make_payload, queue_spec):
    with queue_spec.open() as q:
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


def test_publication_outbox(make_payload, queue_spec):
    with queue_spec.open() as q:
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


def test_concurrent_thread_claimers_never_double_claim(make_payload, queue_spec):
    n_runs, n_threads = 40, 8
    with queue_spec.open() as q:
        for i in range(n_runs):
            q.enqueue(_payload(make_payload, 100 + i), max_attempts=3)
    claimed: list[str] = []
    lock = threading.Lock()

    def claimer(name: str) -> None:
        with queue_spec.open() as mine:
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


def _process_claimer(spec: QueueSpec, name: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    got = []
    with spec.open() as q:
        while (record := q.claim(name, 60)) is not None:
            got.append(record.run_id)
    out.put(got)


def test_concurrent_process_claimers_never_double_claim(make_payload, queue_spec):
    n_runs, n_procs = 60, 4
    with queue_spec.open() as q:
        for i in range(n_runs):
            q.enqueue(_payload(make_payload, 200 + i), max_attempts=3)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_process_claimer, args=(queue_spec, f"p{i}", out)) for i in range(n_procs)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    claimed = [r for batch in results for r in batch]
    assert len(claimed) == n_runs and len(set(claimed)) == n_runs
    with queue_spec.open() as q:
        assert {r.state for r in q.list_runs()} == {"CLAIMED"}
        assert all(r.attempts == 1 for r in q.list_runs())


def test_lease_expiry_requeues_then_final_attempt_goes_to_finalize_never_straight_to_terminal(make_payload, queue_spec):
    with queue_spec.open() as q:
        run_id, _ = q.enqueue(_payload(make_payload, 3), max_attempts=2)
        first = q.claim("dead-worker", lease_seconds=10)
        assert first and first.lease_token
        q.start(run_id, first.lease_token)
        assert q.requeue_expired() == []  # still leased
        later = datetime.now(UTC) + timedelta(seconds=11)
        assert q.requeue_expired(now=later) == [run_id]
        assert q.get_run(run_id).state == "QUEUED" and q.get_run(run_id).phase == "run"
        # The dead worker's token is void after the requeue.
        assert not q.heartbeat(run_id, first.lease_token, 60)
        with pytest.raises(CheckFailed):
            q.complete(run_id, first.lease_token, _grading(run_id, first.payload), [])
        second = q.claim("w2", lease_seconds=10)
        assert second and second.attempts == 2 and second.phase == "run"
        q.start(run_id, second.lease_token)
        # The worker dies on the final attempt: the run is NOT ended here, without grading or outbox row ...
        assert q.requeue_expired(now=datetime.now(UTC) + timedelta(seconds=11)) == [run_id]
        record = q.get_run(run_id)
        assert record.state == "QUEUED" and record.phase == "finalize" and "final attempt" in (record.reason or "")
        assert record.grading is None and q.list_publications(run_id) == []
        # ... but finalized by the next claim, which uses no attempt of its own.
        third = q.claim("w3", 10)
        assert third and third.phase == "finalize" and third.attempts == 2 and third.finalize_attempts == 1
        assert q.claim("w4", 10) is None
        # The dead worker's token still cannot finish it.
        with pytest.raises(CheckFailed):
            q.complete(run_id, second.lease_token, _grading(run_id, first.payload, "INFRA_ERROR"), [])
        q.start(run_id, third.lease_token)
        pub = PublicationRequest(run_id=run_id, target="local", tag="v1.2.3", artifacts_dir="/x")
        q.complete(run_id, third.lease_token, _grading(run_id, first.payload, "INFRA_ERROR"), [pub])
        with pytest.raises(CheckFailed):  # exactly once
            q.complete(run_id, third.lease_token, _grading(run_id, first.payload, "INFRA_ERROR"), [pub])
        record = q.get_run(run_id)
        assert record.state == "INFRA_ERROR" and record.grading is not None and record.grading.score is None
        assert [p.request.target for p in q.list_publications(run_id)] == ["local"]
        assert [e.event for e in q.events(run_id)].count("completed") == 1


def test_infra_errors_requeue_up_to_the_attempt_limit_then_finalize(make_payload, queue_spec):
    with queue_spec.open() as q:
        run_id, _ = q.enqueue(_payload(make_payload, 4), max_attempts=3)
        states = []
        for _ in range(3):
            claim = q.claim("w", 60)
            assert claim and claim.lease_token and claim.phase == "run"
            states.append(q.fail_infra(run_id, claim.lease_token, "registry unavailable"))
        assert states == ["QUEUED", "QUEUED", "QUEUED"]
        record = q.get_run(run_id)
        assert record.attempts == 3 and record.phase == "finalize" and not record.terminal
        final = q.claim("w", 60)
        assert final is not None and final.phase == "finalize" and final.attempts == 3
        events = [e.event for e in q.events(run_id)]
        assert events.count("requeued") == 2 and events.count("finalize_pending") == 1


def test_release_during_finalize_keeps_the_phase_and_uses_no_attempt(make_payload, queue_spec):
    with queue_spec.open() as q:
        run_id, _ = q.enqueue(_payload(make_payload, 7), max_attempts=1)
        claim = q.claim("w", 60)
        assert claim and claim.lease_token
        q.begin_finalize(run_id, claim.lease_token, "attempts exhausted")
        assert q.get_run(run_id).state == "RUNNING" and q.get_run(run_id).phase == "finalize"
        q.release(run_id, claim.lease_token, "SIGTERM")
        again = q.get_run(run_id)
        assert again.state == "QUEUED" and again.phase == "finalize" and again.attempts == 1 and again.finalize_attempts == 0


def test_release_does_not_use_up_an_attempt(make_payload, queue_spec):
    with queue_spec.open() as q:
        run_id, _ = q.enqueue(_payload(make_payload, 5), max_attempts=1)
        claim = q.claim("w", 60)
        assert claim and claim.lease_token
        q.release(run_id, claim.lease_token, "SIGTERM")
        record = q.get_run(run_id)
        assert record.state == "QUEUED" and record.attempts == 0
        assert q.claim("w", 60) is not None


def test_heartbeat_failures_never_stop_the_heartbeat_thread(make_payload, queue_spec):
    from pipeline.infra.worker.loop import _Heartbeat

    q = queue_spec.open()
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


def test_redelivery_is_idempotent_and_a_changed_payload_is_refused_and_recorded_as_refused(make_payload, queue_spec):
    from pipeline.core.errors import ValidationError

    with queue_spec.open() as q:
        payload = _payload(make_payload, 8)
        run_id, created = q.enqueue(payload, max_attempts=3)
        assert created
        assert q.enqueue(payload, max_attempts=3) == (run_id, False)
        changed = DispatchPayload.model_validate({**payload.to_json_dict(), "agent": "nop"})
        with pytest.raises(ValidationError) as caught:
            q.enqueue(changed, max_attempts=3)
        assert caught.value.field == "payload.correlation_id" and run_id in caught.value.rule
        # Hostile variant: only the source tag differs.
        other = DispatchPayload.model_validate({**payload.to_json_dict(), "source": {**payload.to_json_dict()["source"], "tag": "v9.9.9"}})
        with pytest.raises(ValidationError):
            q.enqueue(other, max_attempts=3)
        events = [e.event for e in q.events(run_id)]
        assert events == ["accepted", "redelivered", "redelivery_refused", "redelivery_refused"]
        assert [r.run_id for r in q.list_runs()] == [run_id]
        assert q.get_run(run_id).payload == payload  # the stored payload is the first one, untouched


def test_concurrent_enqueue_of_one_correlation_id_creates_one_run(make_payload, queue_spec):
    payload = _payload(make_payload, 9)
    results: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def enqueuer() -> None:
        with queue_spec.open() as mine:
            result = mine.enqueue(payload, max_attempts=3)
        with lock:
            results.append(result)

    threads = [threading.Thread(target=enqueuer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6 and len({r[0] for r in results}) == 1
    assert sum(created for _, created in results) == 1
    with queue_spec.open() as q:
        assert len(q.list_runs()) == 1


def test_stats_show_depth_claims_in_flight_and_worker_heartbeats(make_payload, queue_spec):
    with queue_spec.open() as q:
        for i in range(3):
            q.enqueue(_payload(make_payload, 300 + i), max_attempts=3)
        claim = q.claim("host-a-1", 60)
        assert claim and claim.lease_token
        assert q.claim("host-b-2", 60) is not None
        assert q.heartbeat(claim.run_id, claim.lease_token, 60)
        q.claim("host-c-3", 60, now=datetime.now(UTC) - timedelta(seconds=120))
        stats = q.stats()
        assert stats.backend == queue_spec.backend and stats.schema_version == SCHEMA_VERSION == 7
        assert stats.depth == 0 and stats.in_flight == 3 and stats.by_state == {"CLAIMED": 3}
        assert stats.expired_leases == 1  # host-c-3 claimed two minutes ago with a 60 s lease
        beats = {w.worker: w for w in stats.workers}
        assert set(beats) == {"host-a-1", "host-b-2", "host-c-3"}
        assert beats["host-a-1"].run_id == claim.run_id
        assert (datetime.now(UTC) - beats["host-c-3"].last_seen).total_seconds() > 100
        # An idle poll is a heartbeat too, with no run.
        assert q.claim("host-d-4", 60) is None
        assert next(w for w in q.stats().workers if w.worker == "host-d-4").run_id is None


def test_a_worker_that_claims_nothing_says_why_beside_its_heartbeat_until_its_next_claim(queue_spec: QueueSpec) -> None:
    why = "policy /etc/benchseal/infra.yaml changed and is refused, ...: invalid lease_secs: extra field"
    with queue_spec.open() as q:
        assert q.claim("host-a-1", 60) is None
        before = next(w for w in q.stats().workers if w.worker == "host-a-1")
        assert before.problem is None
        q.worker_problem("host-a-1", why)
        q.worker_problem("host-new-2", "x" * 5000)  # a worker whose first poll is refused has a row too
        beats = {w.worker: w for w in q.stats().workers}
        assert beats["host-a-1"].problem == why and beats["host-a-1"].last_seen >= before.last_seen
        assert beats["host-a-1"].run_id is None and beats["host-new-2"].problem == "x" * 2000  # one line, bounded
        assert q.claim("host-a-1", 60) is None  # its next claim attempt: the policy loads again
        beats = {w.worker: w for w in q.stats().workers}
        assert beats["host-a-1"].problem is None and beats["host-new-2"].problem is not None


def test_infra_status_and_migrate_cli(make_payload, queue_spec, tmp_path):
    import os
    import subprocess
    import sys

    with queue_spec.open() as q:
        run_id, _ = q.enqueue(_payload(make_payload, 10), max_attempts=3)
        q.claim("cli-worker", 60)
    env = dict(os.environ)
    args: list[str] = []
    if queue_spec.backend == "sqlite":
        args = ["--db", queue_spec.target]
    else:
        url_file = tmp_path / "queue-url"
        url_file.write_text(queue_spec.target + "\n")
        args = ["--queue-url-file", str(url_file)]
    out = subprocess.run([sys.executable, "-m", "pipeline", "infra", "status", *args], capture_output=True, text=True,
                         env=env, check=False)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    queue = lines[0]["queue"]
    assert queue["in_flight"] == 1 and queue["depth"] == 0 and queue["backend"] == queue_spec.backend
    assert [w["worker"] for w in queue["workers"]] == ["cli-worker"] and queue["workers"][0]["run_id"] == run_id
    assert lines[1]["run_id"] == run_id and lines[1]["state"] == "CLAIMED"
    migrated = subprocess.run([sys.executable, "-m", "pipeline", "infra", "migrate", *args], capture_output=True, text=True,
                              env=env, check=False)
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout)["from"] == SCHEMA_VERSION and json.loads(migrated.stdout)["to"] == SCHEMA_VERSION


_V1_SCHEMA = """
CREATE TABLE runs (run_id TEXT PRIMARY KEY, correlation_id TEXT NOT NULL UNIQUE, payload TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('QUEUED','CLAIMED','RUNNING','SUCCEEDED','FAILED','INFRA_ERROR')),
    attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL, lease_token TEXT, lease_expires_at REAL,
    worker TEXT, reason TEXT, grading TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE INDEX runs_state ON runs (state, created_at);
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, at TEXT NOT NULL, event TEXT NOT NULL,
    from_state TEXT, to_state TEXT, detail TEXT);
CREATE TABLE publications (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES runs (run_id),
    target TEXT NOT NULL, tag TEXT NOT NULL, request TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL, lease_expires_at REAL, last_error TEXT, result TEXT, created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL, UNIQUE (run_id, target, tag));
"""


def test_sqlite_database_behind_is_refused_until_migrate(make_payload, queue_db):
    import sqlite3
    import subprocess
    import sys

    queue_db.parent.mkdir(parents=True)
    payload = _payload(make_payload, 11)
    with sqlite3.connect(queue_db) as conn:  # a queue written before schema versions existed
        conn.executescript(_V1_SCHEMA)
        conn.execute("INSERT INTO runs (run_id, correlation_id, payload, state, attempts, max_attempts, created_at, updated_at)"
                     " VALUES ('run-old', ?, ?, 'QUEUED', 0, 3, '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')",
                     (payload.correlation_id, json.dumps(payload.to_json_dict(), sort_keys=True)))
    conn.close()
    before = queue_db.read_bytes()
    with pytest.raises(CheckFailed, match=rf"schema version 1, this benchseal needs {SCHEMA_VERSION}: run `benchseal infra migrate`"):
        SqliteQueue(queue_db)
    assert queue_db.read_bytes() == before  # refused without touching it
    cli = subprocess.run([sys.executable, "-m", "pipeline", "infra", "status", "--db", str(queue_db)],
                         capture_output=True, text=True, check=False)
    assert cli.returncode == 1 and "benchseal infra migrate" in cli.stderr and len(cli.stderr.strip().splitlines()) == 1
    migrated = subprocess.run([sys.executable, "-m", "pipeline", "infra", "migrate", "--db", str(queue_db)],
                              capture_output=True, text=True, check=False)
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout)["from"] == 1 and json.loads(migrated.stdout)["to"] == SCHEMA_VERSION
    with SqliteQueue(queue_db) as q:
        record = q.get_run("run-old")
        assert record.phase == "run" and record.payload == payload
        claim = q.claim("w", 60)
        assert claim is not None and claim.run_id == "run-old"


def test_sqlite_database_ahead_is_refused(queue_db):
    import sqlite3

    SqliteQueue(queue_db).close()
    with sqlite3.connect(queue_db) as conn:
        conn.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (99, 'later')")
    conn.close()
    with pytest.raises(CheckFailed, match="schema version 99, newer than this benchseal"):
        SqliteQueue(queue_db)


def test_postgresql_database_is_never_migrated_implicitly(pg_cluster):
    import psycopg

    from pipeline.infra.queue.postgres import PostgresQueue

    with psycopg.connect(pg_cluster.url("postgres"), autocommit=True) as conn:
        conn.execute('CREATE DATABASE "unmigrated"')
    url = pg_cluster.url("unmigrated")
    with pytest.raises(CheckFailed, match=rf"schema version 0, this benchseal needs {SCHEMA_VERSION}: run `benchseal infra migrate`"):
        PostgresQueue(url)
    with PostgresQueue(url, check_schema=False) as q:
        assert q.migrate() == (0, SCHEMA_VERSION)
        assert q.migrate() == (SCHEMA_VERSION, SCHEMA_VERSION)  # idempotent
    with PostgresQueue(url) as q:
        assert q.schema_version() == SCHEMA_VERSION


def test_queue_url_comes_from_env_or_file_never_argv_and_never_with_db(tmp_path, monkeypatch, pg_cluster):
    from pipeline.core.errors import UsageError, ValidationError
    from pipeline.infra.queue.sql import open_queue, redact_url

    url = pg_cluster.new_database()
    monkeypatch.delenv("BENCHSEAL_QUEUE_URL", raising=False)
    monkeypatch.delenv("BENCHSEAL_QUEUE_URL_FILE", raising=False)
    assert open_queue(tmp_path / "q.sqlite3").backend == "sqlite"  # the default
    monkeypatch.setenv("BENCHSEAL_QUEUE_URL", url)
    with open_queue() as q:
        assert q.backend == "postgresql"
    with pytest.raises(UsageError, match="give exactly one"):
        open_queue(tmp_path / "q.sqlite3")  # never a silent choice between two queues
    url_file = tmp_path / "url"
    url_file.write_text(url)
    with pytest.raises(UsageError, match="given twice"):
        open_queue(url_file=url_file)
    monkeypatch.setenv("BENCHSEAL_QUEUE_URL", "mysql://user:hunter2@db/x")
    with pytest.raises(ValidationError) as caught:
        open_queue()
    assert "hunter2" not in caught.value.diagnostics() and "postgresql://" in caught.value.rule
    assert redact_url("postgresql://u:s3cret@db.example:5432/q?sslmode=require&password=x") == "postgresql://u@db.example:5432/q"
    # An unreachable server: one line naming the (redacted) location, never the password.
    monkeypatch.setenv("BENCHSEAL_QUEUE_URL", f"postgresql://benchseal:s3cret@/nosuchdb?host={pg_cluster.sock}")
    from pipeline.core.errors import InfrastructureError
    from pipeline.infra.queue.postgres import PostgresQueue

    with pytest.raises(InfrastructureError) as down:
        PostgresQueue(os.environ["BENCHSEAL_QUEUE_URL"], reconnect_seconds=0.5)
    assert "s3cret" not in down.value.diagnostics() and "nosuchdb" in down.value.diagnostics()


def test_cli_accept_and_worker_on_postgresql_by_url_file_and_env(make_payload, tmp_path, pg_cluster):
    import subprocess
    import sys

    from pipeline.infra.queue.postgres import PostgresQueue

    url = pg_cluster.new_database()
    url_file = tmp_path / "queue-url"
    # With trust auth the server never asks for the password: it is there to prove it is never printed.
    url_file.write_text(f"# the infra queue\n{url.replace('benchseal@', 'benchseal:hunter2secret@')}\n")
    payload = tmp_path / "p.json"
    payload.write_text(json.dumps(make_payload(correlation_id="pg-cli-0000001")))
    base = {k: v for k, v in os.environ.items() if not k.startswith("BENCHSEAL_QUEUE_URL")}
    accepted = subprocess.run([sys.executable, "-m", "pipeline", "infra", "accept", "--payload", str(payload), "--json"],
                              capture_output=True, text=True, env={**base, "BENCHSEAL_QUEUE_URL_FILE": str(url_file)}, check=False)
    assert accepted.returncode == 0, accepted.stderr
    run_id = json.loads(accepted.stdout)["run_id"]
    with PostgresQueue(url, runs_dir=tmp_path / "runs") as q:
        assert [r.run_id for r in q.list_runs()] == [run_id]
        q.claim("someone-else", 60)  # so the worker below finds nothing to do (no Docker needed)
    worker = subprocess.run([sys.executable, "-m", "pipeline", "worker", "--once", "--queue-url-file", str(url_file)],
                            capture_output=True, text=True, env=base, check=False)
    assert worker.returncode == 0, worker.stderr
    assert json.loads(worker.stdout.splitlines()[-1]) == {"run_id": None, "state": None}
    # A URL and --db together: refused, nothing chosen silently.
    both = subprocess.run([sys.executable, "-m", "pipeline", "worker", "--once", "--queue-url-file", str(url_file),
                           "--db", str(tmp_path / "q.sqlite3")], capture_output=True, text=True, env=base, check=False)
    assert both.returncode == 2 and "give exactly one" in both.stderr
    assert not (tmp_path / "q.sqlite3").exists()
    # A queue that is behind: the worker refuses to start.
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM schema_migrations WHERE version = (SELECT MAX(version) FROM schema_migrations)")
    behind = subprocess.run([sys.executable, "-m", "pipeline", "worker", "--once", "--queue-url-file", str(url_file)],
                            capture_output=True, text=True, env=base, check=False)
    assert behind.returncode == 1 and "benchseal infra migrate" in behind.stderr
    for result in (accepted, worker, both, behind):
        assert "hunter2secret" not in result.stdout + result.stderr


def test_state_dir_queue_url_file_selects_postgresql_for_every_process_sharing_the_state(tmp_path, monkeypatch, pg_cluster):
    import subprocess
    import sys

    from pipeline.core.errors import ValidationError
    from pipeline.infra.queue.sql import open_queue

    url = pg_cluster.new_database()
    home = tmp_path / "home"
    (home / "infra").mkdir(parents=True)
    monkeypatch.setenv("BENCHSEAL_HOME", str(home))
    monkeypatch.delenv("BENCHSEAL_QUEUE_URL", raising=False)
    monkeypatch.delenv("BENCHSEAL_QUEUE_URL_FILE", raising=False)
    assert open_queue().backend == "sqlite"  # no config: the default
    (home / "infra" / "queue-url").write_text(url + "\n")
    with open_queue() as q:
        assert q.backend == "postgresql"
    with open_queue(tmp_path / "explicit.sqlite3") as q:  # an explicit --db is an explicit choice
        assert q.backend == "sqlite"
    # The accept wrapper's environment (BENCHSEAL_HOME only) reaches the same queue.
    status = subprocess.run([sys.executable, "-m", "pipeline", "infra", "status", "--summary"], capture_output=True,
                            text=True, env={**os.environ, "BENCHSEAL_HOME": str(home)}, check=False)
    assert status.returncode == 0 and json.loads(status.stdout)["queue"]["backend"] == "postgresql", status.stderr
    (home / "infra" / "queue-url").write_text("sqlite:///nope\n")
    with pytest.raises(ValidationError, match="postgresql://"):
        open_queue()
