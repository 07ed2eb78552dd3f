"""The worker runs the installed infra policy, without a restart, and only the one a run was accepted under
(issue 38.7): ``pipeline.infra.intake.policy_home``.

The loaded policy carries the sha256 of the bytes it parsed (the digest accept checks); the worker hashes the
file at every claim and loads it again only when that digest changed; a new file that does not load refuses
every claim (the policy loaded before is never used instead); a run accepted under one policy is neither run
nor graded under another (FAILED, or its batches refused), and the grading records the digest it ran under.

The worker cases run the real claim loop (one of them the `benchseal worker` process itself) on a SQLite queue
of their own; they touch the sandbox engine only to look for their own runs' containers (none: nothing of these
runs ever starts).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.contracts import TrialRecord, trial_name
from pipeline.core.documents import PlannedTrial
from pipeline.core.errors import CheckFailed, PolicyNotLoaded, PolicyRefused, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.accept import accept_payload
from pipeline.infra.intake.policy import InfraPolicy, load_policy
from pipeline.infra.intake.policy_home import (
    PolicySource,
    accepted_policy_problem,
    check_loaded_policy,
    policy_digest,
)
from pipeline.infra.queue.sql import SqliteQueue
from pipeline.infra.worker.config import WorkerConfig, now_utc
from pipeline.infra.worker.finalize import _grade_planned
from pipeline.infra.worker.grading import RecordedTrial
from pipeline.infra.worker.loop import _run_once
from tests.fixtures.cli import run_benchseal
from tests.fixtures.infra import wait_for

SHIPPED = (REPO_ROOT / "policies" / "infra.yaml").read_text(encoding="utf-8")


def _policy_file(path: Path, text: str = SHIPPED) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


# --- the digest ---------------------------------------------------------------------------------

def test_the_loaded_policy_carries_the_sha256_of_the_bytes_it_parsed(tmp_path: Path) -> None:
    path = _policy_file(tmp_path / "infra.yaml", SHIPPED + "# the host's copy\n")
    policy = load_policy(path)
    # One digest: what `sha256sum` prints (benchmark.yml's accept step), accept's check and the loaded policy's.
    assert policy.digest == _sha256(path) == policy_digest(path)
    assert load_policy(_policy_file(tmp_path / "other.yaml")).digest == _sha256(tmp_path / "other.yaml") != policy.digest
    # A policy not read from a file has none (it is never taken for a file's); policies still compare by content.
    in_memory = InfraPolicy.model_validate(yaml.safe_load(SHIPPED))
    assert in_memory.digest is None and in_memory == policy
    # A copy is the same file's policy; a changed copy is not (the evidence never claims the file for it).
    assert policy.model_copy().digest == policy.digest
    assert policy.model_copy(update={"lease_seconds": 5.0}).digest is None


def test_accept_refuses_a_policy_whose_parsed_bytes_are_not_the_checked_ones(tmp_path: Path) -> None:
    path = _policy_file(tmp_path / "infra.yaml")
    loaded = load_policy(path)
    check_loaded_policy(loaded, path, _sha256(path))
    # The file replaced between accept's digest check and its load: the policy parsed is refused.
    with pytest.raises(CheckFailed, match=r"has digest sha256:[0-9a-f]{64}, not the infra repository's"):
        check_loaded_policy(loaded, path, "sha256:" + "0" * 64)
    with pytest.raises(CheckFailed, match="has digest None"):
        check_loaded_policy(InfraPolicy.model_validate(yaml.safe_load(SHIPPED)), path, _sha256(path))


def test_accept_records_the_checked_digest_with_the_run(tmp_path: Path, make_payload: Callable[..., dict[str, Any]],
                                                        queue_db: Path) -> None:
    policy = load_policy(_policy_file(tmp_path / "infra.yaml"))
    checked = accept_payload(make_payload(correlation_id="policy-recorded-0001"), db=queue_db, policy=policy,
                             policy_digest=policy.digest)
    unchecked = accept_payload(make_payload(correlation_id="policy-unchecked-0001"), db=queue_db, policy=policy)
    # A redelivery keeps the digest the run was first accepted under.
    accept_payload(make_payload(correlation_id="policy-recorded-0001"), db=queue_db, policy=policy,
                   policy_digest="sha256:" + "1" * 64)
    with SqliteQueue(queue_db) as queue:
        assert queue.accepted_policy(checked.run_id) == policy.digest
        assert queue.accepted_policy(unchecked.run_id) is None
    with pytest.raises(ValidationError, match="policy_digest"):
        accept_payload(make_payload(correlation_id="policy-malformed-0001"), db=queue_db, policy=policy,
                       policy_digest="sha256:ABC")


def test_infra_accept_records_the_digest_it_checked(tmp_path: Path, make_payload: Callable[..., dict[str, Any]],
                                                   queue_db: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = _policy_file(tmp_path / "infra.yaml")
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps(make_payload(correlation_id="policy-cli-0001")))
    monkeypatch.delenv("SUDO_UID", raising=False)
    code, out, err = run_benchseal(tmp_path, "infra", "accept", "--payload", str(payload), "--db", str(queue_db),
                                   "--policy", str(path), "--policy-digest", _sha256(path), "--json",
                                   monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    with SqliteQueue(queue_db) as queue:
        assert queue.accepted_policy(json.loads(out)["run_id"]) == _sha256(path)


def test_a_run_accepted_under_one_policy_is_refused_under_another() -> None:
    assert accepted_policy_problem(None, InfraPolicy.model_validate(yaml.safe_load(SHIPPED))) is None
    policy = load_policy()
    assert accepted_policy_problem(policy.digest, policy) is None
    other = "sha256:" + "2" * 64
    problem = accepted_policy_problem(other, policy)
    assert problem is not None and f"accepted under infra policy {other}" in problem and str(policy.digest) in problem
    assert "a policy not read from a file" in str(
        accepted_policy_problem(other, InfraPolicy.model_validate(yaml.safe_load(SHIPPED))))


# --- the reload -----------------------------------------------------------------------------------

def test_an_unchanged_file_is_not_loaded_again_and_a_changed_one_is(tmp_path: Path) -> None:
    path = _policy_file(tmp_path / "infra.yaml")
    source = PolicySource(path)
    first = source.current()
    assert source.current() is first  # the same bytes: the policy loaded before, not parsed again
    data = yaml.safe_load(SHIPPED)
    data["lease_seconds"] = 7
    _policy_file(path, yaml.safe_dump(data))
    second = source.current()
    assert second is not first and second.lease_seconds == 7 and second.digest == _sha256(path) != first.digest
    assert source.current() is second


@pytest.mark.parametrize(("case", "text"), [
    ("an unknown key", SHIPPED.replace("lease_seconds:", "lease_secs:")),
    ("not YAML", "sources: [\n"),
    ("v1", "schema: benchseal.infra-policy/v1\n"),
    ("absent", None),
])
def test_a_new_policy_that_does_not_load_is_refused_and_the_old_one_never_used(tmp_path: Path, case: str,
                                                                              text: str | None) -> None:
    path = _policy_file(tmp_path / "infra.yaml")
    source = PolicySource(path)
    before = source.current()
    if text is None:
        path.unlink()
    else:
        _policy_file(path, text)
    for _ in range(2):  # every attempt, not only the first: no fallback to the policy loaded before
        with pytest.raises(PolicyRefused) as refused:
            source.current()
        message = str(refused.value)
        assert f"policy {path} changed and is refused" in message and str(before.digest) in message, message
        assert "\n" not in message
    _policy_file(path, SHIPPED + "# fixed\n")
    assert source.current().digest == _sha256(path)


def test_each_distinct_refusal_is_logged_once_and_so_is_the_file_loading_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _policy_file(tmp_path / "infra.yaml")
    source = PolicySource(path)
    source.current()

    def attempts(n: int) -> list[str]:
        caplog.clear()
        for _ in range(n):
            try:
                source.current()
            except PolicyNotLoaded:
                pass
        return [r.getMessage() for r in caplog.records if r.name == "benchseal.policy"]

    _policy_file(path, SHIPPED.replace("lease_seconds:", "lease_secs:"))
    (first,) = attempts(5)  # the claim loops poll every 2 s: one line, not one a poll
    assert first.startswith(f"policy {path} changed and is refused") and "lease_seconds: Field required" in first and "\n" not in first
    _policy_file(path, "sources: [\n")  # another failure: its own line, once
    (second,) = attempts(3)
    assert second != first and second.startswith(f"policy {path} changed and is refused")
    _policy_file(path, SHIPPED + "# fixed\n")
    assert attempts(3) == [f"policy {path} loads again ({_sha256(path)}): claims resume"]
    _policy_file(path, "sources: [\n")  # broken again after it loaded: said again, once
    (third,) = attempts(2)
    assert third.startswith(f"policy {path} changed and is refused") and "not valid YAML" in third


def test_a_worker_started_with_a_policy_that_does_not_load_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as refused:
        PolicySource(_policy_file(tmp_path / "infra.yaml", "sources: [\n")).current()
    assert refused.value.exit_code == 2


# --- the worker -----------------------------------------------------------------------------------

@pytest.mark.docker
def test_the_worker_claims_under_the_installed_policy_and_never_runs_a_run_accepted_under_another(
        tmp_path: Path, make_payload: Callable[..., dict[str, Any]], queue_db: Path) -> None:
    path = _policy_file(tmp_path / "infra.yaml")
    source = PolicySource(path)
    accepted_under = source.current()
    run_id = accept_payload(make_payload(correlation_id="policy-reload-0001"), db=queue_db, policy=accepted_under,
                            policy_digest=accepted_under.digest).run_id
    config = WorkerConfig(db=queue_db, policy=accepted_under, policy_source=source)

    # A new policy that does not load: nothing is claimed (the run stays queued, no attempt counted).
    _policy_file(path, SHIPPED.replace("lease_seconds:", "lease_secs:"))
    with pytest.raises(PolicyRefused, match="changed and is refused"):
        _run_once(config)
    with SqliteQueue(queue_db) as queue:
        record = queue.get_run(run_id)
        assert (record.state, record.attempts) == ("QUEUED", 0)
        # Why, beside the worker's heartbeat (what `infra status` and `doctor host` show).
        (beat,) = [w for w in queue.stats().workers if w.worker == config.worker_id]
        assert beat.problem is not None and beat.problem.startswith(f"policy {path} changed and is refused")

    # A new policy that loads is used from this claim on: the run, accepted under the old one, fails with
    # that reason and nothing of it runs.
    _policy_file(path, SHIPPED + "# installed after the run was accepted\n")
    outcome = _run_once(config)
    assert outcome is not None and outcome.run_id == run_id and outcome.state == "FAILED", outcome
    assert outcome.reason == (f"policy: the run was accepted under infra policy {accepted_under.digest} and this "
                              f"worker has loaded {_sha256(path)}: a run is never run or graded under another policy "
                              "than the one accept checked (dispatch it again)")
    assert outcome.grading is not None and outcome.grading.policy_digest == _sha256(path)
    assert outcome.grading.graded_by == config.worker_id  # the worker that refused it, in its evidence
    with SqliteQueue(queue_db) as queue:
        assert queue.get_run(run_id).reason == outcome.reason
        assert queue.trials(run_id) == []  # never planned
        assert [w.problem for w in queue.stats().workers if w.worker == config.worker_id] == [None]  # it claims again
    assert not (queue.run_dir(run_id) / "batches").exists()


def _planned(queue: SqliteQueue, run_id: str, *, claim: int) -> Any:
    record = queue.claim("planner", 60)
    assert record is not None and record.run_id == run_id and record.lease_token
    queue.start(run_id, record.lease_token)
    return queue.plan_trials(run_id, record.lease_token,
                             [PlannedTrial(task="hello", trial_name=trial_name("hello", run_id))], max_attempts=1,
                             claim=claim, worker="runner-host" if claim else None, lease_seconds=60 if claim else 0.0)


@pytest.mark.docker
def test_a_batch_of_a_run_accepted_under_another_policy_is_refused(
        tmp_path: Path, make_payload: Callable[..., dict[str, Any]], queue_db: Path) -> None:
    accepted_under = load_policy(_policy_file(tmp_path / "a.yaml"))
    run_id = accept_payload(make_payload(correlation_id="policy-batch-0001"), db=queue_db, policy=accepted_under,
                            policy_digest=accepted_under.digest).run_id
    with SqliteQueue(queue_db) as queue:
        assert _planned(queue, run_id, claim=0) is None
    # A worker (another host, or this one after an install) whose policy is another: its batch never starts.
    other = PolicySource(_policy_file(tmp_path / "b.yaml", SHIPPED + "# another\n"))
    outcome = _run_once(WorkerConfig(db=queue_db, policy_source=other))
    assert outcome is not None and outcome.state == "INFRA_ERROR", outcome
    with SqliteQueue(queue_db) as queue:
        (trial,) = queue.trials(run_id)
        assert trial.result is None and trial.reason is not None
        assert trial.reason.startswith(f"PolicyRefused: policy: the run was accepted under infra policy "
                                       f"{accepted_under.digest}"), trial.reason


def _finished(queue: SqliteQueue, run_id: str) -> Any:
    """The run's one trial planned, run (resolved) and recorded: the run is handed over for grading."""
    batch = _planned(queue, run_id, claim=1)
    (claimed,) = batch.trials
    recorded = RecordedTrial(trial=TrialRecord(task="hello", trial_name=claimed.trial_name, outcome="resolved",
                                               reward=1.0, agent_name="oracle"),
                             host=socket.gethostname(), batch_dir=str(queue.run_dir(run_id) / "batches" / "0000"))
    ended = queue.complete_trials(run_id, batch.lease_token, {claimed.idx: recorded.to_json()}, lease_seconds=60)
    assert ended is not None and ended.lease_token
    return ended


