"""Issue 22.5: the one grading rule (pipeline.core.scoring.grade_result), as the worker's grader applies it.

Before, the grader read result.json with Python's lenient json (NaN, duplicate keys: the last wins),
counted ``reward: true`` or ``2`` as resolved, ignored an ``exception_info`` that was not an object,
and crashed on a result.json that was not an object or had timestamps it could not parse.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.scoring import grade_result
from pipeline.infra.worker.grading import AGENT_EXCEPTIONS, RunnerInfo, grade_trial

REAL = json.loads((Path(__file__).parent / "data" / "harbor-result.json").read_text())
RUNNER = RunnerInfo(image_id=None, digest=None)


def _with(reward: Any = 1.0, exception: Any = None, **extra: Any) -> bytes:
    data = {**json.loads(json.dumps(REAL)), "verifier_result": {"rewards": {"reward": reward}},
            "exception_info": exception, **extra}
    return json.dumps(data).encode()


def _grade(tmp_path: Path, raw: bytes) -> tuple[str, float | None, str | None]:
    path = tmp_path / "t__1" / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    record = grade_trial(path, "t", "t__1", "oracle", RUNNER, "0.26.0")
    return record.outcome, record.reward, record.exception_type


CASES: dict[str, tuple[bytes, tuple[str, float | None, str | None]]] = {
    "resolved": (_with(1.0), ("resolved", 1.0, None)),
    "integer 1": (_with(1), ("resolved", 1.0, None)),
    "unresolved": (_with(0.0), ("unresolved", 0.0, None)),
    "partial": (_with(0.5), ("unresolved", 0.5, None)),
    "agent timeout, no reward": (_with(None, {"exception_type": "AgentTimeoutError"}),
                                 ("unresolved", None, "AgentTimeoutError")),
    "environment error with reward 1": (_with(1.0, {"exception_type": "EnvironmentStartTimeoutError"}),
                                        ("infra_error", 1.0, "EnvironmentStartTimeoutError")),
    "reward true": (_with(True), ("infra_error", None, "InvalidReward")),
    "reward string": (_with("1"), ("infra_error", None, "InvalidReward")),
    "reward 2": (_with(2), ("infra_error", None, "InvalidReward")),
    "reward -1": (_with(-1), ("infra_error", None, "InvalidReward")),
    "reward list": (_with([1]), ("infra_error", None, "InvalidReward")),
    "agent error and reward 2": (_with(2, {"exception_type": "AgentTimeoutError"}),
                                 ("infra_error", None, "AgentTimeoutError")),
    "reward NaN": (_with(1.0).replace(b'"reward": 1.0', b'"reward": NaN'), ("infra_error", None, "UnreadableTrialResult")),
    "duplicate reward": (_with(0.0).replace(b'"reward": 0.0', b'"reward": 0.0, "reward": 1.0'),
                         ("infra_error", None, "UnreadableTrialResult")),
    "exception a string": (_with(1.0, "boom"), ("infra_error", 1.0, "MalformedExceptionInfo")),
    "exception type not a string": (_with(1.0, {"exception_type": 7}), ("infra_error", 1.0, "MalformedExceptionInfo")),
    "exception empty object": (_with(1.0, {}), ("infra_error", 1.0, "MalformedExceptionInfo")),
    "verifier_result a list": (json.dumps({**REAL, "verifier_result": [1]}).encode(), ("infra_error", None, "NoReward")),
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


def test_a_missing_result_is_an_infra_error(tmp_path: Path) -> None:
    record = grade_trial(tmp_path / "none" / "result.json", "t", "t__1", "oracle", RUNNER, None)
    assert (record.outcome, record.exception_type) == ("infra_error", "MissingTrialResult")
    assert grade_result(None).exception_type == "MissingTrialResult"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)


@given(reward=_json, exception=st.one_of(st.none(), st.sampled_from(sorted(AGENT_EXCEPTIONS)).map(
    lambda t: {"exception_type": t}), _json), verifier=st.one_of(st.just("ok"), _json))
def test_any_result_grades_without_raising_and_only_a_valid_reward_of_one_resolves(reward: Any, exception: Any,
                                                                                   verifier: Any) -> None:
    data = {"verifier_result": {"rewards": {"reward": reward}} if verifier == "ok" else verifier,
            "exception_info": exception}
    graded = grade_result(json.dumps(data, allow_nan=True).encode())
    assert graded.outcome in ("resolved", "unresolved", "infra_error")
    assert graded.reward is None or (math.isfinite(graded.reward) and 0.0 <= graded.reward <= 1.0)
    if graded.outcome == "resolved":
        assert graded.reward == 1.0 and verifier == "ok" and type(reward) in (int, float) and reward == 1
        assert exception is None or exception.get("exception_type") in AGENT_EXCEPTIONS
