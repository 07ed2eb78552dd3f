"""The worker end to end: real engine, real registry, real runner image, real Harbor trials."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
import yaml

from pipeline.core.contracts import (
    DigestsFile,
    DispatchPayload,
    Grading,
    PublicationRequest,
    task_trial_names,
    trial_short_id,
)
from pipeline.core.documents import TaskCounts
from pipeline.core.paths import REPO_ROOT
from pipeline.core.scoring import task_counts
from pipeline.evidence.trials import check_grading
from pipeline.infra.intake.accept import accept_payload
from pipeline.infra.intake.policy import load_policy
from pipeline.infra.queue.sql import RunRecord, SqliteQueue
from pipeline.infra.worker.containers import CONTAINER_PREFIX, LABEL_BATCH
from pipeline.infra.worker.dataset import STAGED
from pipeline.infra.worker.loop import LABEL_RUN, WorkerConfig, run_once
from pipeline.infra.worker.prune import runner_use_records, use_records
from pipeline.runner.envshared import TIMINGS_FILE
from pipeline.runner.plan import discover_tasks
from pipeline.verify.external import cosign_path
from tests.fixtures.datasets import pinned
from tests.fixtures.infra import (
    built_images_source,
    gated_run_step,
    gated_steps_started,
    open_gates,
    sandbox_engine,
    wait_for,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

CANARY = "bs-canary-" + hashlib.sha256(str(os.getpid()).encode()).hexdigest()[:24]
PROBE = Path(__file__).parent / "data" / "secret-probe"


@pytest.fixture(scope="module")
def infra_setup(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile,
                sign_release_images: Any) -> dict[str, Any]:
    """A policy allowing the built images (signed as acme/benchseal's tag.yml at v9.9.9), a suites
    dir (smoke, and smoke + the secret probe), a short lease."""
    root = tmp_path_factory.mktemp("infra-worker")
    runner, api = built_images.images["runner"], built_images.images["api"]
    trust = sign_release_images("acme/benchseal", "v9.9.9", [runner.ref, api.ref])
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data["sources"] = [built_images_source("acme/benchseal", built_images)]
    suites = root / "suites"
    shutil.copytree(REPO_ROOT / "suites" / "smoke", suites / "smoke")
    shutil.copytree(REPO_ROOT / "suites" / "smoke", suites / "probe")
    shutil.copytree(PROBE, suites / "probe" / "secret-probe")
    shutil.copytree(REPO_ROOT / "suites" / "smoke", suites / "twice")
    data["suites"] = {"smoke": {"timeout_seconds": 300, "dataset": pinned(suites, "smoke")},
                      "probe": {"timeout_seconds": 300, "dataset": pinned(suites, "probe")},
                      "twice": {"timeout_seconds": 300, "attempts": 2, "dataset": pinned(suites, "twice")}}
    data["lease_seconds"] = 4
    data["secret_env"] = ["BENCHSEAL_AGENT_API_KEY"]
    policy_path = root / "infra.yaml"
    policy_path.write_text(yaml.safe_dump(data))
    return {"root": root, "policy_path": policy_path, "policy": load_policy(policy_path), "suites": suites,
            "runner": runner.ref, "runner_name": runner.name, "api": api.ref, "trust": trust}


# Run ids derive from correlation ids: unique per session, so two test sessions on one Docker
# Engine never see (or remove) each other's runner containers.
SESSION = uuid.uuid4().hex[:8]


def _payload(setup: dict[str, Any], correlation: str, **overrides: Any) -> dict[str, Any]:
    payload = {
        "schema": "benchseal.dispatch/v1",
        "correlation_id": f"{correlation}-{SESSION}",
        "source": {"repository": "acme/benchseal", "commit": "0123456789abcdef0123456789abcdef01234567", "tag": "v9.9.9"},
        "runner": setup["runner"],
        "api": setup["api"],
        "suite": "smoke",
        "agent": "oracle",
    }
    payload.update(overrides)
    return payload


def _config(setup: dict[str, Any], db: Path) -> WorkerConfig:
    return WorkerConfig(db=db, policy=setup["policy"], suites_dir=setup["suites"], image_trust=setup["trust"])


def _all_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def _parent_pid(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rpartition(")")[2].split()[1]
    except (OSError, IndexError):
        return None


class ArgvScanner(threading.Thread):
    """Scan every /proc/*/cmdline for a needle until stopped."""

    def __init__(self, needle: bytes) -> None:
        super().__init__(daemon=True)
        self.needle, self.hits, self.scans, self.stop = needle, [], 0, threading.Event()
        self.parents: dict[str, str | None] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                        cmdline = handle.read()
                except OSError:
                    continue
                if self.needle in cmdline:
                    self.hits.append((entry.name, cmdline.replace(b"\0", b" ")[:300]))
                    self.parents[entry.name] = _parent_pid(entry.name)
            self.scans += 1


@pytest.fixture(scope="module")
def oracle_probe_run(infra_setup: dict[str, Any]) -> dict[str, Any]:
    """ONE oracle run of smoke + secret probe, scanned for the canary; reused by several tests."""
    db = infra_setup["root"] / "oracle" / "queue.sqlite3"
    accepted = accept_payload(_payload(infra_setup, "oracle-probe-0001", suite="probe"), db=db, policy=infra_setup["policy"])
    seen_states: list[str] = []

    def finalize(record: RunRecord, grading: Grading, run_dir: Path) -> list[PublicationRequest]:
        with SqliteQueue(db) as q:
            seen_states.append(q.get_run(record.run_id).state)
        (run_dir / "artifacts" / "finalized.txt").write_text(grading.status)
        return [PublicationRequest(run_id=record.run_id, target="local", tag="v9.9.9", artifacts_dir=str(run_dir / "artifacts"))]

    scanner = ArgvScanner(CANARY.encode())
    old = os.environ.get("BENCHSEAL_AGENT_API_KEY")
    os.environ["BENCHSEAL_AGENT_API_KEY"] = CANARY
    scanner.start()
    # Control: the scanner does see a canary that IS in an argv.
    # One process that never forks (a shell's forked child carries the shell's argv until it execs).
    control = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)", CANARY])
    try:
        outcome = run_once(_config(infra_setup, db), finalize)
    finally:
        scanner.stop.set()
        scanner.join()
        control.wait()
        if old is None:
            os.environ.pop("BENCHSEAL_AGENT_API_KEY", None)
        else:
            os.environ["BENCHSEAL_AGENT_API_KEY"] = old
    return {"db": db, "run_id": accepted.run_id, "outcome": outcome, "scanner": scanner,
            "control_pid": str(control.pid), "finalize_states": seen_states}


def test_oracle_run_succeeds_with_score_one(oracle_probe_run, infra_setup):
    outcome = oracle_probe_run["outcome"]
    assert outcome is not None and outcome.run_id == oracle_probe_run["run_id"]
    assert outcome.state == "SUCCEEDED", outcome.reason
    grading = outcome.grading
    assert grading.score == 1.0
    assert grading.counts.total == 4 and grading.counts.resolved == 4 and grading.counts.infra_errors == 0
    digest = infra_setup["runner"].partition("@")[2]
    for trial in grading.trials:
        assert trial.runner_digest == digest  # what docker inspect said the container ran
        assert trial.harbor_version == "0.26.0"
        assert trial.agent_name == "oracle" and trial.agent_version
        assert trial.total_seconds and trial.agent_seconds is not None and trial.verifier_seconds is not None
    with SqliteQueue(oracle_probe_run["db"]) as q:
        record = q.get_run(outcome.run_id)
        run_dir = q.run_dir(outcome.run_id)
        assert record.state == "SUCCEEDED" and record.attempts == 1
        pubs = q.list_publications(outcome.run_id)
        assert [p.request.target for p in pubs] == ["local"] and pubs[0].state == "PENDING"
    status = json.loads((run_dir / "run.json").read_text())
    assert status["state"] == "SUCCEEDED" and status["score"] == 1.0
    assert Grading.model_validate_json((run_dir / "grading.json").read_text()) == grading
    # Every trial ran from the staged copy of the dataset the policy pins (issue 36), and the grading says so.
    pinned_digest = infra_setup["policy"].suites["probe"].dataset.digest
    assert grading.dataset_digest == pinned_digest
    assert not (run_dir / STAGED).exists()  # the staged copy went once the run was sealed (worker/prune.py)
    # Evidence in artifacts/, and the finalize hook ran before the terminal transition.
    assert (run_dir / "artifacts" / "evidence" / "harbor").is_dir()
    assert (run_dir / "artifacts" / "evidence" / "grading.json").is_file()
    assert oracle_probe_run["finalize_states"] == ["RUNNING"]
    assert (run_dir / "artifacts" / "finalized.txt").read_text() == "SUCCEEDED"
    # No runner container left behind.
    client = sandbox_engine()
    assert client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={outcome.run_id}"}) == []
    # The runner the run used is named under it in the runner images' records (kept: among the most recent), and
    # the host engine's copy is recorded as there before the worker (built on this host): never the prune's.
    runner_id = docker.from_env().images.get(infra_setup["runner"]).id
    assert runner_id in json.loads((runner_use_records() / outcome.run_id).read_text())
    host_pulls = json.loads((runner_use_records() / ".host").read_text())
    assert host_pulls[runner_id]["present_before"] is True
    assert client.images.get(runner_id).id == runner_id


def test_secret_reaches_agent_but_never_argv_logs_or_artifacts(oracle_probe_run):
    scanner = oracle_probe_run["scanner"]
    control = oracle_probe_run["control_pid"]
    # The control's `sh` forks `sleep`: between fork and exec the child shows the same argv.
    hits = [h for h in scanner.hits if h[0] != control and scanner.parents.get(h[0]) != control]
    assert scanner.scans > 10
    assert any(h[0] == oracle_probe_run["control_pid"] for h in scanner.hits), "scanner failed its control"
    assert hits == [], hits
    with SqliteQueue(oracle_probe_run["db"]) as q:
        run_dir = q.run_dir(oracle_probe_run["run_id"])
    # Delivered: the probe wrote the canary's hash (and saw no network but loopback).
    probe = next((run_dir / "harbor").glob("secret-probe__*"))
    written = next(probe.rglob("secret.sha256")).read_text().strip()
    assert written == hashlib.sha256(CANARY.encode()).hexdigest()
    assert next(probe.rglob("net.txt")).read_text().split() == ["lo"]
    config = json.loads((probe / "config.json").read_text())
    assert config["agent"]["env"] == {"BENCHSEAL_AGENT_API_KEY": "${BENCHSEAL_AGENT_API_KEY}"}
    leaked = [p for p in _all_files(run_dir) if CANARY.encode() in p.read_bytes()]
    leaked += [p for p in _all_files(oracle_probe_run["db"].parent) if p.suffix != "" and CANARY.encode() in p.read_bytes()]
    assert leaked == []


def test_an_oracle_run_with_two_attempts_per_task_runs_and_grades_every_attempt(infra_setup):
    """Issue 26.2: suite ``twice`` (smoke's three tasks, ``attempts: 2``) plans six trials,
    ``<task>__a<k>of2__<short>``; its batches of three (trial_concurrency) name the attempts they run
    (``--attempts 2 --trial ...``: the first holds both attempts of one task and one of the next), and
    the run is graded over all six, as the seal job re-checks it from the evidence."""
    db = infra_setup["root"] / "twice" / "queue.sqlite3"
    accepted = accept_payload(_payload(infra_setup, "oracle-twice-0001", suite="twice"), db=db,
                              policy=infra_setup["policy"])
    started = time.monotonic()
    outcome = run_once(_config(infra_setup, db))
    elapsed = time.monotonic() - started
    assert outcome is not None and outcome.state == "SUCCEEDED", outcome and outcome.reason
    run_id, grading = accepted.run_id, outcome.grading
    tasks = discover_tasks(infra_setup["suites"] / "twice")
    expected = [(task, name) for task in tasks for name in task_trial_names(task, run_id, 2)]
    assert sorted((t.task, t.trial_name) for t in grading.trials) == sorted(expected)
    assert all(name.endswith(f"__{trial_short_id(run_id)}") and "__a" in name for _, name in expected)
    assert grading.counts.model_dump() == {"total": 6, "completed": 6, "resolved": 6, "unresolved": 0,
                                           "infra_errors": 0}
    assert grading.score == 1.0
    with SqliteQueue(db) as q:
        run_dir = q.run_dir(run_id)
    batches = sorted(p for p in (run_dir / "batches").iterdir() if p.is_dir())
    planned = [[t["trial_name"] for t in json.loads((b / "trials.json").read_text())["trials"]] for b in batches]
    # Eight trials (the three scored tasks and the tamper canary, twice each) in batches of three.
    assert [len(names) for names in planned] == [3, 3, 2], planned
    assert sorted(n for names in planned for n in names) == sorted(name for _, name in expected)
    # The seal job's check: the plan and every attempt's result.json in the evidence agree with grading.json.
    _, graded, counts = check_grading(run_dir / "artifacts", grading)
    assert counts == grading.counts and len(graded) == 8 and sum(t.canary for t in graded) == 2
    assert task_counts((t.task, t.grade.outcome) for t in graded if not t.canary) == {
        task: TaskCounts(attempts=2, completed=2, resolved=2) for task in tasks if task != "dedupe-lines"}
    print(f"attempts: 2, {len(tasks)} tasks: run_once took {elapsed:.1f} s")


def test_nop_run_scores_zero(infra_setup):
    db = infra_setup["root"] / "nop" / "queue.sqlite3"
    accept_payload(_payload(infra_setup, "nop-run-000001", agent="nop"), db=db, policy=infra_setup["policy"])
    outcome = run_once(_config(infra_setup, db))
    assert outcome is not None and outcome.state == "SUCCEEDED", outcome and outcome.reason
    assert outcome.grading.score == 0.0
    assert outcome.grading.counts.completed == 3 and outcome.grading.counts.unresolved == 3
    assert all(t.agent_name == "nop" and t.reward == 0.0 for t in outcome.grading.trials)


def test_broken_runner_digest_ends_in_infra_error_without_score(infra_setup):
    db = infra_setup["root"] / "broken" / "queue.sqlite3"
    missing = f"{infra_setup['runner_name']}@sha256:{'0' * 64}"
    accepted = accept_payload(_payload(infra_setup, "broken-runner-01", runner=missing), db=db, policy=infra_setup["policy"])
    states = []
    for _ in range(infra_setup["policy"].max_attempts):
        outcome = run_once(_config(infra_setup, db))
        assert outcome is not None
        states.append(outcome.state)
    assert states == ["QUEUED"] * (infra_setup["policy"].max_attempts - 1) + ["INFRA_ERROR"]
    assert run_once(_config(infra_setup, db)) is None
    with SqliteQueue(db) as q:
        record = q.get_run(accepted.run_id)
        run_dir = q.run_dir(accepted.run_id)
    assert record.state == "INFRA_ERROR" and record.grading is not None and record.grading.score is None
    assert "pull" in (record.reason or "")
    status = json.loads((run_dir / "run.json").read_text())
    assert status["state"] == "INFRA_ERROR" and status["score"] is None


def test_a_dataset_that_differs_from_its_digest_is_refused_with_nothing_run(infra_setup, tmp_path):
    """The policy pins smoke's digest; the suites root holds smoke with one changed byte in a verifier: the
    run ends in INFRA_ERROR naming the dataset rule, no dataset is staged, no batch, no container; and a
    worker does not even start on such a suites root."""
    suites = tmp_path / "suites"
    shutil.copytree(infra_setup["suites"], suites)  # every suite of the policy, smoke then changed
    verifier = suites / "smoke" / "write-answer" / "tests" / "test.sh"
    verifier.write_bytes(verifier.read_bytes().replace(b'exit "$status"', b"exit 0"))  # a verifier that passes anything
    db = infra_setup["root"] / "tampered-dataset" / "queue.sqlite3"
    accepted = accept_payload(_payload(infra_setup, "tampered-dataset-01"), db=db, policy=infra_setup["policy"])
    config = WorkerConfig(db=db, policy=infra_setup["policy"], suites_dir=suites, image_trust=infra_setup["trust"])
    states = [outcome.state for outcome in (run_once(config) for _ in range(infra_setup["policy"].max_attempts))
              if outcome is not None]
    assert states == ["QUEUED"] * (infra_setup["policy"].max_attempts - 1) + ["INFRA_ERROR"]
    with SqliteQueue(db) as q:
        record = q.get_run(accepted.run_id)
        run_dir = q.run_dir(accepted.run_id)
        assert q.trials(accepted.run_id) == []  # nothing was planned
    assert record.grading is not None and record.grading.score is None and record.grading.dataset_digest is None
    assert "suites.smoke.dataset" in (record.reason or "") and "not the pinned" in (record.reason or "")
    assert not (run_dir / STAGED).exists() and not (run_dir / "batches").exists()
    assert _runner_containers(accepted.run_id) == [] and _trial_containers(accepted.run_id) == []
    started = subprocess.run([*_worker_cmd({**infra_setup, "suites": suites}, db)], capture_output=True, text=True,
                             timeout=120, check=False)
    assert started.returncode == 1 and "suites.smoke.dataset" in started.stderr, started.stderr
    assert len([line for line in started.stderr.splitlines() if "suites.smoke.dataset" in line]) == 1


def _worker_cmd(setup: dict[str, Any], db: Path, *extra: str) -> list[str]:
    trust = setup["trust"]
    return [sys.executable, "-m", "pipeline", "worker", "--once", "--db", str(db), "--policy", str(setup["policy_path"]),
            "--suites-dir", str(setup["suites"]), "--sigstore-url", str(trust.fulcio_url),
            "--trusted-root", str(trust.trusted_root), *extra]


def _containers(filters: dict[str, Any]) -> list[Any]:
    # The SDK inspects each listed container: one removed in between raises NotFound. List again.
    for _ in range(10):
        try:
            return sandbox_engine().containers.list(all=True, filters=filters)
        except docker.errors.NotFound:
            time.sleep(0.1)
    return sandbox_engine().containers.list(all=True, filters=filters)


def _runner_containers(run_id: str) -> list[Any]:
    # The engine proxy gives the run's and the batch's labels to every container a runner creates too: the
    # runners are the worker's own, named for the run.
    return [c for c in _containers({"label": [f"{LABEL_RUN}={run_id}", LABEL_BATCH]})
            if c.name.startswith(CONTAINER_PREFIX)]


def _trial_containers(run_id: str) -> list[Any]:
    short = run_id[-12:]
    return [c for c in _containers({"label": "com.docker.compose.project"})
            if short in c.labels.get("com.docker.compose.project", "")]


def _remove_containers(run_id: str) -> None:
    """After a failed test: this run's containers only (a blocked trial would run on)."""
    for container in [*_runner_containers(run_id), *_trial_containers(run_id)]:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass


def test_kill_9_mid_trial_then_restart_finishes_once(infra_setup):
    db = infra_setup["root"] / "kill9" / "queue.sqlite3"
    accepted = accept_payload(_payload(infra_setup, "kill-nine-000001"), db=db, policy=infra_setup["policy"])
    run_id = accepted.run_id
    worker = subprocess.Popen(_worker_cmd(infra_setup, db), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # Mid-trial: the runner container of the first batch exists and Harbor has planned its trials.
        wait_for(lambda: bool(_runner_containers(run_id)) and any((db.parent / "runs" / run_id).glob("batches/*/trials.json")),
                  "the runner container to start trials")
        wait_for(lambda: bool(_trial_containers(run_id)), "a trial container")
        # While it runs: the runner was started by the id the host engine pulled its digest as (the
        # sandbox has images by id only), and nothing in the run has a network.
        runner_container = _runner_containers(run_id)[0]
        assert runner_container.attrs["Image"] == docker.from_env().images.get(infra_setup["runner"]).id
        assert runner_container.attrs["HostConfig"]["NetworkMode"] == "none"
        for container in _trial_containers(run_id):
            assert container.attrs["HostConfig"]["NetworkMode"] == "none", container.name
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    with SqliteQueue(db) as q:
        assert q.get_run(run_id).state == "RUNNING"  # planned; its claimed trials are stuck until their lease expires
        held = [t.idx for t in q.trials(run_id) if t.state == "RUNNING"]
        assert held

    def requeued() -> bool:
        with SqliteQueue(db) as q:
            q.requeue_expired()
            return all(t.state == "QUEUED" for t in q.trials(run_id) if t.idx in held)

    wait_for(requeued, "the trial lease to expire", limit=60)
    restarted = subprocess.run(_worker_cmd(infra_setup, db), capture_output=True, text=True, timeout=300, check=False)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    with SqliteQueue(db) as q:
        runs = q.list_runs()
        record = q.get_run(run_id)
        events = [e.event for e in q.events(run_id)]
    assert [r.run_id for r in runs] == [run_id]  # not duplicated
    assert record.state == "SUCCEEDED" and record.attempts == 1 and record.grading and record.grading.score == 1.0
    with SqliteQueue(db) as q:
        trials = q.trials(run_id)
    # Every trial graded exactly once; the killed batch's trials ran a second time.
    # (The tamper canary is graded once too, and never counted.)
    assert record.grading.counts.total + 1 == len(trials) == record.trials_planned and {t.state for t in trials} == {"DONE"}
    assert all(t.attempts == 2 for t in trials if t.idx in held)
    assert events.count("claimed") == 1 and "trials_lease_expired" in events and events.count("completed") == 1
    assert events.count("trials_done") == 1
    assert _runner_containers(run_id) == []  # the orphan of attempt 1 was removed
    assert _trial_containers(run_id) == []


