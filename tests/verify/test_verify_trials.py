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

from pipeline.core.errors import CheckFailed
from pipeline.evidence.writer import reseal
from pipeline.verify.release import verify_release
from tests.fixtures.trials import flat_release, grader_rewards
from tests.verify.test_verify_consistency import _resign

pytestmark = pytest.mark.slow
SOURCE_REPO, SOURCE_TAG = "acme/widget", "v9.9.9"
HELLO, FAIL = "hello__evidence0001", "fail__evidence0001"
RESULT = "evidence/harbor/{}/result.json"


@pytest.fixture()
def root(sigstore_instance: object) -> Path:
    return sigstore_instance.trusted_root  # type: ignore[attr-defined,no-any-return]


@pytest.fixture()
def flat(tmp_path: Path, signed_release: Path) -> Path:
    return flat_release(signed_release, tmp_path / "flat")


def _verify(release: Path, root: Path) -> None:
    verify_release(release, repository=SOURCE_REPO, tag=SOURCE_TAG, trusted_root=root, offline=True)


def _refused(release: Path, root: Path, rule: str) -> None:
    with pytest.raises(CheckFailed) as caught:
        _verify(release, root)
    assert rule in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_the_untampered_flat_release_verifies(flat: Path, root: Path) -> None:
    _verify(flat, root)


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


SUMMARY_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "every trial and count forged": (_all_resolved, f"summary.trials[{FAIL}].outcome: 'resolved' in summary.json, "
                                                    "'unresolved' from the trial evidence"),
    "counts and score only": (lambda s: s.update(counts={**s["counts"], "resolved": 2, "unresolved": 0}, score=1.0),
                              "summary.resolved: 2 in summary.json, 1 from the trial evidence"),
    "a trial renamed": (_rename, "summary.trials: fail__otherrun0001 is in summary.json, but no such trial is planned"),
    "a trial dropped": (_drop, f"summary.trials: {FAIL} is planned in the trial evidence, but summary.json does not"),
    "a trial twice": (_twice, f"summary.trials: {HELLO} is listed twice in summary.json"),
    "a reward changed": (lambda s: _trial(s, FAIL).update(reward=0.5),
                         f"summary.trials[{FAIL}].reward: 0.5 in summary.json, 0.0 from the trial evidence"),
    "a task changed": (lambda s: _trial(s, FAIL).update(task="hello"),
                       f"summary.trials[{FAIL}].task: 'hello' in summary.json, 'fail' from the trial evidence"),
    "an infra error on SUCCEEDED": (
        lambda s: (_trial(s, FAIL).update(outcome="infra_error", reward=None),
                   s.update(counts={"total": 2, "completed": 1, "resolved": 1, "unresolved": 0, "infra_errors": 1},
                            score=1.0)),
        f"summary.trials[{FAIL}].outcome: 'infra_error' in summary.json, 'unresolved' from the trial evidence"),
}


@pytest.mark.parametrize("case", list(SUMMARY_CASES))
def test_a_resigned_summary_the_trials_do_not_support_is_refused(case: str, release_copy: Path, tmp_path: Path,
                                                                 signer_v1: object, root: Path) -> None:
    change, rule = SUMMARY_CASES[case]
    _resign(release_copy, signer_v1, summary=change)
    _refused(release_copy, root, rule)  # in the run dir
    _refused(flat_release(release_copy, tmp_path / "flat"), root, rule)  # and as published


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


RESULTS_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "a result replaced": (_swap_result, f"trial-results.json: {RESULT.format(FAIL)}: its bytes"),
    "the result and its listing replaced": (_swap_result_and_listing, f"summary.trials[{FAIL}].outcome: 'unresolved' "
                                                                      "in summary.json, 'resolved' from the trial"),
    "a result left out": (_drop_result, f"evidence-SHA256SUMS: lists {RESULT.format(FAIL)}, but trial-results.json "
                                        "does not carry it"),
    "a result twice": (_duplicate, f"trial-results.json: {RESULT.format(HELLO)} is carried twice"),
    "a file deeper in a trial dir": (_foreign(f"evidence/harbor/{HELLO}/agent/result.json"), "is neither"),
    "a name outside the evidence": (_foreign("../result.json"), "is neither"),
    "content not base64": (_field("content", "not base64!"), "content is not base64"),
    "another run's results": (_field("run_id", "run-other"), "trial-results.json: run_id 'run-other'"),
    "an unknown key": (_field("extra", 1), "trial-results.json: extra"),
    "no schema": (lambda r: _write(r, {k: v for k, v in _results(r).items() if k != "schema"}),
                  "trial-results.json: schema"),
    "trial-results.json deleted": (_delete("trial-results.json"), "trial-results.json: missing"),
    "evidence-SHA256SUMS deleted": (_delete("evidence-SHA256SUMS"), "are not what evidence-SHA256SUMS lists (nothing)"),
    "the plan removed": (_no_plan, "evidence/trials.json: missing from the trial evidence"),
}


@pytest.mark.parametrize("case", list(RESULTS_CASES))
def test_tampered_trial_results_are_refused(case: str, release_copy: Path, tmp_path: Path, signer_v1: object,
                                            root: Path) -> None:
    """Tampered in the run dir and resealed there (evidence-SHA256SUMS is re-made from the trial dirs);
    refused as published. Resealing a flat release drops evidence-SHA256SUMS: that is the last case."""
    change, rule = RESULTS_CASES[case]
    if case == "evidence-SHA256SUMS deleted":
        flat = flat_release(release_copy, tmp_path / "flat")
        change(flat)
        reseal(flat, signer=signer_v1)  # type: ignore[arg-type]
    else:
        change(release_copy)
        reseal(release_copy, signer=signer_v1)  # type: ignore[arg-type]
        flat = flat_release(release_copy, tmp_path / "flat")
    _refused(flat, root, rule)
