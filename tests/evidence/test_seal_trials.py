"""Issue 22.5: the seal job signs only a score the trials say, for a run the infra policy admits.

Every case starts from a real export (tests.fixtures.trials.graded_export: a real queue, the worker's
grader over Harbor result.json files made from a real one, ``benchseal infra export``'s writer), tampers
it, and runs the seal CLI (``benchseal evidence RUN_DIR --from-export FILE --run-id ID``) as the seal job
does: each refusal is one line naming the field, exit 1, no RUN_DIR and no staging dir left, and no
signer was asked for (``--signer ambient`` has no credential here: reaching it would say so instead).
Before this change every case below was signed.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import trial_name
from pipeline.core.scoring import grade_result
from pipeline.evidence.signing import Signer
from pipeline.infra.intake.policy import load_policy
from pipeline.publish.seal import seal_export
from tests.fixtures.trials import (
    EVIDENCE,
    graded_export,
    harbor_result,
    members,
    plan,
    policy_file,
    seal_refused,
    tampered,
)

REPO = Path(__file__).resolve().parents[2]
RUNNER = "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64
API = "127.0.0.1:5055/benchseal/api@sha256:" + "2" * 64
PAYLOAD: dict[str, Any] = {
    "schema": "benchseal.dispatch/v1", "correlation_id": "seal-trials-0001",
    "source": {"repository": "acme/widget", "commit": "c" * 40, "tag": "v1.0.0"},
    "runner": RUNNER, "api": API, "suite": "smoke", "agent": "oracle",
}
TASKS = ("alpha", "beta", "gamma")
Files = dict[str, bytes]


def _graded(tmp: Path, rewards: dict[str, Any]) -> tuple[str, bytes]:
    """task -> a reward, a whole result.json (dict), or ... for no trial dir."""
    tmp.mkdir(parents=True, exist_ok=True)
    results = {task: None if reward is ... else reward if isinstance(reward, dict) else harbor_result("x", reward)
               for task, reward in rewards.items()}
    run_id, export = graded_export(tmp, PAYLOAD, load_policy(), results)
    return run_id, export


@pytest.fixture(scope="module")
def all_zero(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes]:
    """Three trials, every reward 0: the grader says SUCCEEDED, 0 of 3 resolved, score 0."""
    return _graded(tmp_path_factory.mktemp("zero"), dict.fromkeys(TASKS, 0.0))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes]:
    """alpha resolved, beta unresolved, gamma resolved: SUCCEEDED, score 0.666667."""
    return _graded(tmp_path_factory.mktemp("mixed"), {"alpha": 1.0, "beta": 0.0, "gamma": 1.0})


def _seal(tmp: Path, run_id: str, export: bytes, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "export.tar"
    path.write_bytes(export)
    dest = tmp / "sealed" / "run"
    dest.parent.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "LC_ALL": "C.UTF-8",
           "BENCHSEAL_HOME": str(tmp / "home")}
    done = subprocess.run([sys.executable, "-m", "pipeline", "evidence", str(dest), "--from-export", str(path),
                           "--run-id", run_id, "--signer", "ambient", *extra],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120, check=False)
    return done, dest


def _refused(tmp: Path, run_id: str, export: bytes, rule: str, *extra: str) -> str:
    done, dest = _seal(tmp, run_id, export, *extra)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("benchseal: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and "OIDC" not in done.stderr, done.stderr  # refused before any signer
    assert rule in done.stderr, done.stderr
    assert done.stdout == "" and not dest.exists() and os.listdir(dest.parent) == []  # nothing half-written
    assert not (tmp / "home").exists()  # no signing state was made either
    return done.stderr


# --- mutations of an export ---------------------------------------------------------------------

def _json(files: Files, name: str) -> dict[str, Any]:
    return json.loads(files[name])  # type: ignore[no-any-return]


def _put(files: Files, name: str, data: dict[str, Any]) -> None:
    files[name] = json.dumps(data).encode()


def _trial(run_id: str, task: str) -> str:
    return trial_name(task, run_id)


def _result(run_id: str, task: str) -> str:
    return f"{EVIDENCE}/harbor/{_trial(run_id, task)}/result.json"


def _claim_all_resolved(run_id: str) -> Callable[[Files], None]:
    """grading.json and run.json say 3/3 resolved, 1.0, as a consistent forged grading would: every
    trial record, the counts and the score (the trials' result.json files are left as they are)."""
    def change(files: Files) -> None:
        grading = _json(files, "grading.json")
        for trial in grading["trials"]:
            trial.update(outcome="resolved", reward=1.0, exception_type=None)
        grading.update(counts={"total": 3, "completed": 3, "resolved": 3, "unresolved": 0, "infra_errors": 0},
                       score=1.0, status="SUCCEEDED", reason=None)
        _put(files, "grading.json", grading)
        status = _json(files, "run.json")
        status.update(counts=grading["counts"], score=1.0, state="SUCCEEDED")
        _put(files, "run.json", status)
    return change


def _counts_only(**counts: int) -> Callable[[Files], None]:
    """Only the counts and score of grading.json and run.json forged (the trial records stay honest)."""
    def change(files: Files) -> None:
        for name, score_key in (("grading.json", "score"), ("run.json", "score")):
            data = _json(files, name)
            data["counts"] = {**data["counts"], **counts}
            data[score_key] = round(data["counts"]["resolved"] / data["counts"]["completed"], 6)
            _put(files, name, data)
    return change


def _rewrite_result(run_id: str, task: str, raw: bytes) -> Callable[[Files], None]:
    def change(files: Files) -> None:
        files[_result(run_id, task)] = raw
    return change


def _both(*changes: Callable[[Files], None]) -> Callable[[Files], None]:
    def change(files: Files) -> None:
        for one in changes:
            one(files)
    return change


def _rename_dir(run_id: str, task: str, new: str) -> Callable[[Files], None]:
    old = f"{EVIDENCE}/harbor/{_trial(run_id, task)}/"

    def change(files: Files) -> None:
        for name in [n for n in files if n.startswith(old)]:
            files[f"{EVIDENCE}/harbor/{new}/" + name[len(old):]] = files.pop(name)
    return change


def _drop_dir(run_id: str, task: str, only: str | None = None) -> Callable[[Files], None]:
    prefix = f"{EVIDENCE}/harbor/{_trial(run_id, task)}/{only or ''}"

    def change(files: Files) -> None:
        for name in [n for n in files if n.startswith(prefix)]:
            del files[name]
    return change


# --- the cases --------------------------------------------------------------------------------------

def test_rewards_all_zero_with_a_forged_grading_of_one_is_refused(all_zero: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = all_zero
    err = _refused(tmp_path, run_id, tampered(export, _claim_all_resolved(run_id)),
                   f"grading.trials[{_trial(run_id, 'alpha')}].outcome: 'resolved' in grading.json, 'unresolved' "
                   "from the trial evidence")
    assert err.endswith("from the trial evidence\n")


def test_forged_counts_with_honest_trial_records_name_the_count(all_zero: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = all_zero
    _refused(tmp_path, run_id, tampered(export, _counts_only(resolved=3, unresolved=0)),
             "grading.resolved: 3 in grading.json, 0 from the trial evidence")


def test_run_json_disagreeing_with_an_honest_grading_is_refused(mixed: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = mixed

    def forge_run_json(files: Files) -> None:
        status = _json(files, "run.json")
        status.update(counts={**status["counts"], "resolved": 3, "unresolved": 0}, score=1.0)
        _put(files, "run.json", status)
    _refused(tmp_path, run_id, tampered(export, forge_run_json), "run.resolved: 3 in run.json, 2 from the trial evidence")


def test_no_trials_at_all_is_refused(all_zero: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = all_zero

    def no_trials(files: Files) -> None:
        for name in [n for n in files if n.startswith(f"{EVIDENCE}/harbor/")]:
            del files[name]
        _put(files, f"{EVIDENCE}/trials.json", plan(run_id, []))
        grading = _json(files, "grading.json")
        grading["trials"] = []
        _put(files, "grading.json", grading)
    _refused(tmp_path, run_id, tampered(export, _both(_claim_all_resolved(run_id), no_trials)),
             "grading.status: SUCCEEDED in grading.json, but evidence/trials.json plans no trials")


def test_no_plan_and_no_trial_evidence_is_refused(all_zero: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = all_zero

    def nothing(files: Files) -> None:
        for name in [n for n in files if n.startswith(f"{EVIDENCE}/")]:
            del files[name]
    _refused(tmp_path, run_id, tampered(export, _both(_claim_all_resolved(run_id), nothing)),
             "evidence/trials.json: missing from the trial evidence; a score needs the plan of its trials")


def test_a_renamed_trial_dir_is_refused(mixed: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = mixed
    other = _trial(run_id, "beta").replace("beta", "delta")
    _refused(tmp_path, run_id, tampered(export, _rename_dir(run_id, "beta", other)),
             f"evidence/harbor/{other}: trial evidence for no planned trial")


def test_an_extra_trial_dir_is_refused(mixed: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = mixed
    extra = _trial(run_id, "delta")

    def plant(files: Files) -> None:
        files[f"{EVIDENCE}/harbor/{extra}/result.json"] = json.dumps(harbor_result(extra, 1.0)).encode()
    _refused(tmp_path, run_id, tampered(export, plant), f"evidence/harbor/{extra}: trial evidence for no planned trial")


def test_a_planned_trial_without_evidence_is_refused(mixed: tuple[str, bytes], tmp_path: Path) -> None:
    """Dropping the unresolved trial's dir would have raised the score (an infra error is not completed)."""
    run_id, export = mixed
    _refused(tmp_path, run_id, tampered(export, _drop_dir(run_id, "beta")),
             f"{_result(run_id, 'beta').removeprefix('artifacts/')}: missing (no trial dir)")
    _refused(tmp_path / "file", run_id, tampered(export, _drop_dir(run_id, "beta", "result.json")),
             f"{_result(run_id, 'beta').removeprefix('artifacts/')}: missing (no trial result.json)")


def test_an_infrastructure_error_counted_as_resolved_is_refused(mixed: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = mixed
    errored = harbor_result(_trial(run_id, "alpha"), 1.0, exception="EnvironmentStartTimeoutError")
    _refused(tmp_path, run_id, tampered(export, _rewrite_result(run_id, "alpha", json.dumps(errored).encode())),
             f"grading.trials[{_trial(run_id, 'alpha')}].outcome: 'resolved' in grading.json, 'infra_error' from "
             "the trial evidence")


# Each result.json, for a trial grading.json counts as resolved (reward 1.0): the rule grades it otherwise.
HOSTILE_RESULTS: dict[str, tuple[bytes, str]] = {
    "reward string": (b'{"verifier_result": {"rewards": {"reward": "1"}}, "exception_info": null}', "infra_error"),
    "reward NaN": (b'{"verifier_result": {"rewards": {"reward": NaN}}, "exception_info": null}', "infra_error"),
    "reward Infinity": (b'{"verifier_result": {"rewards": {"reward": Infinity}}, "exception_info": null}', "infra_error"),
    "reward over 1": (b'{"verifier_result": {"rewards": {"reward": 2}}, "exception_info": null}', "infra_error"),
    "reward 1e400": (b'{"verifier_result": {"rewards": {"reward": 1e400}}, "exception_info": null}', "infra_error"),
    "reward huge int": (b'{"verifier_result": {"rewards": {"reward": ' + b"9" * 400 + b"}}}", "infra_error"),
    "reward negative": (b'{"verifier_result": {"rewards": {"reward": -0.5}}, "exception_info": null}', "infra_error"),
    "reward true": (b'{"verifier_result": {"rewards": {"reward": true}}, "exception_info": null}', "infra_error"),
    "reward 0.99": (b'{"verifier_result": {"rewards": {"reward": 0.99}}, "exception_info": null}', "infra_error"),
    "no reward": (b'{"verifier_result": {"rewards": {}}, "exception_info": null}', "infra_error"),
    "duplicate key": (b'{"verifier_result": {"rewards": {"reward": 0}}, "verifier_result": {"rewards": {"reward": 1}}}',
                      "infra_error"),
    "exception as a string": (b'{"verifier_result": {"rewards": {"reward": 1}}, "exception_info": "boom"}',
                              "infra_error"),
    "exception without a type": (b'{"verifier_result": {"rewards": {"reward": 1}}, "exception_info": {}}',
                                 "infra_error"),
    "not an object": (b'[{"verifier_result": {"rewards": {"reward": 1}}}]', "infra_error"),
    "nested too deep": (b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, "infra_error"),
    "not UTF-8": (b'{"verifier_result": {"rewards": {"reward": 1}}, "x": "\xff"}', "infra_error"),
    "empty file": (b"", "infra_error"),
}


@pytest.mark.parametrize("case", list(HOSTILE_RESULTS))
def test_a_hostile_result_counted_as_resolved_is_refused(case: str, mixed: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = mixed
    raw, outcome = HOSTILE_RESULTS[case]
    assert grade_result(raw).outcome == outcome  # what the worker's grader would have said
    seal_refused(tmp_path, run_id, tampered(export, _rewrite_result(run_id, "alpha", raw)),
             f"grading.trials[{_trial(run_id, 'alpha')}].outcome: 'resolved' in grading.json, {outcome!r} from the "
             "trial evidence")


def test_swapped_results_are_refused(mixed: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = mixed

    def swap(files: Files) -> None:
        files[_result(run_id, "alpha")], files[_result(run_id, "beta")] = (files[_result(run_id, "beta")],
                                                                         files[_result(run_id, "alpha")])
    _refused(tmp_path, run_id, tampered(export, swap),
             f"grading.trials[{_trial(run_id, 'alpha')}].outcome: 'resolved' in grading.json, 'unresolved'")


def test_a_trial_grading_names_but_no_evidence_plans_is_refused(mixed: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = mixed
    ghost = _trial(run_id, "delta")

    def rename(files: Files) -> None:
        grading = _json(files, "grading.json")
        grading["trials"][0].update(trial_name=ghost, task="delta")
        _put(files, "grading.json", grading)
    _refused(tmp_path, run_id, tampered(export, rename),
             f"grading.trials: {ghost} is in grading.json, but no such trial is planned in the trial evidence")

    def twice(files: Files) -> None:
        grading = _json(files, "grading.json")
        grading["trials"][1] = grading["trials"][0]
        _put(files, "grading.json", grading)
    _refused(tmp_path / "twice", run_id, tampered(export, twice),
             f"grading.trials: {_trial(run_id, 'alpha')} is listed twice in grading.json")


@pytest.mark.parametrize("case", ["trial twice", "task twice", "another run's trial", "another run's plan"])
def test_a_hostile_plan_is_refused(case: str, mixed: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = mixed
    name = f"{EVIDENCE}/trials.json"

    def change(files: Files) -> None:
        data = _json(files, name)
        if case == "trial twice":
            data["trials"].append(data["trials"][0])
        elif case == "task twice":
            data["trials"].append({"task": "alpha", "trial_name": "alpha__0123456789ab"})
        elif case == "another run's trial":
            data["trials"][0]["trial_name"] = "alpha__0123456789ab"
        else:
            data["run_id"] = "run-ffffffffffffffffffff"
        _put(files, name, data)
    rule = {"trial twice": "is planned twice", "task twice": "task alpha is planned twice",
            "another run's trial": "is not task 'alpha' of run", "another run's plan": "evidence/trials.json: run_id"}
    seal_refused(tmp_path, run_id, tampered(export, change), rule[case])


def test_a_succeeded_grading_over_the_policy_threshold_is_refused(tmp_path: Path) -> None:
    """The grader FAILs a run with 2 of 3 trials infrastructure errors (34% allowed); a grading.json that
    says SUCCEEDED anyway (consistent counts and score) is refused."""
    errored = harbor_result("x", None, exception="EnvironmentStartTimeoutError")
    run_id, export = _graded(tmp_path / "run", {"alpha": 1.0, "beta": errored, "gamma": errored})

    def succeed(files: Files) -> None:
        for name, key in (("grading.json", "status"), ("run.json", "state")):
            data = _json(files, name)
            data.update({key: "SUCCEEDED", "score": 1.0, "reason": None} if name == "grading.json"
                        else {key: "SUCCEEDED", "score": 1.0})
            _put(files, name, data)
    assert json.loads(members(export)["grading.json"])["status"] == "FAILED"
    _refused(tmp_path / "seal", run_id, tampered(export, succeed),
             "grading.status: 'SUCCEEDED' in grading.json, but 2 of 3 trials are infrastructure errors")


def test_a_failed_run_with_a_score_is_refused_in_one_line(all_zero: tuple[str, bytes], tmp_path: Path) -> None:
    """The existing rule (contracts.check_score): a run that did not succeed has no score, now exit 1."""
    run_id, export = all_zero

    def fail(files: Files) -> None:
        for name, key in (("grading.json", "status"), ("run.json", "state")):
            data = _json(files, name)
            data[key] = "FAILED"
            _put(files, name, data)
    _refused(tmp_path, run_id, tampered(export, fail), "score must be null for a FAILED run")


# --- the infra policy, re-checked by the job that signs ----------------------------------------------

def test_a_run_for_a_repository_the_policy_does_not_list_is_refused(mixed: tuple[str, bytes], tmp_path: Path) -> None:
    run_id, export = mixed
    other = policy_file(tmp_path / "infra.yaml", {"local/benchseal": {"runner": RUNNER, "api": API}})
    _refused(tmp_path, run_id, export, "run.source.repository: repository is not allowed by the infra policy",
             "--policy", str(other))


@pytest.mark.parametrize(("field", "value", "rule"), [
    ("source.repository", "evil/unlisted", "run.source.repository: repository is not allowed by the infra policy"),
    ("agent", "claude-code", "run.agent: agent not allowed by policy"),
    ("suite", "secret-suite", "run.suite: suite not allowed by policy"),
    ("runner", "127.0.0.1:5055/evil/runner@sha256:" + "1" * 64, "run.runner: image '127.0.0.1:5055/evil/runner'"),
    ("source.tag", "-rf", "run.json: source.tag"),
])
def test_a_run_json_the_policy_does_not_admit_is_refused(field: str, value: str, rule: str, mixed: tuple[str, bytes],
                                                        tmp_path: Path) -> None:
    run_id, export = mixed

    def change(files: Files) -> None:
        status = _json(files, "run.json")
        if "." in field:
            outer, inner = field.split(".")
            status[outer][inner] = value
        else:
            status[field] = value
        _put(files, "run.json", status)
    _refused(tmp_path, run_id, tampered(export, change), rule)


def test_an_honest_export_passes_every_check_and_reaches_the_signer(mixed: tuple[str, bytes], tmp_path: Path) -> None:
    """The control: untampered, the run is accepted and only the missing ambient credential stops it."""
    run_id, export = mixed
    done, dest = _seal(tmp_path, run_id, export)
    assert done.returncode == 1 and "no ambient OIDC credential" in done.stderr, done.stderr
    assert not dest.exists() and os.listdir(dest.parent) == []


class _Reached(Exception):
    pass


def _reaches_signer(tmp: Path, run_id: str, export: bytes) -> None:
    dest = tmp / "sealed" / "run"
    dest.parent.mkdir(parents=True)

    def signer() -> Signer:
        raise _Reached
    with pytest.raises(_Reached):
        seal_export(io.BytesIO(export), dest, run_id, signer, load_policy())
    assert not dest.exists() and os.listdir(dest.parent) == []


def test_honest_runs_that_did_not_succeed_pass_every_check(tmp_path: Path) -> None:
    """A FAILED run (2 of 3 infrastructure errors, one of them with no trial dir at all) and the same run
    with a trial the grader counted as an infrastructure error (a timeout it knew of) are sealed: no
    score, and the trials say nothing the grading contradicts."""
    errored = harbor_result("x", None, exception="EnvironmentStartTimeoutError")
    run_id, export = _graded(tmp_path / "failed", {"alpha": 1.0, "beta": errored, "gamma": ...})
    assert json.loads(members(export)["grading.json"])["status"] == "FAILED"
    _reaches_signer(tmp_path / "a", run_id, export)

    def timed_out(files: Files) -> None:
        grading = _json(files, "grading.json")
        grading["trials"][0].update(outcome="infra_error", exception_type="TrialAttemptsExhausted")
        grading["counts"] = {"total": 3, "completed": 0, "resolved": 0, "unresolved": 0, "infra_errors": 3}
        _put(files, "grading.json", grading)
        status = _json(files, "run.json")
        status["counts"] = grading["counts"]
        _put(files, "run.json", status)
    _reaches_signer(tmp_path / "b", run_id, tampered(export, timed_out))
