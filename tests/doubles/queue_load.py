"""No-op load on the run queue, for the concurrency tests and ``bench/queue.py``.

``python -m tests.doubles.queue_load worker --backend sqlite|postgresql --target T --runs-dir D
--name N --log FILE`` runs one worker process against a real queue: it claims runs, starts them,
sends one heartbeat, "runs" a no-op trial (``--trial-ms``), completes each with a grading and one
outbox row, and delivers that row (claim_publication + mark_published). Runs in their finalize
phase are completed the same way (INFRA_ERROR, no score). When nothing is claimable it delivers
pending rows left by dead workers, and exits once every run is terminal and every row delivered.

It appends one JSON line per claim, per delivery and per finished run to ``--log`` (unbuffered,
so a kill -9 loses at most the line being written): what the checks count, and the time each
queue call took (the queue's own overhead per run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from pipeline.contracts import DispatchPayload, GradeCounts, Grading, PublicationRequest
from pipeline.errors import Error
from pipeline.infra.queue import TERMINAL_STATES, RunRecord, SqliteQueue, SqlQueue


def open_store(backend: str, target: str, runs_dir: Path) -> SqlQueue:
    if backend == "sqlite":
        return SqliteQueue(Path(target), runs_dir=runs_dir)
    from pipeline.infra.queue_pg import PostgresQueue

    return PostgresQueue(target, runs_dir=runs_dir)


def noop_payload(i: int, prefix: str = "load") -> DispatchPayload:
    return DispatchPayload.model_validate({
        "schema": "benchseal.dispatch/v1",
        "correlation_id": f"{prefix}-{i:08d}",
        "source": {"repository": "acme/benchseal", "commit": "0123456789abcdef0123456789abcdef01234567", "tag": "v1.2.3"},
        "runner": f"127.0.0.1:5055/benchseal/runner@sha256:{'a' * 64}",
        "api": f"127.0.0.1:5055/benchseal/api@sha256:{'b' * 64}",
        "suite": "smoke",
        "agent": "nop",
    })


def noop_grading(record: RunRecord) -> Grading:
    ok = record.phase == "run"
    return Grading(
        run_id=record.run_id, status="SUCCEEDED" if ok else "INFRA_ERROR", suite=record.payload.suite,
        agent=record.payload.agent, reason=None if ok else (record.reason or "attempts exhausted"),
        counts=GradeCounts(total=1, completed=1 if ok else 0, resolved=0, unresolved=1 if ok else 0, infra_errors=0 if ok else 1),
        score=0.0 if ok else None, runner_ref=record.payload.runner, api_ref=record.payload.api,
        started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:00:01Z",
    )


class _Log:
    def __init__(self, path: Path) -> None:
        self._handle: IO[bytes] = open(path, "ab", buffering=0)  # kept open for the process's life

    def write(self, **entry: Any) -> None:
        self._handle.write((json.dumps({"t": time.time(), **entry}, sort_keys=True) + "\n").encode())


@contextmanager
def _timer(timings: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + (time.perf_counter() - started) * 1000


def _deliver(queue: SqlQueue, pub_id: int, log: _Log, name: str, lease: float, timings: dict[str, float]) -> bool:
    with _timer(timings, "outbox"):
        won = queue.claim_publication(pub_id, lease)
    if not won:
        return False
    log.write(kind="delivery", pub=pub_id, worker=name)  # the side effect a real target would have
    with _timer(timings, "outbox"):
        queue.mark_published(pub_id, {"delivered_by": name})
    return True


def _finish(queue: SqlQueue, record: RunRecord, timings: dict[str, float], *, name: str, log: _Log, lease: float,
            trial_ms: float) -> None:
    token = record.lease_token or ""
    log.write(kind="claim", run=record.run_id, phase=record.phase, attempts=record.attempts,
              finalize_attempts=record.finalize_attempts, worker=name, token=token)
    with _timer(timings, "start"):
        queue.start(record.run_id, token)
    with _timer(timings, "heartbeat"):
        queue.heartbeat(record.run_id, token, lease)
    if trial_ms > 0:
        time.sleep(trial_ms / 1000)  # the no-op trial
    request = PublicationRequest(run_id=record.run_id, target="local", tag="v1.2.3", artifacts_dir="/nonexistent")
    with _timer(timings, "complete"):
        queue.complete(record.run_id, token, noop_grading(record), [request])
    log.write(kind="completed", run=record.run_id, worker=name, token=token)
    with _timer(timings, "outbox"):
        pubs = queue.list_publications(record.run_id)
    for pub in pubs:
        _deliver(queue, pub.id, log, name, lease, timings)
    log.write(kind="timing", run=record.run_id, worker=name, **{k: round(v, 4) for k, v in timings.items()})


def work(queue: SqlQueue, *, name: str, log: _Log, lease: float, trial_ms: float) -> int:
    """Claim and finish runs until every run is terminal and every row delivered; return how many this worker finished."""
    done = 0
    reconnects = 0
    while True:
        seen = int(getattr(queue, "reconnects", 0))
        if seen != reconnects:
            log.write(kind="reconnect", worker=name, reconnects=seen)
            reconnects = seen
        try:
            timings: dict[str, float] = {}
            with _timer(timings, "requeue"):
                queue.requeue_expired()
            with _timer(timings, "claim"):
                record = queue.claim(name, lease)
            if record is not None:
                _finish(queue, record, timings, name=name, log=log, lease=lease, trial_ms=trial_ms)
                done += 1
                continue
            pending = queue.pending_publications(limit=20)
            for pub in pending:
                _deliver(queue, pub.id, log, name, lease, {})
            if pending:
                continue
            stats = queue.stats()
            if set(stats.by_state) <= TERMINAL_STATES and stats.outbox_pending == 0:
                log.write(kind="exit", worker=name, done=done, reconnects=int(getattr(queue, "reconnects", 0)))
                return done
            time.sleep(0.05)
        except Error as exc:  # a lost lease, a database restart: the next loop goes on
            log.write(kind="error", worker=name, error=exc.diagnostics()[:300])
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="queue_load")
    parser.add_argument("command", choices=["worker"])
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], required=True)
    parser.add_argument("--target-env", required=True, help="Environment variable holding the SQLite path or PostgreSQL URL.")
    parser.add_argument("--runs-dir", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--trial-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    log = _Log(args.log)
    target = os.environ[args.target_env]  # never in argv: a URL may carry a password
    while True:
        try:
            queue = open_store(args.backend, target, args.runs_dir)
            break
        except Error as exc:
            log.write(kind="error", worker=args.name, error=exc.diagnostics()[:300])
            time.sleep(0.2)
    with queue:
        work(queue, name=args.name, log=log, lease=args.lease, trial_ms=args.trial_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
