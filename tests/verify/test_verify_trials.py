"""Issue 22.5: `benchseal verify` re-grades the trials a release ships, with the worker's own rule.

Every case tampers a sealed release (tests.fixtures.sigstore.signed_release: SUCCEEDED, hello resolved,
fail unresolved, score 0.5, with its trial evidence) and RE-SIGNS what it changed with the right
identity (the test's signer): every signature verifies, so only the re-grading can catch it. Each is
checked on the release as published (flat: only the top-level files), and before this change each verified.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import ClaimNotSupported, EvidenceMissing, ReleaseRefused, TrialEvidenceMismatch
from pipeline.evidence.writer import reseal
from pipeline.verify.release import VerifiedRelease
from tests.fixtures.trials import flat_release, grader_rewards
from tests.verify.test_verify_consistency import _resign

pytestmark = pytest.mark.slow
HELLO, FAIL = "hello__evidence0001", "fail__evidence0001"
RESULT = "evidence/harbor/{}/result.json"


@pytest.fixture()
def flat(tmp_path: Path, signed_release: Path) -> Path:
    return flat_release(signed_release, tmp_path / "flat")


Verify = Callable[[Path], VerifiedRelease]


def _refused(release: Path, verify: Verify, rule: type[ReleaseRefused], subject: str) -> None:
    """Refused by exactly ``rule`` (its class, not its wording), on ``subject``, in one line."""
    with pytest.raises(ReleaseRefused) as caught:
        verify(release)
    assert type(caught.value) is rule and caught.value.subject == subject, repr(caught.value)
    assert "\n" not in str(caught.value)


def test_the_untampered_flat_release_verifies(flat: Path, verify: Verify) -> None:
    verify(flat)


# --- summary.json re-signed with a score the trials do not support ---------------------------------

def _trial(summary: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in summary["timings"]["trials"] if t["trial"] == name)  # type: ignore[no-any-return]


def _all_resolved(s: dict[str, Any]) -> None:
    _trial(s, FAIL).update(outcome="resolved", reward=1.0)
    s.update(counts={"total": 2, "completed": 2, "resolved": 2, "unresolved": 0, "infra_errors": 0}, score=1.0)


def _rename(s: dict[str, Any]) -> None:
    _trial(s, FAIL)["trial"] = "fail__otherrun0001"


def _drop(s: dict[str, Any]) -> None:
    s["timings"]["trials"] = [_trial(s, HELLO)]
    s.update(counts={"total": 1, "completed": 1, "resolved": 1, "unresolved": 0, "infra_errors": 0}, score=1.0)


def _twice(s: dict[str, Any]) -> None:
    s["timings"]["trials"] = [_trial(s, HELLO), _trial(s, HELLO)]
    s.update(counts={"total": 2, "completed": 2, "resolved": 2, "unresolved": 0, "infra_errors": 0}, score=1.0)


def _infra_error(s: dict[str, Any]) -> None:
    _trial(s, FAIL).update(outcome="infra_error", reward=None)
    s.update(counts={"total": 2, "completed": 1, "resolved": 1, "unresolved": 0, "infra_errors": 1}, score=1.0)


# What each forgery changes in summary.json (every one is refused by the re-grade: ClaimNotSupported).
SUMMARY_CASES: dict[str, Callable[[dict[str, Any]], None]] = {
    "every trial and count forged": _all_resolved,
    "counts and score only": lambda s: s.update(counts={**s["counts"], "resolved": 2, "unresolved": 0}, score=1.0),
    "a trial renamed": _rename,
    "a trial dropped": _drop,
    "a trial twice": _twice,
    "a reward changed": lambda s: _trial(s, FAIL).update(reward=0.5),
    "a task changed": lambda s: _trial(s, FAIL).update(task="hello"),
    "an infra error on SUCCEEDED": _infra_error,
}


@pytest.mark.parametrize("case", list(SUMMARY_CASES))
def test_a_resigned_summary_the_trials_do_not_support_is_refused(case: str, release_copy: Path, tmp_path: Path,
                                                                 signer_v1: object, verify: Verify) -> None:
    _resign(release_copy, signer_v1, summary=SUMMARY_CASES[case])
    _refused(release_copy, verify, ClaimNotSupported, "summary.json")  # in the run dir
    _refused(flat_release(release_copy, tmp_path / "flat"), verify, ClaimNotSupported, "summary.json")  # as published


# --- trial-results.json / evidence-SHA256SUMS tampered, SHA256SUMS re-signed -----------------------

def _results(release: Path) -> dict[str, Any]:
    return json.loads((release / "trial-results.json").read_text())  # type: ignore[no-any-return]


def _entry(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in data["files"] if f["name"] == name)  # type: ignore[no-any-return]


def _resolved_result(trial: str) -> bytes:
    return json.dumps({"trial_name": trial, "verifier_result": {"rewards": grader_rewards(1.0)},
                       "exception_info": None, "agent_setup": {"started_at": "2026-12-02T14:11:50Z"}}).encode()


def _set_content(entry: dict[str, Any], raw: bytes) -> None:
    entry.update(content=base64.b64encode(raw).decode(), sha256=hashlib.sha256(raw).hexdigest())


def _write(release: Path, data: dict[str, Any]) -> None:
    (release / "trial-results.json").write_text(json.dumps(data))


def _swap_result(release: Path) -> None:
    data = _results(release)
    _set_content(_entry(data, RESULT.format(FAIL)), _resolved_result(FAIL))
    _write(release, data)


def _swap_result_and_listing(release: Path) -> None:
    """The trial evidence itself re-made to say resolved (the run dir's file too, so evidence-SHA256SUMS
    lists it when resealed), the summary left saying 0.5."""
    _swap_result(release)
    (release / RESULT.format(FAIL)).write_bytes(_resolved_result(FAIL))


def _drop_result(release: Path) -> None:
    data = _results(release)
    data["files"] = [f for f in data["files"] if f["name"] != RESULT.format(FAIL)]
    _write(release, data)


def _duplicate(release: Path) -> None:
    data = _results(release)
    data["files"].append(_entry(data, RESULT.format(HELLO)))
    _write(release, data)


def _foreign(name: str) -> Callable[[Path], None]:
    def change(release: Path) -> None:
        data = _results(release)
        data["files"].append({**_entry(data, RESULT.format(HELLO)), "name": name})
        _write(release, data)
    return change


def _field(key: str, value: Any) -> Callable[[Path], None]:
    def change(release: Path) -> None:
        data = _results(release)
        if key == "content":
            _entry(data, RESULT.format(FAIL))["content"] = value
        else:
            data[key] = value
        _write(release, data)
    return change


def _delete(name: str) -> Callable[[Path], None]:
    return lambda release: (release / name).unlink()


def _no_plan(release: Path) -> None:
    data = _results(release)
    data["files"] = [f for f in data["files"] if f["name"] != "evidence/trials.json"]
    _write(release, data)
    (release / "evidence" / "trials.json").unlink()


# Each case and the rule that refuses it: the carried bytes against their listing, the carried names, the
# model and the plan are TrialEvidenceMismatch; a result whose listing was replaced too is caught by the re-grade.
TR = "trial-results.json"
RESULTS_CASES: dict[str, tuple[Callable[[Path], None], type[ReleaseRefused], str]] = {
    "a result replaced": (_swap_result, TrialEvidenceMismatch, TR),
    "the result and its listing replaced": (_swap_result_and_listing, ClaimNotSupported, "summary.json"),
    "a result left out": (_drop_result, TrialEvidenceMismatch, TR),
    "a result twice": (_duplicate, TrialEvidenceMismatch, TR),
    "a file deeper in a trial dir": (_foreign(f"evidence/harbor/{HELLO}/agent/result.json"), TrialEvidenceMismatch, TR),
    "a name outside the evidence": (_foreign("../result.json"), TrialEvidenceMismatch, TR),
    "content not base64": (_field("content", "not base64!"), TrialEvidenceMismatch, TR),
    "another run's results": (_field("run_id", "run-other"), TrialEvidenceMismatch, TR),
    "an unknown key": (_field("extra", 1), TrialEvidenceMismatch, TR),
    "no schema": (lambda r: _write(r, {k: v for k, v in _results(r).items() if k != "schema"}),
                  TrialEvidenceMismatch, TR),
    "trial-results.json deleted": (_delete("trial-results.json"), EvidenceMissing, TR),
    "evidence-SHA256SUMS deleted": (_delete("evidence-SHA256SUMS"), TrialEvidenceMismatch, TR),
    "the plan removed": (_no_plan, TrialEvidenceMismatch, TR),
}


@pytest.mark.parametrize("case", list(RESULTS_CASES))
def test_tampered_trial_results_are_refused(case: str, release_copy: Path, tmp_path: Path, signer_v1: object,
                                            verify: Verify) -> None:
    """Tampered in the run dir and resealed there (evidence-SHA256SUMS is re-made from the trial dirs);
    refused as published. Resealing a flat release drops evidence-SHA256SUMS: that is the last case."""
    change, rule, subject = RESULTS_CASES[case]
    if case == "evidence-SHA256SUMS deleted":
        flat = flat_release(release_copy, tmp_path / "flat")
        change(flat)
        reseal(flat, signer=signer_v1)  # type: ignore[arg-type]
    else:
        change(release_copy)
        reseal(release_copy, signer=signer_v1)  # type: ignore[arg-type]
        flat = flat_release(release_copy, tmp_path / "flat")
    _refused(flat, verify, rule, subject)
