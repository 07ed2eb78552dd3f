"""Grading from Harbor result.json files, and the smoke suite's shape (harbor lint, FROM placeholder)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import DispatchPayload
from pipeline.core.digests import ImageRef
from pipeline.core.errors import CheckFailed
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.queue.sql import SqliteQueue
from pipeline.infra.worker.grading import RunnerInfo, grade_run
from pipeline.infra.worker.loop import BASE_PLACEHOLDER, render_suite
from pipeline.runner.plan import TRIALS_FILE, discover_tasks, plan_trials, suite_grading
from tests.fixtures.trials import grader_rewards

REAL_RESULT = json.loads((Path(__file__).parent / "data" / "harbor-result.json").read_text())
SMOKE = REPO_ROOT / "suites" / "smoke"
HARBOR = REPO_ROOT / ".venv" / "bin" / "harbor"


def _result(reward: float | None = 1.0, exception: str | None = None) -> dict[str, Any]:
    data = json.loads(json.dumps(REAL_RESULT))
    data["verifier_result"] = None if reward is None else {"rewards": grader_rewards(reward)}
    data["exception_info"] = None if exception is None else {
        "exception_type": exception, "exception_message": "boom", "exception_traceback": "", "occurred_at": data["started_at"]}
    return data


def _run(tmp_path: Path, make_payload, results: list[dict[str, Any] | None], policy, canaries: tuple[int, ...] = ()):
    with SqliteQueue(tmp_path / "q.sqlite3") as q:
        payload = DispatchPayload.model_validate(make_payload())
        run_id, _ = q.enqueue(payload, max_attempts=3)
        record = q.get_run(run_id)
        run_dir = q.run_dir(run_id)
    tasks = [f"task-{i}" for i in range(len(results))]
    specs = plan_trials(run_id, tasks)
    (run_dir / TRIALS_FILE).write_text(json.dumps({
        "schema": "benchseal.trials/v1", "run_id": run_id, "agent": "oracle", "agent_version": None,
        "harbor_version": "0.26.0", "model": None,
        "trials": [{"task": s.task, "trial_name": s.trial_name, **({"canary": True} if i in canaries else {})}
                   for i, s in enumerate(specs)]}))
    for spec, result in zip(specs, results, strict=True):
        if result is not None:
            (run_dir / "harbor" / spec.trial_name).mkdir(parents=True)
            (run_dir / "harbor" / spec.trial_name / "result.json").write_text(json.dumps(result))
    digest = payload.runner.partition("@")[2]
    return grade_run(run_dir, record, policy, RunnerInfo(image_id="sha256:" + "1" * 64, digest=digest),
                     started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:01:00Z")


def test_all_resolved_scores_one(tmp_path, make_payload, infra_policy):
    grading = _run(tmp_path, make_payload, [_result(1.0)] * 3, infra_policy)
    assert grading.status == "SUCCEEDED" and grading.score == 1.0
    assert grading.counts.resolved == 3 and grading.harbor_version == "0.26.0"
    trial = grading.trials[0]
    assert trial.agent_seconds and trial.verifier_seconds and trial.total_seconds
    assert trial.runner_digest == make_payload()["runner"].partition("@")[2]


def test_score_is_resolved_over_completed_and_agent_errors_count_as_completed(tmp_path, make_payload, infra_policy):
    grading = _run(tmp_path, make_payload, [_result(1.0), _result(0.0), _result(0.0, "AgentTimeoutError"), _result(1.0)], infra_policy)
    assert grading.status == "SUCCEEDED"
    assert (grading.counts.completed, grading.counts.resolved, grading.counts.unresolved) == (4, 2, 2)
    assert grading.score == 0.5
    assert grading.trials[2].exception_type == "AgentTimeoutError" and grading.trials[2].outcome == "unresolved"


def test_missing_and_errored_trials_are_infra_errors_below_threshold(tmp_path, make_payload, infra_policy):
    # 1 of 3 (33%) is within the 34% threshold: scored over the completed trials only.
    grading = _run(tmp_path, make_payload, [_result(1.0), _result(0.0), None], infra_policy)
    assert grading.status == "SUCCEEDED" and grading.counts.infra_errors == 1
    assert grading.score == 0.5
    assert grading.trials[2].exception_type == "MissingTrialResult"


def test_infra_errors_above_threshold_fail_the_run_without_score(tmp_path, make_payload, infra_policy):
    grading = _run(tmp_path, make_payload, [_result(1.0), None, _result(1.0, "EnvironmentStartTimeoutError")], infra_policy)
    assert grading.status == "FAILED" and grading.score is None
    assert grading.counts.infra_errors == 2 and grading.counts.resolved == 1
    assert "infrastructure errors" in (grading.reason or "")


def test_failures_after_the_agent_started_stay_in_the_denominator(tmp_path, make_payload, infra_policy):
    """Issue 35.3: the agent's own crash, a verifier that hangs on what it left, no verdict at all: each is
    that trial's failure (unresolved), never an infrastructure error that would leave the denominator."""
    grading = _run(tmp_path, make_payload, [_result(1.0), _result(None, "RuntimeError"), _result(None, "KeyError"),
                                            _result(None, "VerifierTimeoutError"), _result(None)], infra_policy)
    assert grading.status == "SUCCEEDED" and grading.score == 0.2
    assert grading.counts.infra_errors == 0 and grading.counts.unresolved == 4
    assert [t.exception_type for t in grading.trials[1:]] == ["RuntimeError", "KeyError", "VerifierTimeoutError",
                                                             "NoReward"]
    assert all(t.reason for t in grading.trials[1:]) and grading.trials[0].reason is None


