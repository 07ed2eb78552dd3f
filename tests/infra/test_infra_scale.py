"""Scale past one host (issue 36.7, docs/scale.md): ONE release's trials split across TWO worker processes on
one PostgreSQL queue, through the real worker path (claims, the runner image by digest and signature, the
dataset staged by its digest on each host, Harbor trials in the sandbox engine, grading, one hand-over).

Each worker is a host of its own: its own state dir (run dirs) and its own copy of the suites root, pinned by
the policy's content digest. The run names a subset of a HumanEval dataset (4 of the 6 imported tasks, issue
36.4): only those are planned, each trial records the worker that ran it, exactly one worker grades the run
(summary.json and the test-result statement name both), and a run naming a task the dataset lacks is refused in
one line with nothing planned."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.contracts import DigestsFile, DispatchPayload
from pipeline.core.documents import ResultStatement
from pipeline.core.paths import REPO_ROOT
from pipeline.datasets import humaneval
from pipeline.evidence.artifacts import build_summary
from pipeline.infra.intake.accept import validate_payload
from pipeline.infra.intake.policy import load_policy
from pipeline.infra.queue.postgres import PostgresQueue
from pipeline.infra.worker.grading import RecordedTrial
from pipeline.verify.external import cosign_path
from tests.fixtures.infra import built_images_source, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

IMPORTED = "HumanEval/0,HumanEval/2,HumanEval/4,HumanEval/7,HumanEval/12,HumanEval/32"
SUBSET = ["humaneval-32", "humaneval-0", "humaneval-7", "humaneval-4"]  # any order: the payload sorts it
SESSION = uuid.uuid4().hex[:8]
HOSTS = ("host-a", "host-b")


@pytest.fixture(scope="module")
def scale_setup(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile,
                sign_release_images: Any) -> dict[str, Any]:
    """A policy with a HumanEval suite pinned by digest (the test's own: it needs no shipped suite), and one
    copy of the suites root per host."""
    root = tmp_path_factory.mktemp("scale")
    runner, api = built_images.images["runner"], built_images.images["api"]
    trust = sign_release_images("acme/benchseal", "v9.9.9", [runner.ref, api.ref])
    count, digest = humaneval.import_humaneval(root / "dataset", IMPORTED)
    assert count == 6
    suites = {}
    for host in HOSTS:  # each host holds its own copy; the digest in the policy is what makes them one dataset
        suites[host] = root / host / "suites"
        shutil.copytree(root / "dataset", suites[host] / "humaneval-six")
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data["sources"] = [built_images_source("acme/benchseal", built_images)]
    data["suites"] = {"humaneval": {"timeout_seconds": 300, "trial_concurrency": 2,
                                    "dataset": {"path": "humaneval-six", "digest": digest}}}
    data["lease_seconds"] = 20
    policy_path = root / "infra.yaml"
    policy_path.write_text(yaml.safe_dump(data))
    return {"root": root, "policy_path": policy_path, "policy": load_policy(policy_path), "suites": suites,
            "digest": digest, "runner": runner.ref, "api": api.ref, "trust": trust}


def _payload(setup: dict[str, Any], correlation: str, tasks: list[str]) -> DispatchPayload:
    return validate_payload({
        "schema": "benchseal.dispatch/v1", "correlation_id": f"{correlation}-{SESSION}",
        "source": {"repository": "acme/benchseal", "commit": "0123456789abcdef0123456789abcdef01234567", "tag": "v9.9.9"},
        "runner": setup["runner"], "api": setup["api"], "suite": "humaneval", "agent": "oracle", "tasks": tasks,
    }, setup["policy"])


def test_two_workers_split_one_humaneval_subset_run_and_one_of_them_grades_it(
        scale_setup: dict[str, Any], pg_cluster: Any, tmp_path: Path) -> None:
    setup = scale_setup
    url = pg_cluster.new_database()
    url_file = tmp_path / "queue-url"
    url_file.write_text(url + "\n")
    url_file.chmod(0o600)
    with PostgresQueue(url) as q:
        run_id, _ = q.enqueue(_payload(setup, "scale-subset", SUBSET), max_attempts=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCHSEAL_QUEUE_URL")}
    cosign = cosign_path()  # the tools this machine's state dir holds; the hosts' state dirs are new
    assert cosign is not None
    env["PATH"] = f"{cosign.parent}{os.pathsep}{env.get('PATH', '')}"
    homes = {host: tmp_path / host / "home" for host in HOSTS}
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def terminal(run: str) -> bool:
        with PostgresQueue(url) as q:
            return q.get_run(run).state in ("SUCCEEDED", "FAILED", "INFRA_ERROR")

    def logs() -> str:
        return "\n".join(f"== {h}\n" + (tmp_path / f"{h}.log").read_text()[-3000:] for h in procs)

    try:
        # Both loops start at once: one plans the run and claims its first batch (2 trials) in the same
        # transaction; the other, polling, claims the other batch while the first runs.
        for host in HOSTS:
            log = (tmp_path / f"{host}.log").open("wb")
            procs[host] = subprocess.Popen(
                [sys.executable, "-m", "pipeline", "worker", "--trial-batch", "2", "--queue-url-file", str(url_file),
                 "--policy", str(setup["policy_path"]), "--suites-dir", str(setup["suites"][host]),
                 "--sigstore-url", str(setup["trust"].fulcio_url), "--trusted-root", str(setup["trust"].trusted_root)],
                env={**env, "BENCHSEAL_HOME": str(homes[host])}, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: terminal(run_id), "the run to end", limit=600)
        # A run naming a task the dataset lacks: refused at planning, in one line, nothing planned or run.
        with PostgresQueue(url) as q:
            refused_id, _ = q.enqueue(_payload(setup, "scale-unknown", ["humaneval-0", "humaneval-999"]),
                                      max_attempts=2)
        wait_for(lambda: terminal(refused_id), "the refused run to end", limit=300)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert all(proc.returncode == 0 for proc in procs.values()), logs()

    with PostgresQueue(url) as q:
        record, rows, events = q.get_run(run_id), q.trials(run_id), q.events(run_id)
        refused = q.get_run(refused_id)
        refused_rows = q.trials(refused_id)
    assert record.state == "SUCCEEDED" and record.grading is not None, (record.reason, logs())
    grading = record.grading
    # Only the subset was planned and graded; the grading names it and the dataset digest every trial ran from.
    assert sorted(row.task for row in rows) == sorted(SUBSET)
    assert grading.subset == tuple(sorted(SUBSET)) and grading.dataset_digest == setup["digest"]
    assert (grading.counts.total, grading.counts.resolved, grading.score) == (4, 4, 1.0)
    # Which worker ran which trial: each recorded trial names its worker (hostname-pid) and its host's batch dir.
    workers = {host: f"{socket.gethostname()}-{proc.pid}" for host, proc in procs.items()}
    ran = {}
    for row in rows:
        recorded = RecordedTrial.model_validate_json(row.result or "{}")
        host = next(h for h, w in workers.items() if recorded.worker == w)
        assert recorded.batch_dir.startswith(str(homes[host])) and recorded.dataset_digest == setup["digest"]
        ran[row.trial_name] = host
    assert set(ran.values()) == set(HOSTS), f"both workers ran trials: {ran}"
    claimed = [e.detail or "" for e in events if e.event == "trials_claimed"]
    assert {w for w in workers.values() if any(f"worker={w} " in d for d in claimed)} == set(workers.values())
    # One seal: exactly one worker graded the run (its host's run dir holds grading.json and every trial's dir,
    # the other host's unpacked from the queue with the worker that ran it).
    graders = [h for h in HOSTS if (homes[h] / "infra" / "runs" / run_id / "grading.json").is_file()]
    assert len(graders) == 1 and [e.event for e in events].count("completed") == 1
    run_dir = homes[graders[0]] / "infra" / "runs" / run_id
    # The signed evidence names them: summary.json (each trial's worker, the grader) and the test-result statement
    # derived from it, as the seal builds both from this grading.
    summary = build_summary(grading, record.payload)
    assert {t.trial: t.worker for t in summary.timings.trials} == {trial: workers[h] for trial, h in ran.items()}
    assert grading.graded_by == summary.graded_by == workers[graders[0]]
    score = ResultStatement.for_summary(summary, "0" * 64).predicate.score
    assert score.workers == tuple(sorted(workers.values())) and score.graded_by == workers[graders[0]]
    assert sorted(p.name for p in (run_dir / "harbor").iterdir()) == sorted(ran)
    for trial, host in ran.items():
        if host != graders[0]:
            origin = json.loads((run_dir / "harbor-origin" / f"{trial}.json").read_text())
            assert origin["worker"] == workers[host]
    # The unknown task is named in the one-line reason; nothing of that run was planned.
    assert refused.state == "FAILED" and refused_rows == [] and refused.trials_planned == 0
    assert refused.reason is not None and "\n" not in refused.reason
    assert "payload.tasks" in refused.reason and "'humaneval-999'" in refused.reason, refused.reason
