"""Concurrency under failure, on both backends: 8 worker processes in 2 groups (2 network
namespaces, or 2 process groups where namespaces are unavailable; separate state dirs) share
no-op runs, each split into trials that different workers claim, while some workers are killed
with -9 mid-trial (and, on PostgreSQL, the database server is restarted mid-run). Expected: 0
double claims, 0 lost runs, every trial graded exactly once, every run terminal exactly once,
every outbox row delivered exactly once.

The sizes are the issue's: 1,000 runs (of 3 trials each) on 8 workers."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from pipeline.infra.queue.sql import TERMINAL_STATES
from tests.doubles.queue_load import WorkerGroups, noop_payload, open_store, worker_command

N_RUNS = 1000
N_TRIALS = 3  # each run is split into 3 trials, claimed 2 at a time: one run spreads over several workers
BATCH = 2
N_WORKERS = 8
GROUPS = 2
KILL_ROUNDS = 6


def _spawn(spec, groups: WorkerGroups, index: int, name: str, logs: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "QUEUE_TARGET": spec.target}
    group = index % GROUPS
    command = worker_command(spec.backend, "QUEUE_TARGET", groups.runs_dir(group), name, logs / f"{name}.jsonl",
                             lease=2, trial_ms=100, trials=N_TRIALS, batch=BATCH)
    return groups.spawn(group, command, env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_until_all_claimed(workers: dict[str, subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        waiting = [n for n, p in workers.items() if p.poll() is None
                   and not any(json.loads(line)["kind"] in ("claim", "trial_claim") for line in _lines(logs / f"{n}.jsonl"))]
        if not waiting:
            return
        time.sleep(0.02)
    raise AssertionError("workers did not start claiming")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def _mid_run_worker(workers: dict[str, subprocess.Popen[bytes]], logs: Path, rng: random.Random) -> str | None:
    """A live worker whose last log line is a claim: it holds a run right now (kill -9 lands mid-run)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        holding = []
        for name, proc in workers.items():
            path = logs / f"{name}.jsonl"
            if proc.poll() is not None or not path.is_file():
                continue
            lines = path.read_text().splitlines()
            if lines and json.loads(lines[-1])["kind"] in ("claim", "trial_claim"):
                holding.append(name)
        if holding:
            return rng.choice(sorted(holding))
        time.sleep(0.01)
    return None


