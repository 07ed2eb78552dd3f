"""A worker killed with -9 on the FINAL attempt: the run still ends exactly once, graded from the
trials that completed, unscored, with its evidence and its outbox row (issue 9.5).

Two levels: a fast one (a real worker process claims the final attempt of a run whose trial
results are on disk and is killed with -9; no Harbor), and the real one (a `benchseal worker`
running Harbor trials in the runner container is killed with -9 mid-suite)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.contracts import DigestsFile, DispatchPayload, Grading, PublicationRequest
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.accept import accept_payload
from pipeline.infra.intake.policy import load_policy
from pipeline.infra.queue.sql import RunRecord, SqliteQueue
from pipeline.infra.worker.loop import LABEL_RUN, WorkerConfig, _run_once, exhausted_grading, run_once
from pipeline.runner.plan import TRIALS_FILE, plan_trials
from tests.fixtures.datasets import pinned
from tests.fixtures.infra import built_images_source, sandbox_engine, wait_for
from tests.fixtures.trials import grader_rewards

REAL_RESULT = json.loads((Path(__file__).parent / "data" / "harbor-result.json").read_text())


def _result(reward: float) -> dict[str, Any]:
    data = json.loads(json.dumps(REAL_RESULT))
    data["verifier_result"] = {"rewards": grader_rewards(reward)}
    data["exception_info"] = None
    return data


class Recorder:
    """A finalizer that records what it was given and asks for one local publication."""

    def __init__(self, db: Path) -> None:
        self.db, self.calls = db, []

    def __call__(self, record: RunRecord, grading: Grading, run_dir: Path) -> list[PublicationRequest]:
        with SqliteQueue(self.db) as q:
            state = q.get_run(record.run_id).state
        self.calls.append((state, grading))
        (run_dir / "artifacts").mkdir(parents=True, exist_ok=True)
        (run_dir / "artifacts" / "finalized.txt").write_text(grading.status)
        return [PublicationRequest(run_id=record.run_id, target="local", tag=record.payload.source.tag,
                                   artifacts_dir=str(run_dir / "artifacts"))]


_DEAD_WORKER = """
import sys, time
from pathlib import Path
from pipeline.infra.queue.sql import SqliteQueue
with SqliteQueue(Path(sys.argv[1])) as q:
    record = q.claim("doomed-worker", 2)
    q.start(record.run_id, record.lease_token)
    print(record.run_id, record.attempts, flush=True)
    time.sleep(600)
