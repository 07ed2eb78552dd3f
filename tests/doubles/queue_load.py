"""No-op load on the run queue, for the concurrency tests and ``bench/queue.py``.

``python -m tests.doubles.queue_load worker --backend sqlite|postgresql --target-env VAR --runs-dir D
--name N --log FILE [--trials T --batch B]`` runs one worker process against a real queue, the way
the infra worker does: it takes a batch of QUEUED trials of any run, or else claims a run and
plans it into T trials (claiming its first batch in the same transaction); it "runs" the batch
(one heartbeat, a no-op of ``--trial-ms``) and records each trial's result. The worker whose batch
ends a run's last trial grades the run from the queue's trial rows (every trial exactly once),
completes it with one outbox row and delivers that row (claim_publication + mark_published).
Runs in their finalize phase (a dead grader, trials that ended by lease expiry, planning attempts
used up) are graded the same way. When nothing is claimable it delivers pending rows left by dead
workers, and exits once every run is terminal and every row delivered.

It appends one JSON line per claim, per delivery and per finished run to ``--log`` (unbuffered,
so a kill -9 loses at most the line being written): what the checks count, and the time each
queue call took (the queue's own overhead per run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from pipeline.core.contracts import DispatchPayload, GradeCounts, Grading, PublicationRequest
from pipeline.core.errors import Error
from pipeline.infra.queue.sql import (
    TERMINAL_STATES,
    Cursor,
    PlannedTrial,
    RunRecord,
    SqliteQueue,
    SqlQueue,
    T,
    TrialBatch,
)


def open_store(backend: str, target: str, runs_dir: Path) -> SqlQueue:
    if backend == "sqlite":
        return SqliteQueue(Path(target), runs_dir=runs_dir)
    from pipeline.infra.queue.postgres import PostgresQueue

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


def noop_grading(record: RunRecord, total: int = 1, completed: int = 1) -> Grading:
    """SUCCEEDED (score 0) when every planned trial has a result; INFRA_ERROR, no score, otherwise."""
    ok = record.trials_planned > 0 and completed == total == record.trials_planned
    return Grading(
        run_id=record.run_id, status="SUCCEEDED" if ok else "INFRA_ERROR", suite=record.payload.suite,
        agent=record.payload.agent, reason=None if ok else (record.reason or "trials or attempts exhausted"),
        counts=GradeCounts(total=total, completed=completed, resolved=0, unresolved=completed,
                           infra_errors=total - completed),
        score=0.0 if ok else None, runner_ref=record.payload.runner, api_ref=record.payload.api,
        started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:00:01Z",
    )


class _Log:
    def __init__(self, path: Path) -> None:
        self._handle: IO[bytes] = open(path, "ab", buffering=0)  # kept open for the process's life

    def write(self, **entry: Any) -> None:
        self._handle.write((json.dumps({"t": time.time(), **entry}, sort_keys=True) + "\n").encode())


class _Cursor:
    """Counts the statements a queue call sends."""

    def __init__(self, cur: Cursor, counts: dict[str, float]) -> None:
        self._cur, self._counts = cur, counts

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        self._counts["statements"] += 1
        return self._cur.execute(sql, params)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()


def count_round_trips(queue: SqlQueue) -> dict[str, float]:
    """Wrap ``queue``'s transactions and reads so that every statement, write transaction (a COMMIT,
    durable on disk) and read is counted in the returned dict (the load's deterministic cost), and
    the CPU time (ms) spent rewriting run.json views is summed in ``status_cpu``."""
    counts: dict[str, float] = {"statements": 0, "commits": 0, "reads": 0, "status_cpu": 0.0}
    transaction, read = queue._transaction, queue._read  # instrumentation of the load driver only
    write_status = queue._write_status

    def timed_write_status(run_id: str, row: Any = None) -> None:
        started = time.thread_time()
        try:
            write_status(run_id, row)
        finally:
            counts["status_cpu"] += (time.thread_time() - started) * 1000

    def counted_transaction(work: Callable[[Cursor], T]) -> T:
        counts["commits"] += 1
        return transaction(lambda cur: work(_Cursor(cur, counts)))

    def counted_read(work: Callable[[Cursor], T]) -> T:
        counts["reads"] += 1
        return read(lambda cur: work(_Cursor(cur, counts)))

    setattr(queue, "_transaction", counted_transaction)  # noqa: B010
    setattr(queue, "_read", counted_read)  # noqa: B010
    setattr(queue, "_write_status", timed_write_status)  # noqa: B010
    return counts


@contextmanager
def _timer(timings: dict[str, float], name: str) -> Iterator[None]:
    """Add the call's wall time (ms) to ``timings[name]`` and its CPU time in this process to ``timings["cpu"]``."""
    started, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + (time.perf_counter() - started) * 1000
        timings["cpu"] = timings.get("cpu", 0.0) + (time.thread_time() - cpu) * 1000


def _deliver(queue: SqlQueue, pub_id: int, log: _Log, name: str, lease: float, timings: dict[str, float]) -> bool:
    with _timer(timings, "outbox"):
        won = queue.claim_publication(pub_id, lease)
    if not won:
        return False
    log.write(kind="delivery", pub=pub_id, worker=name)  # the side effect a real target would have
    with _timer(timings, "outbox"):
        queue.mark_published(pub_id, {"delivered_by": name})
    return True


def _grade(queue: SqlQueue, record: RunRecord, timings: dict[str, float], *, name: str, log: _Log, lease: float) -> None:
    """Grade a run whose trials have all ended (every trial exactly once, from the queue), complete it, deliver."""
    token = record.lease_token or ""
    with _timer(timings, "complete"):
        rows = queue.trials(record.run_id) if record.trials_planned else []
    results = [json.loads(r.result) for r in rows if r.result is not None]
    graded = [r.idx for r in rows]
    log.write(kind="graded", run=record.run_id, worker=name, token=token, trials=graded, phase=record.phase,
              results=len(results), planned=record.trials_planned)
    request = PublicationRequest(run_id=record.run_id, target="local", tag="v1.2.3", artifacts_dir="/nonexistent")
    with _timer(timings, "complete"):
        pub_ids = queue.complete(record.run_id, token, noop_grading(record, len(rows), len(results)), [request])
    log.write(kind="completed", run=record.run_id, worker=name, token=token)
    for pub_id in pub_ids:
        _deliver(queue, pub_id, log, name, lease, timings)


def _run_batch(queue: SqlQueue, batch: TrialBatch, timings: dict[str, float], *, name: str, log: _Log, lease: float,
               trial_ms: float) -> RunRecord | None:
    run_id, token = batch.run.run_id, batch.lease_token
    log.write(kind="trial_claim", run=run_id, worker=name, token=token,
              trials=[[t.idx, t.attempts] for t in batch.trials])
    if trial_ms > 0:
        # A trial that takes time renews its lease (the worker's heartbeat thread, every lease/3); the
        # claim itself set the lease, so a zero-length trial has no heartbeat due.
        time.sleep(trial_ms / 2000)
        with _timer(timings, "heartbeat"):
            queue.heartbeat_trials(run_id, token, lease)
        time.sleep(trial_ms / 2000)
    results = {t.idx: json.dumps({"idx": t.idx, "by": name, "attempt": t.attempts}) for t in batch.trials}
    with _timer(timings, "complete"):
        grader = queue.complete_trials(run_id, token, results, lease_seconds=lease)
    log.write(kind="trials_done", run=run_id, worker=name, token=token, trials=sorted(results), last=grader is not None)
    return grader


def work(queue: SqlQueue, *, name: str, log: _Log, lease: float, trial_ms: float, trials: int = 1, batch: int = 1,
         requeue_every: float = 0.25) -> int:
    """Claim trials and runs until every run is terminal and every row delivered; return how many runs this worker ended.

    A worker first takes a batch of QUEUED trials (of any run), else claims a run: a run in its
    run phase is planned into ``trials`` trials (the planner claims the first batch in the same
    transaction), a run in its finalize phase is graded from the trials that ended. The worker
    whose batch ends a run's last trial grades and completes it. Expired leases are swept at most
    every ``requeue_every`` seconds (a read when nothing expired).
    """
    done = 0
    reconnects = 0
    swept = 0.0
    counts = count_round_trips(queue)
    while True:
        seen = int(getattr(queue, "reconnects", 0))
        if seen != reconnects:
            log.write(kind="reconnect", worker=name, reconnects=seen)
            reconnects = seen
        try:
            timings: dict[str, float] = {}
            before = dict(counts)
            if time.monotonic() - swept >= requeue_every:
                with _timer(timings, "requeue"):
                    queue.requeue_expired()
                swept = time.monotonic()
            with _timer(timings, "claim"):
                claimed = queue.claim_trials(name, lease, batch)
            if claimed is None:
                with _timer(timings, "claim"):
                    record = queue.claim(name, lease)
                if record is not None:
                    log.write(kind="claim", run=record.run_id, phase=record.phase, attempts=record.attempts,
                              finalize_attempts=record.finalize_attempts, worker=name, token=record.lease_token or "")
                    if record.phase == "finalize":
                        _grade(queue, record, timings, name=name, log=log, lease=lease)
                        done += 1
                        log.write(kind="timing", run=record.run_id, worker=name, **_rounded(timings),
                                  **{k: round(counts[k] - before[k], 4) for k in counts})
                        continue
                    plan = [PlannedTrial(task=f"task-{i:03d}", trial_name=f"task-{i:03d}__{record.run_id[-12:]}")
                            for i in range(trials)]
                    with _timer(timings, "plan"):
                        claimed = queue.plan_trials(record.run_id, record.lease_token or "", plan,
                                                    max_attempts=record.max_attempts, claim=batch, worker=name,
                                                    lease_seconds=lease)
            if claimed is not None:
                grader = _run_batch(queue, claimed, timings, name=name, log=log, lease=lease, trial_ms=trial_ms)
                if grader is not None:
                    _grade(queue, grader, timings, name=name, log=log, lease=lease)
                    done += 1
                    log.write(kind="timing", run=grader.run_id, worker=name, **_rounded(timings),
                              **{k: round(counts[k] - before[k], 4) for k in counts})
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


def _rounded(timings: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in timings.items()}


class WorkerGroups:
    """Worker processes in ``count`` groups, each group in its own network namespace (``unshare --net``:
    like separate hosts, reaching the queue only through its Unix socket or file), or, where namespaces
    are unavailable, in its own process group. Each group has its own state dir (runs dir, BENCHSEAL_HOME).

    Only this object's own processes are ever stopped, by their recorded pids.
    """

    def __init__(self, root: Path, count: int = 2, *, namespaces: bool | None = None) -> None:
        self.root = root
        self.holders: list[subprocess.Popen[bytes]] = []
        self.dirs = [root / f"group-{g}" for g in range(count)]
        for d in self.dirs:
            (d / "runs").mkdir(parents=True, exist_ok=True)
            (d / "home").mkdir(parents=True, exist_ok=True)
        want = namespaces if namespaces is not None else True
        self.namespaces = want and self._start_holders(count)
        self.isolation = "network namespaces" if self.namespaces else "process groups"

    def _start_holders(self, count: int) -> bool:
        unshare, nsenter = shutil.which("unshare"), shutil.which("nsenter")
        if unshare is None or nsenter is None:
            return False
        for _ in range(count):
            # One idle process per group holds the group's network namespace open.
            holder = subprocess.Popen([unshare, "--net", "--", "sleep", "infinity"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
            time.sleep(0.05)
            if holder.poll() is not None or os.readlink(f"/proc/{holder.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
                self.close()
                return False
            self.holders.append(holder)
        return True

    def runs_dir(self, group: int) -> Path:
        return self.dirs[group] / "runs"

    def spawn(self, group: int, args: list[str], env: dict[str, str], **popen: Any) -> subprocess.Popen[bytes]:
        # `python -m tests.doubles.queue_load` needs the checkout on the path, whatever the cwd.
        checkout = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (checkout, env.get("PYTHONPATH", "")) if p)
        env = {**env, "BENCHSEAL_HOME": str(self.dirs[group] / "home"), "PYTHONPATH": path}
        if self.namespaces:
            nsenter = shutil.which("nsenter") or "nsenter"
            # nsenter execs the worker in place: the Popen pid IS the worker's (kill -9 reaches it).
            return subprocess.Popen([nsenter, f"--net=/proc/{self.holders[group].pid}/ns/net", "--", *args], env=env,
                                    **popen)
        return subprocess.Popen(args, env=env, start_new_session=True, **popen)

    def close(self) -> None:
        for holder in self.holders:
            if holder.poll() is None:
                holder.kill()
            holder.wait(timeout=30)
        self.holders = []


def worker_command(backend: str, target_env: str, runs_dir: Path, name: str, log: Path, *, lease: float,
                   trial_ms: float = 0.0, trials: int = 1, batch: int = 1, gate: Path | None = None) -> list[str]:
    return [sys.executable, "-m", "tests.doubles.queue_load", "worker", "--backend", backend, "--target-env", target_env,
            "--runs-dir", str(runs_dir), "--name", name, "--log", str(log), "--lease", str(lease),
            "--trial-ms", str(trial_ms), "--trials", str(trials), "--batch", str(batch),
            *(["--gate", str(gate)] if gate is not None else [])]


def _wait_for_gate(gate: Path, log: _Log, name: str, timeout: float = 600.0) -> None:
    """Say "ready" (imports done, store open), then wait until ``gate`` exists: a benchmark opens the
    gate once every worker is ready, so no worker's start-up (about 0.4 s of CPU for its imports)
    runs beside another's claims."""
    log.write(kind="ready", worker=name)
    deadline = time.monotonic() + timeout
    while not gate.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: the start gate {gate} did not open within {timeout:g} s")
        time.sleep(0.005)


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
    parser.add_argument("--trials", type=int, default=1, help="Trials each run is planned into.")
    parser.add_argument("--batch", type=int, default=1, help="Trials claimed at once.")
    parser.add_argument("--gate", type=Path, help="Start claiming only once this file exists (benchmarks).")
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
        if args.gate is not None:
            _wait_for_gate(args.gate, log, args.name)
        work(queue, name=args.name, log=log, lease=args.lease, trial_ms=args.trial_ms, trials=args.trials, batch=args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
