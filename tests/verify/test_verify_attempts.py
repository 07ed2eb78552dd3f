"""Issue 26.2, attempts: `benchseal verify` on a release whose suite ran each task three times.

The release is sealed and signed like tests.fixtures.sigstore.signed_release, from a grading with three
attempts of each task (hello resolved in attempts 1 and 3, fail in none): it verifies, in the run dir and as
published, and its summary says hello 2/3. A tampered copy is RE-SIGNED with the right identity, so only the
re-grading can catch it: one attempt dropped from every document and the evidence (each made to agree with
the rest), a task's passes raised, the counts and score raised.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import Grading, TrialOutcome, load_model, task_trial_names
from pipeline.core.errors import ClaimNotSupported, ReleaseRefused, TrialEvidenceMismatch
from pipeline.core.scoring import count, score_interval, score_of, task_counts, wilson_interval
from pipeline.publish.body import facts_from_summary, render_section
from pipeline.verify.release import VerifiedRelease
from tests.fixtures.sigstore import make_inputs
from tests.fixtures.trials import flat_release
from tests.verify.test_verify_consistency import _resign

pytestmark = pytest.mark.slow
SOURCE_TAG = "v9.9.9"
Verify = Callable[[Path], VerifiedRelease]
RUN = "run-evidence-0001"
REWARDS = {"hello": [1.0, 0.0, 1.0], "fail": [0.0, 0.0, 0.0]}
HELLO = task_trial_names("hello", RUN, 3)
FAIL = task_trial_names("fail", RUN, 3)
RESULT = "evidence/harbor/{}/result.json"


def _grading(images: dict[str, str]) -> tuple[Grading, Any]:
    base, payload = make_inputs(images)
    trials = [{"task": task, "trial_name": name, "outcome": "resolved" if reward == 1.0 else "unresolved",
               "reward": reward, "agent_name": "oracle", "agent_version": "1.0", "harbor_version": "0.26.0",
               "total_seconds": 4.0}
              for task, rewards in REWARDS.items()
              for name, reward in zip(task_trial_names(task, RUN, 3), rewards, strict=True)]
    counts = count(t["outcome"] for t in trials)
    grading = load_model(Grading, {**base.model_dump(mode="json"), "trials": trials,
                                   "counts": counts.model_dump(), "score": score_of(counts)}, "test grading")
    return grading, payload


@pytest.fixture(scope="module")
def attempts_release(tmp_path_factory: pytest.TempPathFactory, evidence_images: dict[str, str],
                     signer_v1: object) -> Path:
    from tests.fixtures.sigstore import write_signed_release

    return write_signed_release(tmp_path_factory, *_grading(evidence_images), signer_v1, name="attempts-run")


@pytest.fixture()
def release(tmp_path: Path, attempts_release: Path) -> Path:
    dest = tmp_path / "release"
    shutil.copytree(attempts_release, dest)
    return dest


def _refused(release: Path, verify: Verify, tmp_path: Path, rule: type[ReleaseRefused], subject: str) -> None:
    for where in (release, flat_release(release, tmp_path / "flat")):  # in the run dir and as published
        with pytest.raises(ReleaseRefused) as caught:
            verify(where)
        assert type(caught.value) is rule and caught.value.subject == subject, repr(caught.value)
        assert "\n" not in str(caught.value)


def test_a_release_of_three_attempts_per_task_verifies(release: Path, verify: Verify, tmp_path: Path) -> None:
    summary = json.loads((release / "summary.json").read_text())
    assert summary["counts"] == {"total": 6, "completed": 6, "resolved": 2, "unresolved": 4, "infra_errors": 0}
    assert summary["score"] == 0.333333  # the mean pass rate over every trial
    assert summary["tasks"] == {"fail": {"attempts": 3, "completed": 3, "resolved": 0},
                                "hello": {"attempts": 3, "completed": 3, "resolved": 2}}
    low, high = wilson_interval(2, 6) or (0.0, 0.0)
    assert summary["interval"] == {"low": low, "high": high, "confidence": 0.95, "method": "wilson"}
    assert sorted(t["trial"] for t in summary["timings"]["trials"]) == sorted(HELLO + FAIL)
    text = render_section(facts_from_summary(summary, SOURCE_TAG))
    assert "| Per-task passes (resolved / attempts) | fail 0/3, hello 2/3 |" in text, text
    verify(release)
    verify(flat_release(release, tmp_path / "flat"))


# --- re-signed forgeries -------------------------------------------------------------------------------

def _results(release: Path) -> dict[str, Any]:
    return json.loads((release / "trial-results.json").read_text())  # type: ignore[no-any-return]


def _embed(entry: dict[str, Any], raw: bytes) -> None:
    entry.update(content=base64.b64encode(raw).decode(), sha256=hashlib.sha256(raw).hexdigest())


def _drop_everywhere(release: Path, gone: str) -> Callable[[dict[str, Any]], None]:
    """Attempt ``gone`` removed from the evidence (its dir, the plan), from trial-results.json, and from
    summary.json, whose counts, score, interval and task counts are made to agree with what is left."""
    shutil.rmtree(release / "evidence" / "harbor" / gone)
    plan = json.loads((release / "evidence" / "trials.json").read_text())
    plan["trials"] = [t for t in plan["trials"] if t["trial_name"] != gone]
    raw = json.dumps(plan).encode()
    (release / "evidence" / "trials.json").write_bytes(raw)
    shipped = _results(release)
    shipped["files"] = [f for f in shipped["files"] if f["name"] != RESULT.format(gone)]
    _embed(next(f for f in shipped["files"] if f["name"] == "evidence/trials.json"), raw)
    (release / "trial-results.json").write_text(json.dumps(shipped))

    def summary(s: dict[str, Any]) -> None:
        s["timings"]["trials"] = [t for t in s["timings"]["trials"] if t["trial"] != gone]
        pairs: list[tuple[str, TrialOutcome]] = [(t["task"], t["outcome"]) for t in s["timings"]["trials"]]
        counts = count(outcome for _, outcome in pairs)
        interval = score_interval("SUCCEEDED", counts)
        assert interval is not None
        s.update(counts=counts.model_dump(), score=score_of(counts),
                 interval={**s["interval"], "low": interval.low, "high": interval.high},
                 tasks={task: c.to_json_dict() for task, c in task_counts(pairs).items()})
    return summary


@pytest.mark.parametrize("gone", [HELLO[1], FAIL[2]])
def test_a_release_missing_an_attempt_is_refused(gone: str, release: Path, signer_v1: object,
                                                verify: Verify, tmp_path: Path) -> None:
    """Dropping hello's failed attempt 2 would make hello 2/2 and the score 0.4; fail's attempt 3, 0.4 too."""
    change = _drop_everywhere(release, gone)
    _resign(release, signer_v1, summary=change)
    summary = json.loads((release / "summary.json").read_text())
    assert summary["score"] == 0.4 and summary["counts"]["total"] == 5  # consistent with itself
    _refused(release, verify, tmp_path, TrialEvidenceMismatch, "trial-results.json")  # the plan's attempts


def _hello_passes(s: dict[str, Any]) -> None:
    s["tasks"]["hello"]["resolved"] = 3


def _counts_and_score(s: dict[str, Any]) -> None:
    s.update(counts={**s["counts"], "resolved": 3, "unresolved": 3}, score=0.5)


def _a_trial_dropped_from_the_summary(s: dict[str, Any]) -> None:
    s["timings"]["trials"] = [t for t in s["timings"]["trials"] if t["trial"] != HELLO[1]]


@pytest.mark.parametrize("change", [_hello_passes, _counts_and_score, _a_trial_dropped_from_the_summary],
                         ids=["a task's passes", "counts and score", "a trial dropped from the summary"])
def test_a_resigned_summary_the_attempts_do_not_support_is_refused(change: Any, release: Path,
                                                                   signer_v1: object, verify: Verify,
                                                                   tmp_path: Path) -> None:
    _resign(release, signer_v1, summary=change)
    _refused(release, verify, tmp_path, ClaimNotSupported, "summary.json")