def test_missing_reward_without_exception_is_unresolved(tmp_path, make_payload, infra_policy):
    grading = _run(tmp_path, make_payload, [_result(None)] * 2, infra_policy)
    assert grading.status == "SUCCEEDED" and grading.score == 0.0
    assert {t.exception_type for t in grading.trials} == {"NoReward"}


def test_a_canary_is_never_scored_and_a_resolved_one_fails_the_run_as_tampered(tmp_path, make_payload, infra_policy):
    """Issue 35.8: the oracle's 1.0 on a sound suite stays 1.0 with a canary it cannot pass; a run that passes a
    canary (whose tests no honest solution passes) is FAILED, unscored, with that reason."""
    sound = _run(tmp_path / "sound", make_payload, [_result(1.0), _result(1.0), _result(0.0)], infra_policy,
                 canaries=(2,))
    assert sound.status == "SUCCEEDED" and sound.score == 1.0 and sound.counts.total == 2
    assert [t.canary for t in sound.trials] == [False, False, True]
    tampered = _run(tmp_path / "tampered", make_payload, [_result(0.0), _result(0.0), _result(1.0)], infra_policy,
                    canaries=(2,))
    assert tampered.status == "FAILED" and tampered.score is None
    assert tampered.reason is not None and tampered.reason.startswith("tampered: canary task task-2 was resolved")
    only = _run(tmp_path / "only", make_payload, [_result(0.0)], infra_policy, canaries=(0,))
    assert only.status == "FAILED" and only.score is None


# --- the smoke suite -----------------------------------------------------------

def test_smoke_suite_has_three_offline_tasks_and_a_canary():
    tasks = discover_tasks(SMOKE)
    graded = suite_grading(SMOKE, tasks)
    assert len([t for t in tasks if not graded[t].canary]) >= 3
    assert [t for t in tasks if graded[t].canary] == ["dedupe-lines"]
    for task in tasks:
        dockerfile = (SMOKE / task / "environment" / "Dockerfile").read_text()
        assert dockerfile.splitlines()[0] == f"FROM {BASE_PLACEHOLDER}"
        assert "STOPSIGNAL SIGKILL" in dockerfile
        test_sh = (SMOKE / task / "tests" / "test.sh").read_text()
        assert "python3" in test_sh and "pip" not in test_sh and "curl" not in test_sh
        assert (SMOKE / task / "solution" / "solve.sh").is_file()


def test_smoke_suite_is_harbor_lint_clean():
    tasks = [str(SMOKE / t) for t in discover_tasks(SMOKE)] + [str(Path(__file__).parent / "data" / "secret-probe")]
    result = subprocess.run([str(HARBOR), "lint", "--json", *tasks], capture_output=True, text=True, check=False,
                            env={**os.environ, "HARBOR_TELEMETRY": "0"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout or "[]") == []


def test_render_suite_pins_base_by_digest_and_refuses_other_froms(tmp_path):
    base = ImageRef("127.0.0.1:5055/benchseal/base", "sha256:" + "c" * 64)
    render_suite(SMOKE, tmp_path / "suite", base)
    for task in discover_tasks(tmp_path / "suite"):
        assert (tmp_path / "suite" / task / "environment" / "Dockerfile").read_text().splitlines()[0] == f"FROM {base.ref}"
    hostile = tmp_path / "hostile"
    render_suite(SMOKE, hostile, base)
    (hostile / "fix-mean" / "environment" / "Dockerfile").write_text("FROM ubuntu:latest\n")
    with pytest.raises(CheckFailed):
        render_suite(hostile, tmp_path / "again", base)


def test_a_recorded_trial_round_trips_and_a_bad_record_fails_closed():
    from pipeline.core.contracts import TrialRecord
    from pipeline.infra.worker.grading import RecordedTrial

    trial = TrialRecord(task="fix-mean", trial_name="fix-mean__abc", agent_name="oracle", outcome="resolved", reward=1.0)
    text = RecordedTrial(trial=trial, host="host-a", batch_dir="/var/lib/benchseal/infra/runs/r/batches/0000-x").to_json()
    assert '"schema":"benchseal.recorded-trial/v1"' in text
    parsed = RecordedTrial.parse(text, "fix-mean", "fix-mean__abc", "oracle")
    assert isinstance(parsed, RecordedTrial) and parsed.trial == trial and parsed.failure is None
    # Garbage, an unknown field, or a record of another trial: an infrastructure error, never a crash.
    for bad, name in ((text[:-5], "fix-mean__abc"), (text.replace('"host"', '"extra":1,"host"'), "fix-mean__abc"),
                      (text, "cli-flag__abc")):
        got = RecordedTrial.parse(bad, name.split("__")[0], name, "oracle")
        assert isinstance(got, TrialRecord) and got.outcome == "infra_error" and got.exception_type == "UnreadableTrialRecord"
