"""The one grading rule (pipeline.core.scoring.grade_result), as the worker's grader applies it.

Issue 22.5: strict JSON, no ``reward: true`` or ``2`` as resolved, no crash on odd results.
Issue 35: the reward comes from benchseal's grader (the test command's exit status beside it), never
from a reward file's value; a failure once the agent has started is the agent's (unresolved, in the
denominator) unless the machinery itself recorded it; before the agent starts, everything is the
infrastructure's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.scoring import GRADER_EXIT_KEY, GRADER_TIMEOUT_KEY, INFRA_EXCEPTIONS, REWARD_KEY, grade_result
from pipeline.infra.worker.grading import RunnerInfo, grade_trial
from tests.fixtures.trials import grader_rewards

REAL = json.loads((Path(__file__).parent / "data" / "harbor-result.json").read_text())
RUNNER = RunnerInfo(image_id=None, digest=None)


def _with(reward: Any = 1.0, exception: Any = None, rewards: Any = None, **extra: Any) -> bytes:
    data = {**json.loads(json.dumps(REAL)),
            "verifier_result": {"rewards": grader_rewards(reward) if rewards is None else rewards},
            "exception_info": exception, **extra}
    return json.dumps(data).encode()


def _verdict(reward: Any, exit_status: Any, timed_out: Any = 0) -> dict[str, Any]:
    return {REWARD_KEY: reward, GRADER_EXIT_KEY: exit_status, GRADER_TIMEOUT_KEY: timed_out}


def _grade(tmp_path: Path, raw: bytes) -> tuple[str, float | None, str | None]:
    path = tmp_path / "t__1" / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    record = grade_trial(path, "t", "t__1", "oracle", RUNNER, "0.26.0")
    return record.outcome, record.reward, record.exception_type


NOT_STARTED = {"agent_setup": None, "agent_execution": None}
CASES: dict[str, tuple[bytes, tuple[str, float | None, str | None]]] = {
    "resolved": (_with(1.0), ("resolved", 1.0, None)),
    "integer 1": (_with(1), ("resolved", 1.0, None)),
    "unresolved": (_with(0.0), ("unresolved", 0.0, None)),
    # What Harbor's own verifier returns: the value of a reward file the graded code could write.
    "a reward file's 1": (_with(rewards={"reward": 1.0}), ("unresolved", None, "RewardNotFromGrader")),
    "a reward file's 1 beside a test output": (_with(rewards={"reward": 1, "tests_passed": 3}),
                                               ("unresolved", None, "RewardNotFromGrader")),
    "partial": (_with(rewards={"reward": 0.5}), ("unresolved", None, "RewardNotFromGrader")),
    "reward 1 but the tests failed": (_with(rewards=_verdict(1, 1)), ("unresolved", None, "RewardNotFromGrader")),
    "reward 1 but the tests timed out": (_with(rewards=_verdict(1, 0, 1)), ("unresolved", None, "RewardNotFromGrader")),
    "reward 0 although the tests passed": (_with(rewards=_verdict(0, 0)), ("unresolved", None, "RewardNotFromGrader")),
    "exit status a boolean": (_with(rewards=_verdict(1, False)), ("unresolved", None, "RewardNotFromGrader")),
    "exit status a string": (_with(rewards=_verdict(1, "0")), ("unresolved", None, "RewardNotFromGrader")),
    "timed out 2": (_with(rewards=_verdict(0, -1, 2)), ("unresolved", None, "RewardNotFromGrader")),
    "a key too many": (_with(rewards={**_verdict(1, 0), "bonus": 1}), ("unresolved", None, "RewardNotFromGrader")),
    "the tests timed out": (_with(rewards=_verdict(0, -1, 1)), ("unresolved", 0.0, None)),
    "agent timeout, no reward": (_with(None, {"exception_type": "AgentTimeoutError"}, rewards={}),
                                 ("unresolved", None, "AgentTimeoutError")),
    "the agent's own KeyError, graded 0": (_with(0, {"exception_type": "KeyError"}), ("unresolved", 0.0, "KeyError")),
    "the agent's own KeyError, not graded": (_with(rewards={}, exception={"exception_type": "KeyError"}),
                                             ("unresolved", None, "KeyError")),
    "the agent's crash, yet solved": (_with(1, {"exception_type": "KeyError"}), ("resolved", 1.0, "KeyError")),
    "Harbor's verifier timeout": (_with(rewards={}, exception={"exception_type": "VerifierTimeoutError"}),
                                  ("unresolved", None, "VerifierTimeoutError")),
    "a verifier crash on what the agent left": (_with(rewards={}, exception={"exception_type": "RuntimeError"}),
                                                ("unresolved", None, "RuntimeError")),
    "an infrastructure name the agent cannot raise, after the start": (
        _with(1.0, {"exception_type": "EnvironmentStartTimeoutError"}),
        ("infra_error", None, "EnvironmentStartTimeoutError")),
    "the grader's fault": (_with(rewards={}, exception={"exception_type": "GraderFault"}),
                           ("infra_error", None, "GraderFault")),
    "the engine's fault": (_with(rewards={}, exception={"exception_type": "EngineFault"}),
                           ("infra_error", None, "EngineFault")),
    "the agent never started": (_with(1.0, {"exception_type": "RuntimeError"}, **NOT_STARTED),
                                ("infra_error", None, "RuntimeError")),
    "the agent never started, no exception": (_with(1.0, **NOT_STARTED), ("infra_error", None, "AgentNeverStarted")),
    "agent setup without a start time": (_with(1.0, agent_setup={"finished_at": "x"}),
                                         ("infra_error", None, "AgentNeverStarted")),
    "reward true": (_with(rewards=_verdict(True, 0)), ("unresolved", None, "InvalidReward")),
    "reward string": (_with(rewards=_verdict("1", 0)), ("unresolved", None, "InvalidReward")),
    "reward 2": (_with(rewards=_verdict(2, 0)), ("unresolved", None, "InvalidReward")),
    "reward -1": (_with(rewards=_verdict(-1, 0)), ("unresolved", None, "InvalidReward")),
    "reward list": (_with(rewards=_verdict([1], 0)), ("unresolved", None, "InvalidReward")),
    "agent error and reward 2": (_with(rewards=_verdict(2, 0), exception={"exception_type": "AgentTimeoutError"}),
                                 ("unresolved", None, "AgentTimeoutError")),
    "reward NaN": (_with(1.0).replace(b'"reward": 1.0', b'"reward": NaN'), ("infra_error", None, "UnreadableTrialResult")),
    "duplicate reward": (_with(0.0).replace(b'"reward": 0.0', b'"reward": 0.0, "reward": 1.0'),
                         ("infra_error", None, "UnreadableTrialResult")),
    "exception a string": (_with(1.0, "boom"), ("infra_error", None, "MalformedExceptionInfo")),
    "exception type not a string": (_with(1.0, {"exception_type": 7}), ("infra_error", None, "MalformedExceptionInfo")),
    "exception empty object": (_with(1.0, {}), ("infra_error", None, "MalformedExceptionInfo")),
    "verifier_result a list": (json.dumps({**REAL, "verifier_result": [1]}).encode(), ("unresolved", None, "NoReward")),
    "a list": (b"[1]", ("infra_error", None, "UnreadableTrialResult")),
    "a string": (b'"resolved"', ("infra_error", None, "UnreadableTrialResult")),
    "bad timestamps": (_with(1.0, started_at="yesterday", finished_at=5), ("resolved", 1.0, None)),
    "phases with bad times": (_with(1.0, agent_execution={"started_at": "x", "finished_at": "y"}), ("resolved", 1.0, None)),
    "agent_info a list": (_with(1.0, agent_info=["oracle"]), ("resolved", 1.0, None)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_grader_applies_the_one_rule(case: str, tmp_path: Path) -> None:
    raw, expected = CASES[case]
    assert _grade(tmp_path, raw) == expected
    graded = grade_result(raw)  # the seal job's and verify's view of the same bytes
    assert (graded.outcome, graded.reward, graded.exception_type) == expected
    assert (graded.reason is None) == (graded.outcome == "resolved")  # every failure says why, in one line
    assert graded.reason is None or "\n" not in graded.reason


def test_a_missing_result_is_an_infra_error(tmp_path: Path) -> None:
    record = grade_trial(tmp_path / "none" / "result.json", "t", "t__1", "oracle", RUNNER, None)
    assert (record.outcome, record.exception_type) == ("infra_error", "MissingTrialResult")
    assert grade_result(None).exception_type == "MissingTrialResult"


def test_a_failure_reason_names_what_failed(tmp_path: Path) -> None:
    assert grade_result(_with(0.0)).reason == "the tests failed (exit status 1)"
    assert grade_result(_with(rewards=_verdict(0, -1, 1))).reason == \
        "the tests did not finish within the verifier's time limit"
    crashed = grade_result(_with(rewards={}, exception={"exception_type": "KeyError", "exception_message": "'x'"}))
    assert crashed.reason == "agent phase: KeyError: 'x'; not graded (no verdict from the grader)"
    assert "never trusted" in (grade_result(_with(rewards={"reward": 1})).reason or "")


def test_a_long_failure_keeps_its_cause_at_the_end() -> None:
    """The engine's 400 to a verifier container's create lost its cause to the reason's bound (the SDK's text led
    with the request URL, the cause came after a long bind path): a long message keeps its head and its tail."""
    path = "/tmp/pytest-of-root/pytest-1514/popen-gw1/hostile-corpus0/home2/infra/runs/run-790d242633d0c234fbb9" \
           "/batches/0000-aa5c21f90880/agent"
    message = (f"starting the environment cli-flag__33d0c234fbb9__verifier__grade failed: APIError: the engine answered 400: "
               f"invalid mount config for type \"bind\": stat {path}: permission denied")
    graded = grade_result(_with(0.0, exception={"exception_type": "EngineFault", "exception_message": message}))
    reason = graded.reason or ""
    assert graded.outcome == "infra_error" and "\n" not in reason, graded
    assert reason.startswith("infrastructure: EngineFault: starting the environment cli-flag__33d0c234fbb9__verifier")
    assert reason.endswith("/agent: permission denied") and " … " in reason, reason
    assert len(reason) <= len("infrastructure: EngineFault: ") + 200


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)


@given(reward=_json, exit_status=_json, timed_out=_json,
       exception=st.one_of(st.none(), st.text(max_size=12).map(lambda t: {"exception_type": t}), _json),
       verifier=st.one_of(st.just("ok"), _json), started=st.booleans())
def test_any_result_grades_without_raising_and_only_the_graders_pass_resolves(
        reward: Any, exit_status: Any, timed_out: Any, exception: Any, verifier: Any, started: bool) -> None:
    data = {"verifier_result": {"rewards": _verdict(reward, exit_status, timed_out)} if verifier == "ok" else verifier,
            "exception_info": exception, "agent_setup": {"started_at": "2026-12-02T14:11:50Z"} if started else None}
    graded = grade_result(json.dumps(data, allow_nan=True).encode())
    assert graded.outcome in ("resolved", "unresolved", "infra_error")
    assert graded.reward is None or (math.isfinite(graded.reward) and 0.0 <= graded.reward <= 1.0)
    if graded.outcome == "resolved":
        assert started and verifier == "ok" and type(reward) in (int, float) and reward == 1
        assert type(exit_status) is int and exit_status == 0 and type(timed_out) is int and timed_out == 0
    if graded.outcome == "infra_error":
        # Once the agent has started, only the machinery's own failures leave the denominator.
        assert not started or graded.exception_type in INFRA_EXCEPTIONS | {"MalformedExceptionInfo", "UnreadableTrialResult"}


def test_a_claim_counts_no_canary_and_a_resolved_canary_refuses_a_score() -> None:
    """What the seal job and ``benchseal verify`` recompute: canaries stay out of the counts, and evidence
    showing a resolved canary refuses a SUCCEEDED claim (the run was tampered with)."""
    from pipeline.core.contracts import GradeCounts
    from pipeline.core.errors import CheckFailed
    from pipeline.core.scoring import Claim, ClaimedTrial, EvidenceTrial, check_claim

    def trials(canary_reward: float) -> tuple[EvidenceTrial, ...]:
        return (EvidenceTrial("a", "a__1", grade_result(_with(1.0))),
                EvidenceTrial("c", "c__1", grade_result(_with(canary_reward)), canary=True))

    counts = GradeCounts(total=1, completed=1, resolved=1, unresolved=0, infra_errors=0)
    claim = Claim(document="grading.json", label="grading", run_id="run-1", status="SUCCEEDED", counts=counts,
                  score=1.0, trials=(ClaimedTrial("a", "a__1", "resolved", 1.0), ClaimedTrial("c", "c__1", "unresolved", 0.0)))
    assert check_claim(claim, trials(0.0)) == counts
    with pytest.raises(CheckFailed, match="tamper canary c resolved"):
        check_claim(claim, trials(1.0))
