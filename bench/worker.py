"""Benchmark the infra queue and worker (prints figures; asserts nothing timed).

1. enqueue rate (accept path minus validation: SqliteQueue.enqueue, incl. run.json writes);
2. claim rate, one claimer and four threads;
3. 50 consecutive worker attempts in a cheap mode (run_once against a runner
   digest the registry does not have: claim, heartbeat thread, Engine client,
   pull, infra error, terminal transition): worker RSS and open FDs per attempt;
4. a few REAL runs per agent (oracle, and terminus-2 against the scripted model,
   side by side, on suites/smoke in the runner image): Harbor per-trial overhead =
   trial wall time - agent time - verifier time, plus RSS/FDs and model calls.

Usage: .venv/bin/python bench/worker.py [--real-runs N] [--cheap-runs N] [--agents oracle,terminus-2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.contracts import DispatchPayload
from pipeline.infra.policy import load_policy
from pipeline.infra.queue import SqliteQueue


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def payload(i: int, runner: str, api: str, agent: str = "oracle") -> DispatchPayload:
    return DispatchPayload.model_validate({
        "schema": "benchseal.dispatch/v1",
        "correlation_id": f"bench-{os.getpid()}-{i:07d}",
        "source": {"repository": "acme/benchseal", "commit": "0" * 40, "tag": "v0.0.0-bench"},
        "runner": runner, "api": api, "suite": "smoke", "agent": agent,
    })


def bench_queue(root: Path, n: int) -> None:
    runner = "127.0.0.1:5055/benchseal/runner@sha256:" + "a" * 64
    api = "127.0.0.1:5055/benchseal/api@sha256:" + "b" * 64
    db = root / "rates" / "queue.sqlite3"
    with SqliteQueue(db) as q:
        items = [payload(i, runner, api) for i in range(2 * n)]
        t = time.perf_counter()
        for p in items:
            q.enqueue(p, max_attempts=3)
        enqueue = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(n):
            q.claim("bench", 60)
        claim1 = time.perf_counter() - t
    claimed = [0] * 4

    def claimer(k: int) -> None:
        with SqliteQueue(db) as mine:
            while mine.claim(f"t{k}", 60) is not None:
                claimed[k] += 1

    threads = [threading.Thread(target=claimer, args=(k,)) for k in range(4)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    claim4 = time.perf_counter() - t
    print(f"enqueue: {2 * n / enqueue:,.0f} runs/s ({2 * n} runs, {enqueue * 1e3 / (2 * n):.2f} ms each, incl. run.json)")
    print(f"claim, 1 claimer: {n / claim1:,.0f} claims/s")
    print(f"claim, 4 threads: {sum(claimed) / claim4:,.0f} claims/s (claimed {sum(claimed)}, no duplicates by construction)")


def bench_cheap_worker(root: Path, n: int) -> None:
    from pipeline.infra.worker import WorkerConfig, run_once

    policy = load_policy().model_copy(update={"max_attempts": 1})
    db = root / "cheap" / "queue.sqlite3"
    missing = "127.0.0.1:5055/benchseal/runner@sha256:" + "0" * 64
    api = "127.0.0.1:5055/benchseal/api@sha256:" + "b" * 64
    with SqliteQueue(db) as q:
        for i in range(n):
            q.enqueue(payload(10_000 + i, missing, api), max_attempts=1)
    config = WorkerConfig(db=db, policy=policy)
    rss, fds, wall = [], [], []
    import logging

    logging.getLogger("benchseal.worker").setLevel(logging.CRITICAL)
    for _ in range(n):
        t = time.perf_counter()
        outcome = run_once(config)
        wall.append(time.perf_counter() - t)
        assert outcome is not None and outcome.state == "INFRA_ERROR"
        rss.append(rss_kib())
        fds.append(open_fds())
    print(f"cheap worker attempts x{n} (claim+heartbeat+engine+pull by digest fails+INFRA_ERROR): "
          f"median {statistics.median(wall) * 1e3:.0f} ms")
    print(f"  RSS KiB: first {rss[0]}, after 10 {rss[9]}, last {rss[-1]}, max {max(rss)}; "
          f"growth after warm-up {rss[-1] - rss[9]:+d} KiB")
    print(f"  open FDs: first {fds[0]}, last {fds[-1]}, min {min(fds)}, max {max(fds)}")


def bench_real(root: Path, n: int, agent: str = "oracle") -> None:
    from pipeline.build import build_images
    from pipeline.infra.worker import WorkerConfig, run_once

    images = build_images(["runner", "api"], "127.0.0.1:5055")
    runner, api = images.images["runner"], images.images["api"]
    policy = load_policy()
    db = root / f"real-{agent}" / "queue.sqlite3"
    with SqliteQueue(db) as q:
        for i in range(n):
            q.enqueue(payload(20_000 + i, runner.ref, api.ref, agent), max_attempts=1)
    overheads, totals, agents, verifiers, rss, fds, walls, calls = [], [], [], [], [], [], [], []
    for _ in range(n):
        t = time.perf_counter()
        outcome = run_once(WorkerConfig(db=db, policy=policy))
        walls.append(time.perf_counter() - t)
        assert outcome is not None and outcome.grading is not None, outcome
        for trial in outcome.grading.trials:
            if trial.total_seconds is None:
                continue
            a, v = trial.agent_seconds or 0.0, trial.verifier_seconds or 0.0
            totals.append(trial.total_seconds)
            agents.append(a)
            verifiers.append(v)
            overheads.append(trial.total_seconds - a - v)
            calls.append(trial.model_calls or 0)
        rss.append(rss_kib())
        fds.append(open_fds())
        print(f"  real run: {outcome.state} score={outcome.grading.score} wall={walls[-1]:.1f}s")
    print(f"real runs [{agent}] x{n} ({len(totals)} trials, 3 concurrent per run): "
          f"run wall median {statistics.median(walls):.1f} s; model calls per trial median {statistics.median(calls):g}")
    print(f"  per trial: wall median {statistics.median(totals):.2f} s, agent {statistics.median(agents):.2f} s, "
          f"verifier (incl. its container start) {statistics.median(verifiers):.2f} s")
    print(f"  Harbor overhead per trial (wall - agent - verifier): median {statistics.median(overheads):.2f} s, "
          f"max {max(overheads):.2f} s; ratio overhead/wall {statistics.median(overheads) / statistics.median(totals):.2f}")
    print(f"  RSS KiB after each real run: {rss}; open FDs: {fds}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queue-n", type=int, default=1000)
    parser.add_argument("--cheap-runs", type=int, default=50)
    parser.add_argument("--real-runs", type=int, default=3)
    parser.add_argument("--agents", default="oracle,terminus-2", help="comma-separated; each gets --real-runs runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        root = Path(tmp)
        bench_queue(root, args.queue_n)
        bench_cheap_worker(root, args.cheap_runs)
        if args.real_runs:
            from pipeline.infra.model_local import scripted_model_for

            for agent in args.agents.split(","):
                # A model-backed agent calls the scripted model on the policy's endpoint.
                with scripted_model_for(agent, "smoke", None if agent in ("oracle", "nop") else "right"):
                    bench_real(root, args.real_runs, agent)


if __name__ == "__main__":
    main()