def _blocking_setup(infra_setup: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """infra_setup with one more suite, ``blocking``: its task blocks until the run is stopped,
    so a test can act while the run is certainly in progress, however fast the machine."""
    suites = tmp_path / "suites"
    shutil.copytree(infra_setup["suites"], suites)
    shutil.copytree(Path(__file__).parent / "data" / "blocking", suites / "blocking" / "blocking")
    data = yaml.safe_load(infra_setup["policy_path"].read_text())
    data["suites"]["blocking"] = {"timeout_seconds": 600, "dataset": pinned(suites, "blocking")}
    policy_path = tmp_path / "blocking.yaml"
    policy_path.write_text(yaml.safe_dump(data))
    return {**infra_setup, "suites": suites, "policy_path": policy_path, "policy": load_policy(policy_path)}


def test_sigterm_releases_the_lease(infra_setup, tmp_path):
    setup = _blocking_setup(infra_setup, tmp_path)
    db = infra_setup["root"] / "sigterm" / "queue.sqlite3"
    accepted = accept_payload(_payload(setup, f"sigterm-run-{SESSION}", suite="blocking"), db=db,
                              policy=setup["policy"])
    worker = subprocess.Popen(_worker_cmd(setup, db, "--term-grace", "0"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # The trial blocks until stopped: SIGTERM certainly arrives mid-run.
        wait_for(lambda: bool(_trial_containers(accepted.run_id)), "the blocked trial container")
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=30)
            _remove_containers(accepted.run_id)
    assert worker.returncode == 0, out
    with SqliteQueue(db) as q:
        record = q.get_run(accepted.run_id)
        events = [e.event for e in q.events(accepted.run_id)]
    assert record.state == "RUNNING" and record.attempts == 1 and record.lease_token is None  # planned once
    with SqliteQueue(db) as q:
        trials = q.trials(accepted.run_id)
    # The batch was given back: its trials are queued again, no attempt used.
    assert {(t.state, t.attempts) for t in trials} == {("QUEUED", 0)}
    assert events[-1] == "trials_released"
    assert _runner_containers(accepted.run_id) == []


def test_suite_timeout_kills_runner_and_trial_containers(infra_setup, tmp_path):
    """A task that blocks until told (never, here): the run can only end by the suite timeout,
    on any machine; the test sees the blocked trial container before the timeout fires."""
    from pipeline.infra.intake.policy import DatasetPolicy, SuitePolicy

    suites = tmp_path / "suites"
    shutil.copytree(Path(__file__).parent / "data" / "blocking", suites / "blocking" / "blocking")
    dataset = DatasetPolicy.model_validate(pinned(suites, "blocking"))
    policy = infra_setup["policy"].model_copy(update={"suites": {"blocking": SuitePolicy(timeout_seconds=45,
                                                                                      dataset=dataset)}})
    db = infra_setup["root"] / "timeout" / "queue.sqlite3"
    accepted = accept_payload(_payload(infra_setup, f"timeout-run-{SESSION}", suite="blocking"), db=db, policy=policy)
    outcome: list[Any] = []
    worker = threading.Thread(target=lambda: outcome.append(
        run_once(WorkerConfig(db=db, policy=policy, suites_dir=suites, image_trust=infra_setup["trust"]))), daemon=True)
    worker.start()
    wait_for(lambda: bool(_trial_containers(accepted.run_id)) or not worker.is_alive(), "the blocked trial container")
    assert _trial_containers(accepted.run_id), "the run ended before its trial started: raise timeout_seconds"
    worker.join(timeout=300)
    assert not worker.is_alive()
    (result,) = outcome
    assert result is not None and result.state == "FAILED"
    assert result.grading is not None and result.grading.score is None
    assert "timed out" in (result.reason or "")
    assert _runner_containers(accepted.run_id) == []
    assert _trial_containers(accepted.run_id) == []
    with SqliteQueue(db) as q:
        run_dir = q.run_dir(accepted.run_id)
    # Evidence kept on failure too (each batch's runner log).
    assert list((run_dir / "artifacts" / "evidence" / "batches").glob("*/logs/runner.log"))


def test_worker_loop_with_concurrency_drains_the_queue_and_stops_on_sigterm(infra_setup, tmp_path):
    data = yaml.safe_load(infra_setup["policy_path"].read_text())
    data["max_attempts"] = 1
    policy_path = tmp_path / "one-attempt.yaml"
    policy_path.write_text(yaml.safe_dump(data))
    policy = load_policy(policy_path)
    db = tmp_path / "loop" / "queue.sqlite3"
    missing = f"{infra_setup['runner_name']}@sha256:{'0' * 64}"
    ids = [accept_payload(_payload(infra_setup, f"loop-run-{i:06d}", runner=missing), db=db, policy=policy).run_id
           for i in range(4)]
    cmd = [sys.executable, "-m", "pipeline", "worker", "--concurrency", "2", "--db", str(db), "--policy", str(policy_path),
           "--suites-dir", str(infra_setup["suites"])]
    worker = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def drained() -> bool:
            with SqliteQueue(db) as q:
                return all(q.get_run(i).state == "INFRA_ERROR" for i in ids)

        wait_for(drained, "the queue to drain")
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, out
    with SqliteQueue(db) as q:
        assert all(q.get_run(i).attempts == 1 for i in ids)
        claimers = {next(e.detail for e in q.events(i) if e.event == "claimed") for i in ids}
    assert len(claimers) == 1  # one worker process (two threads), each run claimed exactly once


def _trial_dirs(run_dir: Path) -> list[Path]:
    return sorted(p for p in (run_dir / "harbor").iterdir() if (p / "result.json").is_file())


def test_trials_use_prebuilt_images_run_concurrently_and_tear_down(oracle_probe_run, infra_setup):
    """No compose build at trial time, every environment stopped before the runner exited, trials overlapped."""
    from datetime import datetime

    run_id = oracle_probe_run["run_id"]
    with SqliteQueue(oracle_probe_run["db"]) as q:
        run_dir = q.run_dir(run_id)
    client = sandbox_engine()
    # The run's staged copies went when it was sealed (pipeline.infra.worker.prune); its batches recorded the
    # task images they used by id: smoke's four (the tamper canary too) and the secret probe, each one built.
    assert list(run_dir.glob("batches/*/suite")) == [] and not (run_dir / "dataset").exists()
    used = json.loads((use_records() / run_id).read_text())
    assert len(used) == 5
    for image_id in used:
        assert "benchseal.task.hash" in client.images.get(image_id).labels
    trials = _trial_dirs(run_dir)
    assert len(trials) == 5
    for trial in trials:
        ops = [json.loads(line) for line in (trial / TIMINGS_FILE).read_text().splitlines()]
        names = [o["op"] for o in ops]
        assert "build" not in names and "compose build" not in names, trial.name
        # Agent environment and separate verifier environment: each started and torn down.
        assert names.count("start") == 2 and names.count("stop") == 2, names
    # This run's trial containers only (labelled by project as compose would; other sessions on the shared
    # engine may run the same test).
    listed = client.containers.list(all=True, sparse=True, filters={"label": "com.docker.compose.project"})
    mine = [c for c in listed
            if (c.attrs.get("Labels") or {}).get("com.docker.compose.project.working_dir", "").startswith(str(run_dir))]
    assert mine == []
    for state_file in run_dir.glob("batches/*/logs/runner-state.json"):
        state = json.loads(state_file.read_text())
        assert state["ExitCode"] == 0 and state["StartedAt"] and state["FinishedAt"]

    def ts(value: str) -> datetime:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))

    results = [json.loads((t / "result.json").read_text()) for t in trials]
    concurrency = infra_setup["policy"].trial_concurrency("probe")
    starts = sorted(ts(r["started_at"]) for r in results)
    # The first `concurrency` trials all started before any trial finished: one runner, concurrent trials.
    assert starts[concurrency - 1] < min(ts(r["finished_at"]) for r in results)


