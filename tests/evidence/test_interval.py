"""Issue 26.2: the score's noise in summary.json: a 95 % Wilson interval and per-task pass counts.

One rule (``pipeline.core.scoring``): the interval of resolved / completed (rounded like the score, only
where there is a score) and each task's attempts / completed / resolved. The evidence writes both into
summary.json, the release body shows them, and ``check_claim`` (what ``benchseal verify`` runs on the
re-graded trials) refuses a summary whose interval or task counts the trials do not give.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from pipeline.core.contracts import SCORE_DIGITS, GradeCounts, TrialOutcome
from pipeline.core.documents import ReleaseSummary, ScoreInterval, TaskCounts, parse_document
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.scoring import (
    WILSON_Z,
    Claim,
    ClaimedTrial,
    EvidenceTrial,
    check_claim,
    count,
    grade_result,
    score_interval,
    score_of,
    task_counts,
    wilson_interval,
)
from pipeline.evidence import artifacts
from pipeline.publish.body import facts_from_summary, render_section
from tests.fixtures.sigstore import make_inputs
from tests.fixtures.trials import grader_rewards

RUNNER = "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64
API = "127.0.0.1:5055/benchseal/api@sha256:" + "2" * 64


def _reference(k: int, n: int) -> tuple[float, float]:
    """Independently: the Wilson bounds are the roots p of (k/n - p)² = z² p (1 - p) / n, i.e. of
    (n + z²) p² - (2k + z²) p + k²/n = 0, by the quadratic formula."""
    z2 = WILSON_Z ** 2
    a, b, c = n + z2, -(2 * k + z2), k * k / n
    root = math.sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


# --- the rule -----------------------------------------------------------------------------------

def test_nothing_completed_has_no_interval() -> None:
    assert wilson_interval(0, 0) is None


@pytest.mark.parametrize(("k", "n"), [(0, 1), (1, 1), (0, 3), (1, 3), (2, 3), (3, 3), (5, 10), (1, 2), (7, 20),
                                      (99, 100), (0, 500), (250, 500)])
def test_interval_matches_an_independent_reference(k: int, n: int) -> None:
    low, high = wilson_interval(k, n) or (math.nan, math.nan)
    ref_low, ref_high = _reference(k, n)
    assert abs(low - max(0.0, ref_low)) <= 1e-6 and abs(high - min(1.0, ref_high)) <= 1e-6
    outcomes: list[TrialOutcome] = ["resolved" if i < k else "unresolved" for i in range(n)]
    assert low <= (score_of(count(outcomes)) or 0.0) <= high
    assert 0.0 <= low < high <= 1.0  # never [x, x], also at 0 and 1


def test_known_values() -> None:
    # z = 1.959964, rounded to 6 places (Newcombe 1998 gives 0.0000-0.5615 for 0/3 and 0.2366-0.7634 for 5/10 at z = 1.96).
    assert wilson_interval(0, 3) == (0.0, 0.561497)
    assert wilson_interval(3, 3) == (0.438503, 1.0)
    assert wilson_interval(5, 10) == (0.236593, 0.763407)
    assert wilson_interval(2, 3) == (0.20766, 0.938508)  # the release body shows [0.208, 0.939]


@pytest.mark.parametrize(("k", "n"), [(0, 3), (1, 3), (1, 10), (3, 7), (0, 1), (13, 40)])
def test_interval_is_symmetric(k: int, n: int) -> None:
    low, high = wilson_interval(k, n) or (0.0, 0.0)
    mirror_low, mirror_high = wilson_interval(n - k, n) or (0.0, 0.0)
    assert abs(low - (1 - mirror_high)) <= 10 ** -SCORE_DIGITS and abs(high - (1 - mirror_low)) <= 10 ** -SCORE_DIGITS


def test_half_is_centred_and_rounded_like_the_score() -> None:
    low, high = wilson_interval(1, 2) or (0.0, 0.0)
    assert abs((low + high) / 2 - 0.5) <= 1e-6
    for k, n in ((1, 3), (2, 7), (5, 11)):
        for bound in wilson_interval(k, n) or ():
            assert bound == round(bound, SCORE_DIGITS)


@pytest.mark.parametrize(("k", "n"), [(-1, 3), (4, 3), (True, 3)])
def test_impossible_counts_are_refused(k: int, n: int) -> None:
    with pytest.raises(ValueError):
        wilson_interval(k, n)


def _counts(resolved: int, unresolved: int, infra: int = 0) -> GradeCounts:
    outcomes: list[TrialOutcome] = []
    outcomes += ["resolved"] * resolved
    outcomes += ["unresolved"] * unresolved
    outcomes += ["infra_error"] * infra
    return count(outcomes)


def test_interval_only_where_the_score_is() -> None:
    interval = score_interval("SUCCEEDED", _counts(2, 1, infra=1))  # infra errors are not in the rate
    assert interval == ScoreInterval(low=0.20766, high=0.938508)
    assert interval.confidence == 0.95 and interval.method == "wilson"
    assert score_interval("FAILED", _counts(2, 1)) is None and score_interval("INFRA_ERROR", _counts(0, 0, 3)) is None
    # calibration: oracle 1.0 and nop 0.0 keep their scores; the interval is not [x, x] (n trials are few)
    assert score_interval("SUCCEEDED", _counts(3, 0)) == ScoreInterval(low=0.438503, high=1.0)
    assert score_interval("SUCCEEDED", _counts(0, 3)) == ScoreInterval(low=0.0, high=0.561497)


def test_task_counts() -> None:
    trials: list[tuple[str, TrialOutcome]] = [("b", "resolved"), ("a", "unresolved"), ("b", "infra_error"),
                                              ("b", "resolved"), ("a", "resolved")]
    counted = task_counts(trials)
    assert list(counted) == ["a", "b"]
    assert counted["a"] == TaskCounts(attempts=2, completed=2, resolved=1)
    assert counted["b"] == TaskCounts(attempts=3, completed=2, resolved=2)
    assert task_counts([]) == {}


# --- summary.json -------------------------------------------------------------------------------

def _summary() -> dict[str, Any]:
    grading, payload = make_inputs({"runner": RUNNER, "api": API})
    return artifacts.build_summary(grading, payload).to_json_dict()


def test_summary_carries_interval_and_tasks() -> None:
    summary = _summary()
    assert summary["interval"] == {"low": 0.094531, "high": 0.905469, "confidence": 0.95, "method": "wilson"}
    assert summary["tasks"] == {"fail": {"attempts": 1, "completed": 1, "resolved": 0},
                                "hello": {"attempts": 1, "completed": 1, "resolved": 1}}
    # through JSON and back: the same document
    assert parse_document(ReleaseSummary, json.loads(json.dumps(summary)), "summary.json").to_json_dict() == summary


def test_unscored_summary_has_no_interval() -> None:
    grading, payload = make_inputs({"runner": RUNNER, "api": API})
    failed = grading.model_copy(update={"status": "FAILED", "score": None, "reason": "x"})
    summary = artifacts.build_summary(failed, payload)
    assert summary.interval is None and summary.tasks is not None and summary.tasks["hello"].resolved == 1


def test_an_older_summary_without_them_is_read() -> None:
    old = {k: v for k, v in _summary().items() if k not in ("interval", "tasks")}
    summary = parse_document(ReleaseSummary, old, "summary.json")
    assert summary.interval is None and summary.tasks is None
    assert not {"interval", "tasks"} & summary.model_fields_set


@pytest.mark.parametrize(("change", "rule"), [
    ({"interval": {"low": 0.9, "high": 0.1}}, "must not exceed high"),
    ({"interval": {"low": 0.1, "high": 0.9, "confidence": 0.9}}, "confidence"),
    ({"interval": {"low": 0.1, "high": 0.9, "method": "wald"}}, "method"),
    ({"tasks": {"hello": {"attempts": 1, "completed": 2, "resolved": 1}}}, "resolved <= completed <= attempts"),
    ({"tasks": {"hello": {"attempts": 0, "completed": 0, "resolved": 0}}}, "attempts"),
])
def test_summary_refuses_a_malformed_interval_or_task(change: dict[str, Any], rule: str) -> None:
    with pytest.raises(ValidationError, match=rule):
        parse_document(ReleaseSummary, {**_summary(), **change}, "summary.json")


def test_the_model_leaves_agreement_with_the_trials_to_verify() -> None:
    # A summary whose interval does not fit its score is well-formed: the check against the trials
    # (check_claim below, benchseal verify) names the field the trials contradict.
    summary = parse_document(ReleaseSummary, {**_summary(), "interval": {"low": 0.6, "high": 0.9}}, "summary.json")
    assert summary.interval == ScoreInterval(low=0.6, high=0.9)


# --- the release body ---------------------------------------------------------------------------

def test_body_shows_the_interval_and_passes_when_tasks_ran_more_than_once() -> None:
    summary = _summary()
    text = render_section(facts_from_summary(summary, "v9.9.9"))
    assert "| Score | **0.500** (1/2 resolved) |" in text
    assert "| Score 95 % interval (Wilson) | \\[0.095, 0.905\\] |" in text
    assert "Per-task passes" not in text  # one attempt each: the trials are the tasks
    summary.update(counts={"total": 6, "completed": 6, "resolved": 4, "unresolved": 2, "infra_errors": 0},
                   score=0.666667, interval={"low": 0.299993, "high": 0.903229, "confidence": 0.95, "method": "wilson"},
                   tasks={"fail": {"attempts": 3, "completed": 3, "resolved": 1},
                          "hello": {"attempts": 3, "completed": 3, "resolved": 3}})
    text = render_section(facts_from_summary(summary, "v9.9.9"))
    assert "| Score 95 % interval (Wilson) | \\[0.300, 0.903\\] |" in text
    assert "| Per-task passes (resolved / attempts) | fail 1/3, hello 3/3 |" in text


def test_body_of_an_older_or_unscored_summary_has_no_interval_row() -> None:
    old = {k: v for k, v in _summary().items() if k not in ("interval", "tasks")}
    assert "interval" not in render_section(facts_from_summary(old, "v9.9.9"))
    failed = {**old, "status": "FAILED", "score": None, "reason": "x",
              "tasks": {"hello": {"attempts": 2, "completed": 2, "resolved": 1}}}
    text = render_section(facts_from_summary(failed, "v9.9.9"))
    assert "interval" not in text and "Per-task passes" not in text  # shown only with the score they qualify


# --- the check benchseal verify runs on the re-graded trials ------------------------------------

def _result(reward: float) -> bytes:
    return json.dumps({"verifier_result": {"rewards": grader_rewards(reward)}, "exception_info": None,
                       "agent_setup": {"started_at": "2026-12-02T14:11:50Z"}}).encode()


TRIALS = (EvidenceTrial("hello", "hello__r1", grade_result(_result(1.0))),
          EvidenceTrial("fail", "fail__r1", grade_result(_result(0.0))),
          EvidenceTrial("solve", "solve__r1", grade_result(_result(1.0))))


def _claim(**changes: Any) -> Claim:
    counts = count(t.grade.outcome for t in TRIALS)
    fields: dict[str, Any] = {
        "document": "summary.json", "label": "summary", "run_id": "run-1", "status": "SUCCEEDED", "counts": counts,
        "score": score_of(counts),
        "trials": tuple(ClaimedTrial(t.task, t.trial, t.grade.outcome, t.grade.reward) for t in TRIALS),
        "interval": score_interval("SUCCEEDED", counts),
        "tasks": task_counts((t.task, t.grade.outcome) for t in TRIALS), "states_noise": True}
    return Claim(**{**fields, **changes})


def test_a_claim_with_the_evidence_interval_and_tasks_passes() -> None:
    assert check_claim(_claim(), TRIALS).resolved == 2
    # an older summary states neither: not checked
    assert check_claim(_claim(interval=None, tasks=None, states_noise=False), TRIALS).resolved == 2


@pytest.mark.parametrize(("changes", "rule"), [
    ({"interval": ScoreInterval(low=0.5, high=0.9)},
     "summary.interval: [0.5, 0.9] in summary.json, [0.20766, 0.938508] from the trial evidence"),
    ({"interval": None}, "summary.interval: None in summary.json, [0.20766, 0.938508] from the trial evidence"),
    ({"tasks": {**task_counts((t.task, t.grade.outcome) for t in TRIALS),
                "fail": TaskCounts(attempts=1, completed=1, resolved=1)}},
     "summary.tasks[fail]: {'attempts': 1, 'completed': 1, 'resolved': 1} in summary.json, "
     "{'attempts': 1, 'completed': 1, 'resolved': 0} from the trial evidence"),
    ({"tasks": {"hello": TaskCounts(attempts=1, completed=1, resolved=1)}},
     "summary.tasks[fail]: None in summary.json"),
    ({"tasks": {**task_counts((t.task, t.grade.outcome) for t in TRIALS),
                "extra": TaskCounts(attempts=1, completed=0, resolved=0)}},
     "summary.tasks[extra]: {'attempts': 1, 'completed': 0, 'resolved': 0} in summary.json, None from"),
    ({"tasks": None}, "summary.tasks[fail]: None in summary.json"),
])
def test_a_claim_the_trials_do_not_support_fails_in_one_line(changes: dict[str, Any], rule: str) -> None:
    with pytest.raises(CheckFailed) as caught:
        check_claim(_claim(**changes), TRIALS)
    assert rule in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_an_unscored_claim_is_not_held_to_an_interval_or_task_counts() -> None:
    # No score, no claim the noise qualifies: a run that did not succeed may count trials as infra
    # errors the evidence cannot show (a timeout), and its interval is null as written.
    counts = count(["resolved", "unresolved", "infra_error"])
    trials = (ClaimedTrial("hello", "hello__r1", "resolved", 1.0), ClaimedTrial("fail", "fail__r1", "unresolved", 0.0),
              ClaimedTrial("solve", "solve__r1", "infra_error", None))  # a timeout the evidence cannot show
    tasks = task_counts([("hello", "resolved"), ("fail", "unresolved"), ("solve", "infra_error")])
    claim = _claim(status="INFRA_ERROR", counts=counts, score=None, trials=trials, interval=None, tasks=tasks)
    assert check_claim(claim, TRIALS) == counts
    assert check_claim(_claim(status="INFRA_ERROR", counts=counts, score=None, trials=trials, tasks=None,
                              interval=ScoreInterval(low=0.1, high=0.9)), TRIALS) == counts