"""


def _policy(tmp_path: Path, **overrides: Any):
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data.update(overrides)
    path = tmp_path / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, load_policy(path)


def _write_plan(run_dir, run_id, specs) -> None:
    """trials.json as the runner writes it (pipeline.core.documents.TrialsPlan)."""
    (run_dir / TRIALS_FILE).write_text(json.dumps({
        "schema": "benchseal.trials/v1", "run_id": run_id, "agent": "oracle", "agent_version": None,
        "harbor_version": "0.26.0", "model": None, "trials": [{"task": s.task, "trial_name": s.trial_name} for s in specs]}))


def test_exhausted_grading_grades_what_completed_without_a_score(tmp_path, make_payload, infra_policy):
    with SqliteQueue(tmp_path / "q.sqlite3") as q:
        run_id, _ = q.enqueue(DispatchPayload.model_validate(make_payload()), max_attempts=1)
        record, run_dir = q.get_run(run_id), q.run_dir(run_id)
    from pipeline.infra.worker.grading import RunnerInfo

    nothing = exhausted_grading(run_dir, record, infra_policy, RunnerInfo(None, None), "lost", started_at="2026-01-01T00:00:00Z")
    assert nothing.status == "INFRA_ERROR" and nothing.counts.total == 0 and nothing.score is None
    specs = plan_trials(run_id, ["a", "b", "c"])
    _write_plan(run_dir, run_id, specs)
    for spec, reward in zip(specs[:2], (1.0, 0.0), strict=True):
        (run_dir / "harbor" / spec.trial_name).mkdir(parents=True)
        (run_dir / "harbor" / spec.trial_name / "result.json").write_text(json.dumps(_result(reward)))
    grading = exhausted_grading(run_dir, record, infra_policy, RunnerInfo(None, None), "lost", started_at="2026-01-01T00:00:00Z")
    assert grading.status == "INFRA_ERROR" and grading.score is None and grading.reason == "lost"
    assert (grading.counts.total, grading.counts.completed, grading.counts.resolved, grading.counts.unresolved,
            grading.counts.infra_errors) == (3, 2, 1, 1, 1)
    assert [t.outcome for t in grading.trials] == ["resolved", "unresolved", "infra_error"]


@pytest.mark.docker
def test_kill_9_on_the_final_attempt_is_finalized_once_with_what_completed(tmp_path, make_payload):
    _, policy = _policy(tmp_path, max_attempts=1, lease_seconds=2)
    db = tmp_path / "crash" / "queue.sqlite3"
    with SqliteQueue(db) as q:
        run_id, _ = q.enqueue(DispatchPayload.model_validate(make_payload(correlation_id="final-crash-000001")), max_attempts=1)
        run_dir = q.run_dir(run_id)
    doomed = subprocess.Popen([sys.executable, "-c", _DEAD_WORKER, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        line = doomed.stdout.readline().split()
        assert line == [run_id, "1"]  # the final attempt
        # The dead attempt got this far: three trials planned, two finished.
        specs = plan_trials(run_id, ["a", "b", "c"])
        _write_plan(run_dir, run_id, specs)
        for spec in specs[:2]:
            (run_dir / "harbor" / spec.trial_name).mkdir(parents=True)
            (run_dir / "harbor" / spec.trial_name / "result.json").write_text(json.dumps(_result(1.0)))
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=30)
    finally:
        if doomed.poll() is None:
            doomed.kill()
    assert doomed.returncode == -signal.SIGKILL
    with SqliteQueue(db) as q:
        assert q.get_run(run_id).state == "RUNNING"
    finalize = Recorder(db)
    config = WorkerConfig(db=db, policy=policy)
    # Before the lease expires nothing can be claimed; after it, the next worker finalizes.
    assert run_once(config, finalize) is None
    time.sleep(2.2)
    outcome = run_once(config, finalize)
    assert outcome is not None and outcome.run_id == run_id and outcome.state == "INFRA_ERROR"
    grading = outcome.grading
    assert grading is not None and grading.score is None and "final attempt" in (grading.reason or "")
    assert grading.graded_by == config.worker_id  # the worker that ended it, not the dead one
    assert (grading.counts.total, grading.counts.completed, grading.counts.resolved, grading.counts.infra_errors) == (3, 2, 2, 1)
    assert [state for state, _ in finalize.calls] == ["RUNNING"] and finalize.calls[0][1] == grading
    # Exactly once: nothing left to claim, and the terminal transaction carried the outbox row.
    assert run_once(config, finalize) is None
    time.sleep(2.2)
    assert run_once(config, finalize) is None and len(finalize.calls) == 1
    with SqliteQueue(db) as q:
        record = q.get_run(run_id)
        events = [e.event for e in q.events(run_id)]
        pubs = q.list_publications(run_id)
    assert record.state == "INFRA_ERROR" and record.attempts == 1 and record.finalize_attempts == 1
    assert events.count("completed") == 1 and events.count("lease_expired") == 1 and events.count("claimed") == 2
    assert [(p.request.target, p.state) for p in pubs] == [("local", "PENDING")]
    assert Grading.model_validate_json((run_dir / "grading.json").read_text()) == grading
    assert (run_dir / "artifacts" / "evidence" / "harbor").is_dir()
    assert json.loads((run_dir / "run.json").read_text())["state"] == "INFRA_ERROR"


@pytest.mark.docker
def test_finalizer_failure_on_a_finalize_claim_retries_then_completes_once(tmp_path, make_payload):
    _, policy = _policy(tmp_path, max_attempts=2, lease_seconds=30)
    db = tmp_path / "ff" / "queue.sqlite3"
    with SqliteQueue(db) as q:
        run_id, _ = q.enqueue(DispatchPayload.model_validate(make_payload(correlation_id="final-fin-0000001")), max_attempts=2)
        for _ in range(2):
            claim = q.claim("w", 30)
            assert claim and claim.lease_token
            q.fail_infra(run_id, claim.lease_token, "registry unavailable")
        assert q.get_run(run_id).phase == "finalize"
    calls: list[str] = []

    def flaky(record: RunRecord, grading: Grading, run_dir: Path) -> list[PublicationRequest]:
        calls.append(grading.status)
        if len(calls) == 1:
            raise RuntimeError("signing service unavailable")
        return [PublicationRequest(run_id=record.run_id, target="local", tag="v1.2.3", artifacts_dir=str(run_dir))]

    config = WorkerConfig(db=db, policy=policy)
    first = run_once(config, flaky)
    assert first is not None and first.state == "QUEUED"  # not terminal without its publication
    second = run_once(config, flaky)
    assert second is not None and second.state == "INFRA_ERROR"
    assert calls == ["INFRA_ERROR", "INFRA_ERROR"]
    assert run_once(config, flaky) is None
    with SqliteQueue(db) as q:
        assert len(q.list_publications(run_id)) == 1
        assert [e.event for e in q.events(run_id)].count("completed") == 1


# --- the real thing: Harbor trials in the runner container, worker killed with -9 ---------------

@pytest.fixture(scope="module")
def crash_setup(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile,
                sign_release_images: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("infra-crash")
    runner, api = built_images.images["runner"], built_images.images["api"]
    trust = sign_release_images("acme/benchseal", "v9.9.8", [runner.ref, api.ref])
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data["sources"] = [built_images_source("acme/benchseal", built_images)]
    # All five trials (smoke's four, its tamper canary among them, and the blocking task) in one batch (one
    # runner container), one of which never finishes: the kill certainly lands mid-batch, after the others
    # were recorded.
    suites = root / "suites"
    shutil.copytree(REPO_ROOT / "suites" / "smoke", suites / "smoke")
    shutil.copytree(Path(__file__).parent / "data" / "blocking", suites / "smoke" / "blocking")
    data["suites"] = {"smoke": {"timeout_seconds": 300, "trial_concurrency": 5, "dataset": pinned(suites, "smoke")}}
    data["lease_seconds"] = 4
    data["max_attempts"] = 1
    policy_path = root / "infra.yaml"
    policy_path.write_text(yaml.safe_dump(data))
    return {"root": root, "policy_path": policy_path, "policy": load_policy(policy_path), "suites": suites,
            "runner": runner.ref, "api": api.ref, "trust": trust}


@pytest.mark.docker
def test_a_run_whose_planning_attempts_are_used_up_names_the_worker_that_ended_it(tmp_path, make_payload):
    _, policy = _policy(tmp_path)
    db = tmp_path / "planning" / "queue.sqlite3"
    with SqliteQueue(db) as q:  # its runner's digest is in no registry: pulling it is an infrastructure error
        run_id, _ = q.enqueue(DispatchPayload.model_validate(make_payload(correlation_id="planning-infra-000001")),
                              max_attempts=1)
        run_dir = q.run_dir(run_id)
    config = WorkerConfig(db=db, policy=policy, worker_id="host-p-303")
    outcome = _run_once(config)  # not run_once: no prune of the shared sandbox after it
    assert outcome is not None and outcome.run_id == run_id and outcome.state == "INFRA_ERROR", outcome
    assert outcome.reason is not None and outcome.reason.startswith("attempts exhausted (1)"), outcome.reason
    assert outcome.grading is not None and outcome.grading.graded_by == "host-p-303"
    assert Grading.model_validate_json((run_dir / "grading.json").read_text()).graded_by == "host-p-303"


@pytest.mark.docker
@pytest.mark.slow
def test_real_worker_killed_with_9_on_its_final_attempt_publishes_the_run_as_failed_once(crash_setup):
    setup = crash_setup
    db = setup["root"] / "kill9-final" / "queue.sqlite3"
    payload = {
        "schema": "benchseal.dispatch/v1", "correlation_id": f"kill-nine-final-{uuid.uuid4().hex[:8]}",
        "source": {"repository": "acme/benchseal", "commit": "0123456789abcdef0123456789abcdef01234567", "tag": "v9.9.8"},
        "runner": setup["runner"], "api": setup["api"], "suite": "smoke", "agent": "oracle",
    }
    run_id = accept_payload(payload, db=db, policy=setup["policy"]).run_id
    run_dir = db.parent / "runs" / run_id
    cmd = [sys.executable, "-m", "pipeline", "worker", "--once", "--db", str(db), "--policy", str(setup["policy_path"]),
           "--suites-dir", str(setup["suites"]), "--sigstore-url", str(setup["trust"].fulcio_url),
           "--trusted-root", str(setup["trust"].trusted_root)]
    worker = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # Mid-suite: at least one trial has its result recorded in the queue, and the worker is still running.
        def recorded() -> bool:
            with SqliteQueue(db) as q:
                return any(t.result is not None for t in q.trials(run_id)) if q.get_run(run_id).trials_planned else False

        wait_for(recorded, "a first trial result", limit=240)
        assert worker.poll() is None
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    with SqliteQueue(db) as q:
        assert q.get_run(run_id).state == "RUNNING" and q.get_run(run_id).attempts == 1
        unfinished = [t.task for t in q.trials(run_id) if t.result is None]
    assert "blocking" in unfinished  # the kill landed mid-batch
    finalize = Recorder(db)
    config = WorkerConfig(db=db, policy=setup["policy"], suites_dir=setup["suites"], image_trust=setup["trust"])
    outcomes = []

    def finalized() -> bool:
        got = run_once(config, finalize)
        if got is not None:
            outcomes.append(got)
        return bool(outcomes)

    wait_for(finalized, "the lease to expire and the run to be finalized", limit=60)
    outcome = outcomes[0]
    assert outcome.run_id == run_id and outcome.state == "INFRA_ERROR"
    grading = outcome.grading
    assert grading is not None and grading.score is None
    # What completed is graded, not dropped. A trial whose attempts ran out has no record to say it was the tamper
    # canary, so an exhausted canary is counted as an infrastructure error (the run has no score either way).
    assert grading.counts.total in (4, 5) and grading.counts.completed >= 1
    assert len(grading.trials) == 5  # and the tamper canary, graded and never counted
    blocked = next(t for t in grading.trials if t.task == "blocking")
    assert blocked.outcome == "infra_error" and blocked.exception_type == "TrialAttemptsExhausted"
    digest = setup["runner"].partition("@")[2]
    completed = [t for t in grading.trials if t.outcome != "infra_error"]
    assert all(t.reward is not None and t.harbor_version == "0.26.0" for t in completed)
    # The runner digest comes from inspecting the dead attempt's container, never assumed.
    assert {t.runner_digest for t in grading.trials} <= {digest, None}
    assert len(finalize.calls) == 1 and finalize.calls[0][0] == "RUNNING"
    # The dead attempt's runner and trial containers are gone.
    client = sandbox_engine()
    assert client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"}) == []
    short = run_id[-12:]
    assert [c["Id"] for c in client.api.containers(all=True, filters={"label": "com.docker.compose.project"})
            if short in (c.get("Labels") or {}).get("com.docker.compose.project", "")] == []
    assert run_once(config, finalize) is None
    with SqliteQueue(db) as q:
        record = q.get_run(run_id)
        events = [e.event for e in q.events(run_id)]
        pubs = q.list_publications(run_id)
    assert record.state == "INFRA_ERROR" and record.grading == grading
    # The killed batch's unfinished trials expired on their final attempt; the run then waited to be graded.
    assert events.count("completed") == 1 and "trials_lease_expired" in events and events.count("trials_done") == 1
    assert [(p.request.target, p.request.tag) for p in pubs] == [("local", "v9.9.8")]
    assert (run_dir / "artifacts" / "evidence" / "harbor").is_dir()
    assert (run_dir / "artifacts" / "evidence" / "grading.json").is_file()
    assert os.path.exists(run_dir / "artifacts" / "finalized.txt")


@pytest.mark.docker
@pytest.mark.parametrize("deaths", [2, 3])
def test_a_worker_killed_while_finalizing_is_replaced_and_the_run_still_ends_once(tmp_path, make_payload, deaths):
    _, policy = _policy(tmp_path, max_attempts=1, lease_seconds=2)
    db = tmp_path / "fin-crash" / "queue.sqlite3"
    with SqliteQueue(db) as q:
        run_id, _ = q.enqueue(DispatchPayload.model_validate(make_payload(correlation_id="final-fin-crash-01")), max_attempts=1)
        claim = q.claim("w", 2)
        assert claim and claim.lease_token
        q.fail_infra(run_id, claim.lease_token, "engine unavailable")  # attempts used up: phase finalize
        assert q.get_run(run_id).phase == "finalize"
    # Finalizers die with -9 while they hold the finalize claim.
    for _ in range(deaths):
        doomed = subprocess.Popen([sys.executable, "-c", _DEAD_WORKER, str(db)], stdout=subprocess.PIPE, text=True)
        try:
            assert doomed.stdout is not None and doomed.stdout.readline().split() == [run_id, "1"]
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(timeout=30)
        finally:
            if doomed.poll() is None:
                doomed.kill()
        time.sleep(2.2)
        with SqliteQueue(db) as q:
            assert q.requeue_expired() == [run_id]
            assert q.get_run(run_id).state == "QUEUED" and q.get_run(run_id).phase == "finalize"
    finalize = Recorder(db)
    outcome = run_once(WorkerConfig(db=db, policy=policy), finalize)
    assert outcome is not None and outcome.state == "INFRA_ERROR"
    # Up to 3 finalize claims run the finalizer; after that the run still ends (once), without it.
    assert len(finalize.calls) == (1 if deaths < 3 else 0)
    assert run_once(WorkerConfig(db=db, policy=policy), finalize) is None
    with SqliteQueue(db) as q:
        record = q.get_run(run_id)
        events = [e.event for e in q.events(run_id)]
        assert record.state == "INFRA_ERROR" and record.attempts == 1 and record.finalize_attempts == deaths + 1
        assert events.count("completed") == 1 and events.count("lease_expired") == deaths
        assert len(q.list_publications(run_id)) == (1 if deaths < 3 else 0)
