"""Issue 26.2: `benchseal verify` checks summary.json's score interval and per-task counts against the
re-graded trials (tests.fixtures.sigstore.signed_release: hello resolved, fail unresolved, score 0.5).

Each tampered summary is RE-SIGNED with the right identity, so only the re-grading can catch it; a summary
written before these fields existed (neither key) still verifies.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import ClaimNotSupported
from pipeline.verify.release import VerifiedRelease
from tests.verify.test_verify_consistency import _resign

pytestmark = pytest.mark.slow
Verify = Callable[[Path], VerifiedRelease]


def test_the_sealed_summary_states_them_and_verifies(release_copy: Path, verify: Verify) -> None:
    summary = json.loads((release_copy / "summary.json").read_text())
    assert summary["interval"] == {"low": 0.094531, "high": 0.905469, "confidence": 0.95, "method": "wilson"}
    assert summary["tasks"] == {"fail": {"attempts": 1, "completed": 1, "resolved": 0},
                                "hello": {"attempts": 1, "completed": 1, "resolved": 1}}
    verify(release_copy)


def test_an_older_summary_without_them_verifies(release_copy: Path, signer_v1: object, verify: Verify) -> None:
    def older(s: dict[str, Any]) -> None:
        del s["interval"], s["tasks"]
    _resign(release_copy, signer_v1, summary=older)
    verify(release_copy)


def _narrow(s: dict[str, Any]) -> None:
    s["interval"].update(low=0.4, high=0.6)


def _fail_passed(s: dict[str, Any]) -> None:
    s["tasks"]["fail"]["resolved"] = 1


CASES: dict[str, Callable[[dict[str, Any]], None]] = {
    "a narrower interval": _narrow,
    "the interval dropped": lambda s: s.update(interval=None),
    "a task's passes raised": _fail_passed,
    "a task dropped": lambda s: s["tasks"].pop("hello"),
    "the tasks dropped": lambda s: s.pop("tasks"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_resigned_summary_whose_noise_the_trials_do_not_give_is_refused(
        case: str, release_copy: Path, signer_v1: object, verify: Verify) -> None:
    _resign(release_copy, signer_v1, summary=CASES[case])
    with pytest.raises(ClaimNotSupported) as caught:  # the re-grade's rule, not the summary model's
        verify(release_copy)
    assert caught.value.subject == "summary.json" and "\n" not in str(caught.value), caught.value