def test_prebuilt_task_images_are_reused_and_pinned_by_id(infra_setup, tmp_path):
    from pipeline.core.digests import parse_ref
    from pipeline.infra.worker.loop import TASK_IMAGE_LABEL, prebuild_task_images, render_suite, resolve_base_ref

    client = docker.from_env()
    base = resolve_base_ref(WorkerConfig(), parse_ref(infra_setup["runner"]))
    first, second = tmp_path / "one", tmp_path / "two"
    render_suite(infra_setup["suites"] / "smoke", first, base)
    render_suite(infra_setup["suites"] / "smoke", second, base)
    # A task that names its own image is left alone.
    own = first / "write-answer" / "task.toml"
    own.write_text(own.read_text().replace("[environment]\n", '[environment]\ndocker_image = "example.invalid/x@sha256:' + "1" * 64 + '"\n'))
    records = tmp_path / "records"  # the worker's own record of what it built (not found by label)
    pinned = prebuild_task_images(client, first, records)
    assert set(pinned) == {"cli-flag", "dedupe-lines", "fix-mean"}
    again = prebuild_task_images(client, second, records)
    assert {k: again[k] for k in pinned} == pinned  # the worker's own record, not rebuilt
    # (Not the set of labelled images: other sessions on this engine build task images of their own.)
    assert all(TASK_IMAGE_LABEL in client.images.get(image).labels for image in pinned.values())
    assert "example.invalid/x@sha256:" in own.read_text()
    # A rendered task.toml that is already pinned keeps its pin.
    assert prebuild_task_images(client, second, records) == {}
    # Changed content: another image.
    third = tmp_path / "three"
    render_suite(infra_setup["suites"] / "smoke", third, base)
    (third / "fix-mean" / "environment" / "stats.py").write_text("def mean(xs):\n    return 0\n")
    changed = prebuild_task_images(client, third, records)
    assert changed["fix-mean"] != pinned["fix-mean"] and changed["cli-flag"] == pinned["cli-flag"]
    # A symlink in the build context is refused (it could point outside the task).
    fourth = tmp_path / "four"
    render_suite(infra_setup["suites"] / "smoke", fourth, base)
    (fourth / "cli-flag" / "environment" / "link").symlink_to("/etc/passwd")
    from pipeline.core.errors import CheckFailed

    with pytest.raises(CheckFailed, match="symlink"):
        prebuild_task_images(client, fourth, records)


