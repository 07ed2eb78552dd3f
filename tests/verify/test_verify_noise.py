"""Issue 26.2: `benchseal verify` checks summary.json's score interval and per-task counts against the
re-graded trials (tests.fixtures.sigstore.signed_release: hello resolved, fail unresolved, score 0.5).

Each tampered summary is RE-SIGNED with the right identity, so only the re-grading can catch it; a summary
written before these fields existed (neither key) still verifies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import CheckFailed
from pipeline.verify.release import verify_release
from tests.verify.test_verify_consistency import _resign

pytestmark = pytest.mark.slow


@pytest.fixture()
def root(sigstore_instance: object) -> Path:
    return sigstore_instance.trusted_root  # type: ignore[attr-defined,no-any-return]


def _verify(release: Path, root: Path) -> None:
    verify_release(release, repository="acme/widget", tag="v9.9.9", trusted_root=root, offline=True)


def test_the_sealed_summary_states_them_and_verifies(release_copy: Path, root: Path) -> None:
    summary = json.loads((release_copy / "summary.json").read_text())
    assert summary["interval"] == {"low": 0.094531, "high": 0.905469, "confidence": 0.95, "method": "wilson"}
    assert summary["tasks"] == {"fail": {"attempts": 1, "completed": 1, "resolved": 0},
                                "hello": {"attempts": 1, "completed": 1, "resolved": 1}}
    _verify(release_copy, root)


def test_an_older_summary_without_them_verifies(release_copy: Path, signer_v1: object, root: Path) -> None:
    def older(s: dict[str, Any]) -> None:
        del s["interval"], s["tasks"]
    _resign(release_copy, signer_v1, summary=older)
    _verify(release_copy, root)


def _narrow(s: dict[str, Any]) -> None:
    s["interval"].update(low=0.4, high=0.6)


def _fail_passed(s: dict[str, Any]) -> None:
    s["tasks"]["fail"]["resolved"] = 1


CASES = {
    "a narrower interval": (_narrow, "summary.interval: [0.4, 0.6] in summary.json, [0.094531, 0.905469] from the "
                                     "trial evidence"),
    "the interval dropped": (lambda s: s.update(interval=None), "summary.interval: None in summary.json"),
    "a task's passes raised": (_fail_passed, "summary.tasks[fail]: {'attempts': 1, 'completed': 1, 'resolved': 1} "
                                             "in summary.json, {'attempts': 1, 'completed': 1, 'resolved': 0} from"),
    "a task dropped": (lambda s: s["tasks"].pop("hello"), "summary.tasks[hello]: None in summary.json"),
    "the tasks dropped": (lambda s: s.pop("tasks"), "summary.tasks[fail]: None in summary.json"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_resigned_summary_whose_noise_the_trials_do_not_give_is_refused(
        case: str, release_copy: Path, signer_v1: object, root: Path) -> None:
    change, rule = CASES[case]
    _resign(release_copy, signer_v1, summary=change)
    with pytest.raises(CheckFailed) as caught:
        _verify(release_copy, root)
    assert rule in str(caught.value) and "\n" not in str(caught.value), caught.value