@pytest.mark.docker
def test_a_run_is_graded_only_under_the_policy_it_was_accepted_under(
        tmp_path: Path, make_payload: Callable[..., dict[str, Any]], queue_db: Path) -> None:
    accepted_under = load_policy(_policy_file(tmp_path / "a.yaml"))
    other = load_policy(_policy_file(tmp_path / "b.yaml", SHIPPED + "# another\n"))
    runs = {name: accept_payload(make_payload(correlation_id=f"policy-grade-{name}-0001"), db=queue_db,
                                 policy=accepted_under, policy_digest=accepted_under.digest).run_id
            for name in ("same", "other")}
    with SqliteQueue(queue_db) as queue:
        ended = _finished(queue, runs["same"])
        graded = _grade_planned(queue, ended, str(ended.lease_token), accepted_under, None, now_utc())
        assert graded.state == "SUCCEEDED" and graded.grading is not None, graded
        assert graded.grading.policy_digest == accepted_under.digest  # the policy it was run and graded under
        ended = _finished(queue, runs["other"])
        refused = _grade_planned(queue, ended, str(ended.lease_token), other, None, now_utc())
        assert refused.state == "FAILED" and refused.grading is not None and refused.grading.score is None
        assert refused.reason is not None and refused.reason.startswith(
            f"policy: the run was accepted under infra policy {accepted_under.digest} and this worker has loaded "
            f"{other.digest}"), refused.reason