def _finished_tasks(run_dir: Path) -> set[str]:
    """The tasks of a run whose trials Harbor has finished (result.json with finished_at), as the runner writes them."""
    done: set[str] = set()
    for result in run_dir.glob("batches/*/harbor/*/result.json"):
        try:
            data = json.loads(result.read_text())
        except (OSError, ValueError):
            continue  # being written
        if isinstance(data, dict) and data.get("finished_at"):
            done.add(result.parent.name.partition("__")[0])
    return done


def test_trials_of_ready_tasks_run_while_another_task_image_builds(infra_setup, tmp_path):
    """Issue 36.5: a batch's missing task images build off the critical path. One task's build waits for a file
    only this test writes, and the test writes it only once every other task's trial has finished: with the
    builds before the first trial, none of them could finish and the test fails at its wait. The gated task's
    trial starts only once its image is built and pinned, and the run is graded whole."""
    token = uuid.uuid4().hex[:12]  # this test's own build: the engine is shared, and a new context is built
    suites = tmp_path / "suites"
    shutil.copytree(infra_setup["suites"] / "smoke", suites / "gated")
    dockerfile = suites / "gated" / "fix-mean" / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + gated_run_step(token))
    data = yaml.safe_load(infra_setup["policy_path"].read_text())
    # One batch of all four tasks, three at a time: the three ready tasks' trials can all end while the gate holds.
    data["suites"]["gated"] = {"timeout_seconds": 600, "dataset": pinned(suites, "gated"), "trial_concurrency": 3,
                               "trial_batch": 4}
    policy_path = tmp_path / "gated.yaml"
    policy_path.write_text(yaml.safe_dump(data))
    setup = {**infra_setup, "suites": suites, "policy_path": policy_path, "policy": load_policy(policy_path)}
    db = tmp_path / "queue.sqlite3"
    accepted = accept_payload(_payload(setup, f"gated-run-{SESSION}", suite="gated"), db=db, policy=setup["policy"])
    with SqliteQueue(db) as q:
        run_dir = q.run_dir(accepted.run_id)
    others = set(discover_tasks(suites / "gated")) - {"fix-mean"}
    engine = sandbox_engine()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["result"] = run_once(_config(setup, db))
        except Exception as exc:
            outcome["error"] = exc

    since = int(time.time()) - 1
    worker = threading.Thread(target=work)
    worker.start()
    gates: dict[str, str] = {}
    try:
        gates = gated_steps_started(engine, since, [token])
        assert gates, ("the gated build never started", outcome)
        wait_for(lambda: others <= _finished_tasks(run_dir) or not worker.is_alive(),
                 "every other task's trial to finish while fix-mean's image builds", limit=300)
        assert others <= _finished_tasks(run_dir), outcome
        # The gated task's trial has not started: its image is not built, so the worker has not marked it ready.
        assert not list(run_dir.glob("batches/*/harbor/fix-mean__*")), "fix-mean's trial started before its image"
        assert not list(run_dir.glob("batches/*/ready/fix-mean"))
    finally:
        open_gates(engine, gates)
        worker.join(timeout=600)
    assert not worker.is_alive() and "error" not in outcome, outcome
    result = outcome["result"]
    assert result.state == "SUCCEEDED", result.reason
    assert result.grading.counts.total == 3 and result.grading.counts.resolved == 3  # dedupe-lines is a canary
    assert {t.task for t in result.grading.trials} == {*others, "fix-mean"}
    assert _runner_containers(accepted.run_id) == [] and _trial_containers(accepted.run_id) == []