@pytest.mark.slow
def test_kill_9_rounds_and_a_database_restart_lose_and_duplicate_nothing(queue_spec, tmp_path, request):
    rng = random.Random(1234)
    logs = tmp_path / "logs"
    logs.mkdir()
    with open_store(queue_spec.backend, queue_spec.target, Path(queue_spec.runs_dir)) as q:
        ids = [q.enqueue(noop_payload(i, "chaos"), max_attempts=4)[0] for i in range(N_RUNS)]
    workers: dict[str, subprocess.Popen[bytes]] = {}
    serial = 0
    groups = WorkerGroups(tmp_path / "hosts", GROUPS)
    request.addfinalizer(groups.close)

    def start_one() -> None:
        nonlocal serial
        serial += 1
        name = f"w{serial:02d}"
        workers[name] = _spawn(queue_spec, groups, serial, name, logs)

    for _ in range(N_WORKERS):
        start_one()
    killed: list[str] = []
    restarted = False
    try:
        for round_no in range(KILL_ROUNDS):
            time.sleep(rng.uniform(0.5, 3.5))  # rounds spread over the run, not only its start
            victim = _mid_run_worker(workers, logs, rng)
            if victim is None:
                break
            time.sleep(rng.uniform(0.0, 0.08))  # somewhere inside its (100 ms) trial batch
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait(timeout=30)
            killed.append(victim)
            start_one()
            if queue_spec.backend == "postgresql" and round_no == 1:
                # Every live worker is connected (has claimed), so the restart breaks their connections;
                # with two kill rounds left, at least two of them live on to show they reconnected.
                _wait_until_all_claimed(workers, logs)
                request.getfixturevalue("pg_cluster").restart("immediate")  # a crash-like restart mid-run
                restarted = True
        deadline = time.monotonic() + 240
        while any(p.poll() is None for p in workers.values()):
            if time.monotonic() > deadline:
                raise AssertionError("workers did not drain the queue in time")
            time.sleep(0.2)
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    assert len(killed) >= 2
    assert restarted or queue_spec.backend == "sqlite"
    for name, proc in workers.items():
        if name not in killed:
            assert proc.returncode == 0, (name, proc.stderr.read().decode() if proc.stderr else "")

    entries = [json.loads(line) for path in logs.glob("*.jsonl") for line in path.read_text().splitlines() if line.strip()]
    claims = [e for e in entries if e["kind"] == "claim"]
    # 0 double claims: each (run, phase, attempt) was handed out once, and no lease token twice.
    keys = Counter((e["run"], e["phase"], e["attempts"], e["finalize_attempts"]) for e in claims)
    assert [k for k, n in keys.items() if n > 1] == []
    trial_claims = [e for e in entries if e["kind"] == "trial_claim"]
    trial_keys = Counter((e["run"], idx, attempt) for e in trial_claims for idx, attempt in e["trials"])
    assert [k for k, n in trial_keys.items() if n > 1] == []
    tokens = [e["token"] for e in claims] + [e["token"] for e in trial_claims]
    assert len(set(tokens)) == len(tokens)
    # One run's trials were spread over several workers, in both groups.
    holders: dict[str, set[str]] = {}
    for e in trial_claims:
        holders.setdefault(e["run"], set()).add(e["worker"])
    assert max(len(w) for w in holders.values()) >= 2
    group_of = {name: int(name[1:]) % GROUPS for name in workers}
    assert {group_of[e["worker"]] for e in trial_claims} == set(range(GROUPS))
    with open_store(queue_spec.backend, queue_spec.target, groups.runs_dir(0)) as q:
        runs = {r.run_id: r for r in q.list_runs()}
        # 0 lost runs, all terminal.
        assert sorted(runs) == sorted(ids)
        assert {r.state for r in runs.values()} <= TERMINAL_STATES
        pubs = q.list_publications()
        for run_id in ids:
            events = q.events(run_id)
            names = [e.event for e in events]
            # Terminal exactly once, with exactly one outbox row, published exactly once.
            assert names.count("completed") == 1, (run_id, names)
            assert names.count("publication_queued") == 1 and names.count("published") == 1, (run_id, names)
            # The audit trail is one unbroken state machine: no transition from a state the run was not in.
            state = None
            for event in events:
                if event.to_state is None:
                    continue
                if event.from_state is not None:
                    assert event.from_state == state, (run_id, [(e.event, e.from_state, e.to_state) for e in events])
                state = event.to_state
            assert state == runs[run_id].state
            # Every trial ended exactly once, and the grading saw each of them exactly once.
            record = runs[run_id]
            rows = q.trials(run_id)
            if record.trials_planned:
                assert [r.idx for r in rows] == list(range(N_TRIALS)) and {r.state for r in rows} == {"DONE"}
                ended = [i for e in events if e.event == "trials_completed" for i in json.loads(e.detail.split("trials=")[1])]
                assert sorted(ended) == sorted(r.idx for r in rows if r.result is not None), (run_id, names)
                assert record.grading is not None and record.grading.counts.total == N_TRIALS
                assert record.grading.counts.completed == sum(r.result is not None for r in rows)
                assert names.count("trials_done") == 1, (run_id, names)  # the run was handed to ONE grader
            else:
                assert rows == [] and record.state == "INFRA_ERROR"  # never planned: its planners all died
        assert len(pubs) == N_RUNS and {p.state for p in pubs} == {"DELIVERED"}
        assert Counter(p.request.run_id for p in pubs) == Counter(ids)
        stats = q.stats()
        assert stats.depth == 0 and stats.in_flight == 0 and stats.outbox_pending == 0
        assert stats.trials_queued == 0 and stats.trials_in_flight == 0
    completed_by_log = Counter(e["run"] for e in entries if e["kind"] == "completed")
    assert all(n == 1 for n in completed_by_log.values())
    deliveries = Counter(e["pub"] for e in entries if e["kind"] == "delivery")
    assert set(deliveries) == {p.id for p in pubs}
    # A row delivered twice is only one whose first deliverer was killed before it could mark it.
    assert sum(n - 1 for n in deliveries.values()) <= len(killed)
    # The kills landed mid-trial: some trials were claimed again after their worker died.
    assert any(attempt > 1 for e in trial_claims for _, attempt in e["trials"]) or len(claims) > N_RUNS, \
        "no kill landed on claimed work: the test did not exercise recovery"
    if queue_spec.backend == "postgresql":
        # The survivors saw the database go away and came back on new connections.
        assert any(e["kind"] == "reconnect" for e in entries)