# --- the worker as `benchseal worker` starts it -------------------------------------------------------

@pytest.mark.docker
@pytest.mark.slow
def test_the_worker_cli_claims_under_the_policy_installed_after_it_started(
        tmp_path: Path, make_payload: Callable[..., dict[str, Any]], queue_db: Path) -> None:
    """The CLI's own wiring (pipeline.cli.worker), not a source built by the test: a long-running worker whose
    policy file is edited after it started refuses claims while the file does not load, then claims under the
    file as it is now. A worker wired to a policy loaded once claims the run under the policy it started with
    (and records no refusal): both waits below then fail."""
    path = _policy_file(tmp_path / "infra.yaml")
    started_with = _sha256(path)
    accepted_under = load_policy(_policy_file(tmp_path / "accepted.yaml", SHIPPED + "# accepted under\n"))
    log_file = tmp_path / "worker.log"
    # Its own state home: the prune after a sealed run never looks at the shared sandbox's task images.
    env = {**os.environ, "BENCHSEAL_HOME": str(tmp_path / "home")}
    with log_file.open("wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "pipeline", "worker", "--db", str(queue_db), "--policy",
                                   str(path)], stdout=log, stderr=subprocess.STDOUT, env=env)
    worker_id = f"{socket.gethostname()}-{worker.pid}"

    def beat() -> Any:
        assert worker.poll() is None, log_file.read_text()
        if not queue_db.exists():
            return None
        with SqliteQueue(queue_db) as queue:
            return next((w for w in queue.stats().workers if w.worker == worker_id), None)

    try:
        wait_for(lambda: beat() is not None, "the worker's first poll", limit=120)
        _policy_file(path, SHIPPED.replace("lease_seconds:", "lease_secs:"))
        wait_for(lambda: beat().problem is not None, "the worker to refuse its claims", limit=60)
        run_id = accept_payload(make_payload(correlation_id="policy-cli-reload-0001"), db=queue_db,
                                policy=accepted_under, policy_digest=accepted_under.digest).run_id
        enqueued = beat().last_seen
        # A poll after the run was queued: refused too, the run untouched.
        wait_for(lambda: beat().last_seen > enqueued, "a poll after the run was queued", limit=60)
        with SqliteQueue(queue_db) as queue:
            record = queue.get_run(run_id)
            assert (record.state, record.attempts) == ("QUEUED", 0)
        status = subprocess.run([sys.executable, "-m", "pipeline", "infra", "status", "--db", str(queue_db),
                                 "--summary"], capture_output=True, text=True, check=True, env=env)
        (shown,) = [w for w in json.loads(status.stdout)["queue"]["workers"] if w["worker"] == worker_id]
        assert shown["problem"].startswith(f"policy {path} changed and is refused") and started_with in shown["problem"]
        assert "lease_seconds: Field required" in shown["problem"]  # the rule that failed

        _policy_file(path, SHIPPED + "# installed after the worker started\n")
        edited = _sha256(path)

        def ended() -> bool:
            assert worker.poll() is None, log_file.read_text()
            with SqliteQueue(queue_db) as queue:
                return queue.get_run(run_id).state != "QUEUED" and queue.get_run(run_id).state != "CLAIMED"

        wait_for(ended, "the run to be claimed under the edited policy", limit=120)
        with SqliteQueue(queue_db) as queue:
            record = queue.get_run(run_id)
        assert record.state == "FAILED" and record.reason is not None, record
        assert record.reason.startswith(f"policy: the run was accepted under infra policy {accepted_under.digest} "
                                        f"and this worker has loaded {edited}:"), record.reason
        assert beat().problem is None
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, log_file.read_text()
    lines = log_file.read_text().splitlines()
    # Said once, not at every poll (it polled at least twice while refused), and once when it loaded again.
    assert sum("changed and is refused" in line for line in lines) == 1, lines
    assert sum(f"loads again ({edited}): claims resume" in line for line in lines) == 1, lines
