"""Benchmark the run queue's own overhead: SQLite and PostgreSQL side by side, 1, 2, 4, 8 workers.

Each configuration gets a fresh store with ``--runs`` queued no-op runs, and W worker processes
(``tests.doubles.queue_load``) drain it, split into 2 groups the way the issue's spec asks: each
group in its own network namespace (``unshare --net``; the queue reached only through its Unix
socket or file), or in its own process group where namespaces are unavailable, with separate state
dirs. Per run, the way the infra worker does it: claim the run, plan it into ``--trials`` trials and
claim the first batch (one transaction), one trial heartbeat, a no-op trial, record the trial (the
batch that ends the last trial is handed the run), read the trial rows to grade, complete (grading +
one outbox row in the terminal transaction), deliver the outbox row (claim_publication +
mark_published). Expired leases are swept at most every 0.25 s per worker. Printed per configuration:

* the queue's overhead per run (requeue sweep + claims + plan + heartbeat + trial results + grading
  read + complete + outbox), median and p99, in ms, measured inside the workers around each queue call;
* runs completed per second (first claim to last completion);
* the CPU time per run inside the workers' queue calls (of which rewriting run.json) and in the
  PostgreSQL server's processes, and the floor it sets: with no-op trials every worker is always in
  a queue call, so W workers on N CPUs cannot spend less than W x CPU per run / N per run;

then the ratio PostgreSQL@8 / SQLite@1, and whether PostgreSQL@8 meets the target of <= 10 ms
median overhead per run. Figures only: nothing here is asserted.

Every worker imports its code and opens its store before a start gate opens (no worker's start-up
competes with another's claims). Stores, run dirs and the PostgreSQL cluster (a throwaway one on a
Unix socket, tests.doubles.postgres, stopped at the end) live under ``<state dir>/bench`` (``--dir``),
where a worker keeps its state, not in the system temp dir.

    .venv/bin/python bench/queue.py [--runs 1000] [--workers 1,2,4,8] [--trials 1] [--dir DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the standard library's `queue`: take bench/ off the import path
# before anything (psycopg, multiprocessing) imports `queue`.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from pipeline.core.paths import home  # noqa: E402
from tests.doubles.postgres import PgCluster, pg_bindir  # noqa: E402
from tests.doubles.queue_load import WorkerGroups, noop_payload, open_store, worker_command  # noqa: E402

OVERHEAD_KEYS = {"requeue", "claim", "plan", "heartbeat", "complete", "outbox"}


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _atomic_write_us(place: Path, count: int = 300) -> float:
    """Median CPU time of one run.json-style write (temp file + os.replace) in ``place``, in us."""
    costs = []
    with tempfile.TemporaryDirectory(prefix="bench-write-", dir=place) as tmp:
        target = Path(tmp) / "run.json"
        for i in range(count):
            started = time.process_time()
            staged = target.with_name(f".run.json.{i}.tmp")
            staged.write_text("x" * 600, encoding="utf-8")
            os.replace(staged, target)
            costs.append((time.process_time() - started) * 1e6)
    return statistics.median(costs)


def _open_gate_when_ready(gate: Path, logs: Path, procs: list[subprocess.Popen[bytes]], timeout: float = 300.0) -> None:
    """Open the start gate once every worker has imported its code and opened its store: the
    figures are then the queue's, not the workers' start-up competing with it for the CPUs."""
    deadline = time.monotonic() + timeout
    while True:
        ready = sum(1 for path in logs.glob("*.jsonl") if '"kind": "ready"' in path.read_text())
        if ready == len(procs):
            gate.touch()
            return
        failed = [p.returncode for p in procs if p.poll() is not None]
        if failed or time.monotonic() > deadline:
            raise SystemExit(f"workers not ready ({ready} of {len(procs)}; exits {failed})")
        time.sleep(0.02)


def run_config(backend: str, target: str, workdir: Path, runs: int, workers: int, trials: int,
               cluster: PgCluster | None) -> dict[str, float | str]:
    logs = workdir / "logs"
    logs.mkdir(parents=True)
    groups = WorkerGroups(workdir / "hosts", 2)
    try:
        with open_store(backend, target, groups.runs_dir(0)) as q:
            for i in range(runs):
                q.enqueue(noop_payload(i, "bench"), max_attempts=3)
        env = {**os.environ, "QUEUE_TARGET": target}
        gate = workdir / "go"
        procs = [groups.spawn(i % 2, worker_command(backend, "QUEUE_TARGET", groups.runs_dir(i % 2), f"w{i}",
                                                    logs / f"w{i}.jsonl", lease=60, trials=trials, batch=1,
                                                    gate=gate), env)
                 for i in range(workers)]
        server_before = cluster.cpu_seconds() if cluster is not None else 0.0
        _open_gate_when_ready(gate, logs, procs)
        for proc in procs:
            if proc.wait(timeout=1800) != 0:
                raise SystemExit(f"a {backend} worker failed (exit {proc.returncode})")
        time.sleep(0.3)  # the workers' database sessions end, and their time is counted
        server_cpu = (cluster.cpu_seconds() - server_before) if cluster is not None else 0.0
    finally:
        groups.close()
    entries = [json.loads(line) for path in logs.glob("*.jsonl") for line in path.read_text().splitlines()]
    timings = [e for e in entries if e["kind"] == "timing"]
    if len(timings) != runs:
        raise SystemExit(f"{backend}@{workers}: {len(timings)} runs finished, expected {runs}")
    # With one trial per run, one worker iteration takes a run from claim to delivery: its timings are the run's.
    overhead = [sum(v for k, v in e.items() if k in OVERHEAD_KEYS) for e in timings]
    claims = [e["t"] for e in entries if e["kind"] == "claim"]
    done = [e["t"] for e in timings]
    wall = max(done) - min(claims)
    with open_store(backend, target, groups.runs_dir(0)) as q:
        stats = q.stats()
        if stats.by_state != {"SUCCEEDED": runs} or stats.outbox_pending != 0:
            raise SystemExit(f"{backend}@{workers}: not every run finished and published: {stats}")
    return {"median": statistics.median(overhead), "p99": _p(overhead, 0.99), "rps": runs / wall if wall > 0 else float("inf"),
            "client_cpu": statistics.mean(e.get("cpu", 0.0) for e in timings), "server_cpu": server_cpu * 1000 / runs,
            "status_cpu": statistics.mean(e.get("status_cpu", 0.0) for e in timings),
            "isolation": groups.isolation, "statements": statistics.median(e.get("statements", 0) for e in timings),
            "commits": statistics.median(e.get("commits", 0) for e in timings),
            "reads": statistics.median(e.get("reads", 0) for e in timings)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--trials", type=int, default=1, help="Trials per run (1: the per-run figures are exact).")
    parser.add_argument("--dir", help="Where stores, run dirs and the cluster go (default: <state dir>/bench).")
    parser.add_argument("--pg-no-fsync", action="store_true",
                        help="Run PostgreSQL with fsync=off (not durable): separates the queue's cost from the disk's.")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    bindir = pg_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL is not installed: run `make setup`")
    # Stores, run dirs and the cluster live where a worker keeps its state (the state dir), not in
    # the system temp dir: every transition rewrites run.json, and file creation in /tmp has cost
    # several times more on this machine at times (the line "atomic file write" below shows both).
    parent = Path(args.dir) if args.dir else home() / "bench"
    parent.mkdir(parents=True, exist_ok=True)
    parent.chmod(0o755)  # the postgres user traverses it to its cluster
    write_cost = {str(place): _atomic_write_us(place) for place in (parent, Path(tempfile.gettempdir()))}
    # Default: fsync on, synchronous_commit on (the production defaults).
    cluster = PgCluster(bindir, durable=not args.pg_no_fsync, parent=parent)
    results: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-queue-", dir=parent) as tmp:
            for workers in counts:
                for backend in ("sqlite", "postgresql"):
                    workdir = Path(tmp) / f"{backend}-{workers}"
                    target = str(workdir / "queue.sqlite3") if backend == "sqlite" else cluster.new_database()
                    results[(backend, workers)] = run_config(backend, target, workdir, args.runs, workers, args.trials,
                                                             cluster if backend == "postgresql" else None)
    finally:
        cluster.close()
    isolation = next(iter(results.values()))["isolation"] if results else "?"
    print(f"queue overhead per run (requeue + claims + plan + heartbeat + trial results + complete + outbox), "
          f"{args.runs} no-op runs x {args.trials} trial(s), workers in 2 groups ({isolation}), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, PostgreSQL fsync "
          f"{'off' if args.pg_no_fsync else 'on'}")
    print("atomic file write (temp file + os.replace, as run.json): "
          + ", ".join(f"{place} {cost:.0f} us" for place, cost in write_cost.items()) + f"; measured in {parent}")
    print(f"{'workers':>7} | {'sqlite med':>10} {'p99':>8} {'runs/s':>8} | {'postgresql med':>14} {'p99':>8} {'runs/s':>8}")
    for workers in counts:
        s, p = results[("sqlite", workers)], results[("postgresql", workers)]
        print(f"{workers:>7} | {s['median']:>8.2f}ms {s['p99']:>6.2f}ms {s['rps']:>8.1f} | "
              f"{p['median']:>12.2f}ms {p['p99']:>6.2f}ms {p['rps']:>8.1f}")
    cpus = os.cpu_count() or 1
    print(f"CPU per run (mean): in the workers' queue calls (of which rewriting run.json) + the database server's "
          f"processes. With no-op trials every worker is always in a queue call, so W workers on {cpus} CPUs "
          f"cannot take less than W x CPU per run / {cpus} of wall time per run (the floor)")
    for workers in counts:
        s, p = results[("sqlite", workers)], results[("postgresql", workers)]
        total = p["client_cpu"] + p["server_cpu"]
        print(f"{workers:>7} | sqlite {s['client_cpu']:.2f} ms (run.json {s['status_cpu']:.2f}; floor "
              f"{workers * s['client_cpu'] / cpus:.2f} ms) | postgresql {p['client_cpu']:.2f} (run.json "
              f"{p['status_cpu']:.2f}) + server {p['server_cpu']:.2f} = {total:.2f} ms (floor {workers * total / cpus:.2f} ms)")
    for backend in ("sqlite", "postgresql"):
        r = results[(backend, counts[-1])]
        print(f"{backend}: per run (median) {r['statements']:g} statements, {r['commits']:g} write transactions "
              f"(durable commits), {r['reads']:g} reads: the load-independent part of the cost")
    if 1 in counts and 8 in counts:
        s1, p8 = results[("sqlite", 1)], results[("postgresql", 8)]
        print(f"ratio PostgreSQL@8 / SQLite@1: median overhead {p8['median'] / s1['median']:.2f}x, "
              f"p99 {p8['p99'] / s1['p99']:.2f}x, runs/s {p8['rps'] / s1['rps']:.2f}x")
        verdict = "met" if p8["median"] <= 10.0 else "NOT met"
        print(f"target PostgreSQL@8 median overhead <= 10 ms per run: {p8['median']:.2f} ms ({verdict})")


if __name__ == "__main__":
    main()
