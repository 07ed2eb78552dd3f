"""Issue 26.2, attempts: a run with n trials per task, graded by the worker, sealed, and refused when a
trial is dropped or its counts are forged.

The run is real up to the runner: a real queue, the worker's grader over Harbor result.json files made from
a real one (tests.fixtures.trials.graded_export, three attempts of each task), ``benchseal infra export``'s
writer, and the seal job's own checks (``seal_export``, in process). The score stays resolved / completed
over every trial; summary.json's per-task counts say 2 of 3 for a task resolved twice.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import DispatchPayload, Grading, TrialOutcome, task_trial_names
from pipeline.core.documents import ScoreInterval, TaskCounts
from pipeline.core.errors import CheckFailed
from pipeline.core.scoring import (
    Claim,
    ClaimedTrial,
    TrialEvidence,
    check_claim,
    count,
    evidence_trials,
    grade_result,
    result_name,
    score_interval,
    task_counts,
    wilson_interval,
)
from pipeline.evidence import artifacts
from pipeline.evidence.signing import Signer
from pipeline.infra.intake.policy import load_policy
from pipeline.publish.body import facts_from_summary, render_section
from pipeline.publish.seal import seal_export
from tests.fixtures.trials import (
    EVIDENCE,
    graded_export,
    grader_rewards,
    harbor_result,
    members,
    plan,
    seal_refused,
    tampered,
)

RUNNER = "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64
API = "127.0.0.1:5055/benchseal/api@sha256:" + "2" * 64
PAYLOAD: dict[str, Any] = {
    "schema": "benchseal.dispatch/v1", "correlation_id": "seal-attempts-0001",
    "source": {"repository": "acme/widget", "commit": "c" * 40, "tag": "v1.0.0"},
    "runner": RUNNER, "api": API, "suite": "smoke", "agent": "oracle",
}
# alpha: resolved in attempts 1 and 3 of 3; beta: never resolved.
REWARDS = {"alpha": [1.0, 0.0, 1.0], "beta": [0.0, 0.0, 0.0]}
Files = dict[str, bytes]


@pytest.fixture(scope="module")
def attempted(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes]:
    tmp = tmp_path_factory.mktemp("attempts")
    results: dict[str, Any] = {task: [harbor_result("x", r) for r in rewards] for task, rewards in REWARDS.items()}
    return graded_export(tmp, PAYLOAD, load_policy(), results, attempts=3)


def _json(files: Files, name: str) -> dict[str, Any]:
    return json.loads(files[name])  # type: ignore[no-any-return]


def _put(files: Files, name: str, data: dict[str, Any]) -> None:
    files[name] = json.dumps(data).encode()


def _names(run_id: str, task: str) -> tuple[str, ...]:
    return task_trial_names(task, run_id, 3)


# --- the worker's grading and the summary ---------------------------------------------------------

def test_the_worker_grades_every_attempt(attempted: tuple[str, bytes]) -> None:
    run_id, export = attempted
    files = members(export)
    grading = Grading.model_validate_json(files["grading.json"])
    assert grading.status == "SUCCEEDED"
    assert [(t.task, t.trial_name, t.outcome) for t in grading.trials] == [
        ("alpha", _names(run_id, "alpha")[0], "resolved"), ("alpha", _names(run_id, "alpha")[1], "unresolved"),
        ("alpha", _names(run_id, "alpha")[2], "resolved"),
        *[("beta", name, "unresolved") for name in _names(run_id, "beta")]]
    assert grading.counts.model_dump() == {"total": 6, "completed": 6, "resolved": 2, "unresolved": 4,
                                           "infra_errors": 0}
    assert grading.score == 0.333333  # the mean pass rate over all six trials
    # Every attempt's dir is in the export, under its own name.
    for task in REWARDS:
        for name in _names(run_id, task):
            assert f"{EVIDENCE}/harbor/{name}/result.json" in files


def test_the_summary_counts_attempts_per_task_with_the_wilson_interval(attempted: tuple[str, bytes]) -> None:
    _, export = attempted
    grading = Grading.model_validate_json(members(export)["grading.json"])
    summary = artifacts.build_summary(grading, DispatchPayload.model_validate(PAYLOAD))
    assert summary.tasks == {"alpha": TaskCounts(attempts=3, completed=3, resolved=2),
                             "beta": TaskCounts(attempts=3, completed=3, resolved=0)}
    low, high = wilson_interval(2, 6) or (0.0, 0.0)
    assert summary.interval == ScoreInterval(low=low, high=high) and (low, high) == (0.096771, 0.700007)  # roots of (k/n - p)² = z² p(1-p)/n
    text = render_section(facts_from_summary(summary.to_json_dict(), "v1.0.0"))
    assert "| Score | **0.333** (2/6 resolved) |" in text, text
    assert "| Per-task passes (resolved / attempts) | alpha 2/3, beta 0/3 |" in text, text


def test_the_seal_job_accepts_the_run(attempted: tuple[str, bytes], tmp_path: Path) -> None:
    """Everything the seal job checks before it signs passes: it asks for the signer."""
    run_id, export = attempted

    class Reached(Exception):
        pass

    def signer() -> Signer:
        raise Reached
    with pytest.raises(Reached):
        seal_export(io.BytesIO(export), tmp_path / "sealed", run_id, signer, load_policy())


# --- refused: a trial dropped, the counts forged -----------------------------------------------------

def _drop_trial(run_id: str, task: str, k: int) -> Any:
    """One attempt gone from everything the run says: its dir, the plan, grading.json and run.json, the
    counts and score made to agree (a consistent grading of the trials that are left)."""
    gone = _names(run_id, task)[k - 1]

    def change(files: Files) -> None:
        for name in [n for n in files if n.startswith(f"{EVIDENCE}/harbor/{gone}/")]:
            del files[name]
        trials = _json(files, f"{EVIDENCE}/trials.json")
        trials["trials"] = [t for t in trials["trials"] if t["trial_name"] != gone]
        _put(files, f"{EVIDENCE}/trials.json", trials)
        grading = _json(files, "grading.json")
        grading["trials"] = [t for t in grading["trials"] if t["trial_name"] != gone]
        outcomes: list[TrialOutcome] = [t["outcome"] for t in grading["trials"]]
        counts = count(outcomes)
        grading.update(counts=counts.model_dump(), score=round(counts.resolved / counts.completed, 6))
        _put(files, "grading.json", grading)
        status = _json(files, "run.json")
        status.update(counts=grading["counts"], score=grading["score"])
        _put(files, "run.json", status)
    return change


def test_a_dropped_attempt_isseal_refused(attempted: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = attempted
    # alpha's unresolved attempt 2 dropped would raise the score to 2/5; its last one, to 1/5.
    seal_refused(tmp_path / "a2", run_id, tampered(export, _drop_trial(run_id, "alpha", 2)),
             "evidence/trials.json: task alpha is planned with attempts [1, 3] of 3; attempt 2 is missing")
    seal_refused(tmp_path / "a3", run_id, tampered(export, _drop_trial(run_id, "beta", 3)),
             "evidence/trials.json: task beta is planned with attempts [1, 2] of 3; attempt 3 is missing")


def test_a_forged_count_isseal_refused(attempted: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = attempted
    second = _names(run_id, "alpha")[1]

    def forge(files: Files) -> None:
        grading = _json(files, "grading.json")
        next(t for t in grading["trials"] if t["trial_name"] == second).update(outcome="resolved", reward=1.0)
        grading.update(counts={**grading["counts"], "resolved": 3, "unresolved": 3}, score=0.5)
        _put(files, "grading.json", grading)
    seal_refused(tmp_path, run_id, tampered(export, forge),
             f"grading.trials[{second}].outcome: 'resolved' in grading.json, 'unresolved' from the trial evidence")

    def counts_only(files: Files) -> None:
        grading = _json(files, "grading.json")
        grading.update(counts={**grading["counts"], "resolved": 3, "unresolved": 3}, score=0.5)
        _put(files, "grading.json", grading)
    seal_refused(tmp_path / "counts", run_id, tampered(export, counts_only),
             "grading.resolved: 3 in grading.json, 2 from the trial evidence")


# --- the plan rule itself (scoring.evidence_trials), on hand-made evidence -----------------------------

RUN = "run-0123456789abcdef0123"


def _result(reward: float) -> bytes:
    return json.dumps({"verifier_result": {"rewards": grader_rewards(reward)}, "exception_info": None,
                       "agent_setup": {"started_at": "2026-12-02T14:11:50Z"}}).encode()


def _evidence(trials: list[tuple[str, str]], rewards: dict[str, float] | None = None) -> TrialEvidence:
    data = {**plan(RUN, []), "trials": [{"task": task, "trial_name": name} for task, name in trials]}
    results = {name: _result((rewards or {}).get(name, 1.0)) for _, name in trials}
    return TrialEvidence(plan=json.dumps(data).encode(), names=frozenset({"evidence/trials.json"} | {
        result_name(name) for name in results}), results=results)


def _claim(trials: list[tuple[str, str]], outcomes: dict[str, TrialOutcome]) -> Claim:
    pairs = [(task, outcomes.get(name, "resolved")) for task, name in trials]
    counts = count(outcome for _, outcome in pairs)
    return Claim(document="summary.json", label="summary", run_id=RUN, status="SUCCEEDED", counts=counts,
                 score=round(counts.resolved / counts.completed, 6),
                 trials=tuple(ClaimedTrial(task, name, outcomes.get(name, "resolved"),
                                           0.0 if outcomes.get(name) == "unresolved" else 1.0)
                              for task, name in trials),
                 interval=score_interval("SUCCEEDED", counts), tasks=task_counts(pairs), states_noise=True)


def test_a_plan_of_three_attempts_grades_and_checks() -> None:
    trials = [("hello", n) for n in task_trial_names("hello", RUN, 3)] + [
        ("fail", n) for n in task_trial_names("fail", RUN, 3)]
    unresolved = {trials[1][1], *[n for task, n in trials if task == "fail"]}
    evidence = _evidence(trials, dict.fromkeys(unresolved, 0.0))
    claim = _claim(trials, dict.fromkeys(unresolved, "unresolved"))
    graded = evidence_trials(evidence, claim)
    assert [t.grade.outcome for t in graded] == [grade_result(_result(0.0 if n in unresolved else 1.0)).outcome
                                                 for _, n in trials]
    counts = check_claim(claim, graded)
    assert (counts.total, counts.completed, counts.resolved) == (6, 6, 2)
    assert claim.tasks == {"fail": TaskCounts(attempts=3, completed=3, resolved=0),
                           "hello": TaskCounts(attempts=3, completed=3, resolved=2)}


def _names_of(task: str, n: int) -> list[tuple[str, str]]:
    return [(task, name) for name in task_trial_names(task, RUN, n)]


PLANS: dict[str, tuple[list[tuple[str, str]], str]] = {
    "an attempt missing": (_names_of("a", 3)[:2] + _names_of("b", 3),
                           "task a is planned with attempts [1, 2] of 3; attempt 3 is missing"),
    "the first attempt missing": (_names_of("a", 3)[1:] + _names_of("b", 3), "attempt 1 is missing"),
    "tasks with different attempts": (_names_of("a", 3) + _names_of("b", 2),
                                      "the tasks are planned with different numbers of attempts (2, 3); a run has one"),
    "one attempt beside several": (_names_of("a", 1) + _names_of("b", 2),
                                   "the tasks are planned with different numbers of attempts (1, 2)"),
    "a task once and as attempts": (_names_of("a", 1) + _names_of("a", 2), "task a is planned twice"),
    "attempts, then once": (_names_of("a", 2) + _names_of("a", 1), "task a is planned twice"),
    "an attempt twice": (_names_of("a", 2) + _names_of("a", 2)[:1], "is planned twice"),
    "another task's attempt": ([("a", task_trial_names("b", RUN, 2)[0]), *_names_of("a", 2)[1:]],
                               "is not task 'a' of run"),
    "another run's attempt": ([("a", "a__a1of2__ffffffffffff"), *_names_of("a", 2)[1:]], "is not task 'a' of run"),
}


@pytest.mark.parametrize("case", list(PLANS))
def test_a_plan_whose_attempts_do_not_add_up_isseal_refused(case: str) -> None:
    trials, rule = PLANS[case]
    with pytest.raises(CheckFailed) as caught:
        evidence_trials(_evidence(trials), _claim(trials, {}))
    assert rule in str(caught.value) and "\n" not in str(caught.value), caught.value
    assert str(caught.value).startswith("evidence/trials.json: "), caught.value