def test_sweep_removes_the_runner_container_of_a_batch_that_lost_its_lease_only(infra_setup, tmp_path):
    """A worker killed with -9 leaves its batch's runner container running; once the batch holds no
    lease any more, the next worker on that engine removes it, and never a live batch's container."""
    from pipeline.core.digests import parse_ref
    from pipeline.infra.queue.sql import PlannedTrial, batch_label
    from pipeline.infra.worker.loop import LABEL_BATCH, LABEL_TRIALS, pull_by_digest, sweep_orphan_batches

    client = docker.from_env()
    pull_by_digest(client, parse_ref(infra_setup["runner"]))
    db = tmp_path / "sweep" / "queue.sqlite3"
    with SqliteQueue(db) as q:
        run_id, _ = q.enqueue(DispatchPayload.model_validate(_payload(infra_setup, f"sweep-run-{SESSION}")), max_attempts=2)
        claim = q.claim("planner", 60)
        assert claim is not None and claim.lease_token
        names = [f"t{i}__{run_id[-12:]}" for i in range(2)]
        q.plan_trials(run_id, claim.lease_token, [PlannedTrial(task=f"t{i}", trial_name=n) for i, n in enumerate(names)],
                      max_attempts=2)
        dead, live = q.claim_trials("dead-worker", 60, 1), q.claim_trials("live-worker", 60, 1)
        assert dead is not None and live is not None
        containers = {}
        for batch in (dead, live):
            containers[batch.lease_token] = client.containers.run(
                infra_setup["runner"], entrypoint=["sleep", "300"], network_mode="none", detach=True,
                labels={LABEL_RUN: run_id, LABEL_TRIALS: batch.trials[0].trial_name,
                        LABEL_BATCH: batch_label(batch.lease_token)})
        try:
            assert sweep_orphan_batches(client, q) == []  # both batches hold their leases
            with SqliteQueue(tmp_path / "other" / "queue.sqlite3") as other:
                assert sweep_orphan_batches(client, other) == []  # another queue's runs are not its to judge
            q.release_trials(run_id, dead.lease_token, "its worker is gone")
            assert sweep_orphan_batches(client, q) == [containers[dead.lease_token].name]
            left = {c.name for c in client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})}
            assert left == {containers[live.lease_token].name}
            # The label names the batch by a hash of its lease token, never the token itself.
            labels = client.containers.get(containers[live.lease_token].id).labels
            assert live.lease_token not in json.dumps(labels)
        finally:
            for container in containers.values():
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass


@pytest.mark.docker
@pytest.mark.slow
def test_two_hosts_on_one_postgresql_queue_split_a_run_and_its_evidence_holds_every_trial_dir(
        infra_setup, pg_cluster, tmp_path):
    """Two workers with their own state dirs (two hosts' run dirs) share one PostgreSQL queue: the
    run's trials spread over both, and the host that grades it publishes every trial's Harbor dir,
    the other host's unpacked from the queue."""
    from pipeline.infra.queue.postgres import PostgresQueue

    url = pg_cluster.new_database()
    url_file = tmp_path / "queue-url"
    url_file.write_text(url + "\n")
    url_file.chmod(0o600)
    with PostgresQueue(url) as q:
        run_id, _ = q.enqueue(DispatchPayload.model_validate(_payload(infra_setup, "two-hosts-0001")), max_attempts=2)
    setup = infra_setup
    cmd = [sys.executable, "-m", "pipeline", "worker", "--once", "--trial-batch", "1", "--queue-url-file", str(url_file),
           "--policy", str(setup["policy_path"]), "--suites-dir", str(setup["suites"]),
           "--sigstore-url", str(setup["trust"].fulcio_url), "--trusted-root", str(setup["trust"].trusted_root)]
    hosts = {name: tmp_path / name for name in ("host-a", "host-b")}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCHSEAL_QUEUE_URL")}
    cosign = cosign_path()  # the tools this machine's state dir holds; the hosts' state dirs are new
    assert cosign is not None
    env["PATH"] = f"{cosign.parent}{os.pathsep}{env.get('PATH', '')}"

    def spawn(name: str) -> None:
        log = (tmp_path / f"{name}.log").open("wb")
        procs[name] = subprocess.Popen(cmd, env={**env, "BENCHSEAL_HOME": str(hosts[name])}, stdout=log,
                                       stderr=subprocess.STDOUT)

    def planned() -> bool:
        with PostgresQueue(url) as q:
            return q.get_run(run_id).trials_planned > 0

    try:
        spawn("host-a")
        wait_for(planned, "host-a to plan the run", limit=240)
        spawn("host-b")  # the other trials are QUEUED while host-a runs its first batch
        for name, proc in procs.items():
            assert proc.wait(timeout=600) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    with PostgresQueue(url) as q:
        record, rows = q.get_run(run_id), q.trials(run_id)
    # Every scored trial resolved; the tamper canary (one of the rows) is graded but never counted.
    assert record.state == "SUCCEEDED" and record.grading is not None and record.grading.counts.resolved == len(rows) - 1
    ran_by = {row.trial_name: json.loads(row.result or "{}")["batch_dir"] for row in rows}
    by_host = {name: [t for t, batch in ran_by.items() if batch.startswith(str(home))] for name, home in hosts.items()}
    assert all(by_host.values()), f"both hosts ran trials: {by_host}"
    graders = [name for name, home in hosts.items() if (home / "infra" / "runs" / run_id / "grading.json").is_file()]
    assert len(graders) == 1
    grader, other = graders[0], next(name for name in hosts if name != graders[0])
    run_dir = hosts[grader] / "infra" / "runs" / run_id
    evidence = run_dir / "artifacts" / "evidence" / "harbor"
    assert sorted(p.name for p in evidence.iterdir()) == sorted(ran_by)
    for trial_name in ran_by:
        result = json.loads((evidence / trial_name / "result.json").read_text())
        # The oracle resolves every scored task; the tamper canary, never.
        assert result["verifier_result"]["rewards"]["reward"] == (0 if trial_name.startswith("dedupe-lines") else 1)
    for trial_name in by_host[other]:  # unpacked from the queue, with where it came from
        origin = json.loads((run_dir / "harbor-origin" / f"{trial_name}.json").read_text())
        assert origin["batch_dir"].startswith(str(hosts[other]))
    # The other host's own copy of its trial dirs stays where it ran them.
    assert all((hosts[other] / "infra" / "runs" / run_id / "harbor" / t).is_dir() for t in by_host[other])
