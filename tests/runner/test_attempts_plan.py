"""Issue 26.2, attempts: the runner's plan of n trials per task and the one trial-name rule.

With one attempt per task the names are exactly those of before (``<task>__<short>``, so releases sealed
before attempts still verify); with n > 1 attempt k is ``<task>__a<k>of<n>__<short>``, which the name rule
accepts and ``trial_attempt`` reads back. A worker's batch names the trials it runs (``--trial``); the
runner refuses one it does not plan. No engine needed: ``benchseal trial run`` is stopped at its inputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.contracts import (
    MAX_TASK_ATTEMPTS,
    TRIAL_NAME_PATTERN,
    task_trial_names,
    trial_attempt,
    trial_name,
    trial_name_problem,
)
from pipeline.core.documents import PlannedTrial, TrialsPlan, parse_document
from pipeline.core.errors import ValidationError
from pipeline.runner.plan import TrialSpec, discover_tasks, plan_trials, select_trials

RUN = "run-0123456789abcdef0123"
SHORT = "89abcdef0123"  # trial_short_id(RUN): its last 12 alphanumerics
TASKS = ["cli-flag", "fix-mean", "write-answer"]


def test_one_attempt_keeps_the_names_of_before() -> None:
    specs = plan_trials(RUN, TASKS)
    assert specs == plan_trials(RUN, TASKS, 1)
    assert [(s.task, s.trial_name, s.attempt) for s in specs] == [
        ("cli-flag", f"cli-flag__{SHORT}", 1), ("fix-mean", f"fix-mean__{SHORT}", 1),
        ("write-answer", f"write-answer__{SHORT}", 1)]
    assert [s.trial_name for s in specs] == [trial_name(t, RUN) for t in TASKS]  # the contract's names, unchanged
    assert all(trial_attempt(s.trial_name, s.task, RUN) == (1, 1) for s in specs)


def test_n_attempts_plan_n_trials_per_task_with_names_that_say_which() -> None:
    specs = plan_trials(RUN, TASKS[:2], 3)
    assert [(s.task, s.trial_name, s.attempt) for s in specs] == [
        ("cli-flag", f"cli-flag__a1of3__{SHORT}", 1), ("cli-flag", f"cli-flag__a2of3__{SHORT}", 2),
        ("cli-flag", f"cli-flag__a3of3__{SHORT}", 3),
        ("fix-mean", f"fix-mean__a1of3__{SHORT}", 1), ("fix-mean", f"fix-mean__a2of3__{SHORT}", 2),
        ("fix-mean", f"fix-mean__a3of3__{SHORT}", 3)]
    for spec in specs:
        assert trial_name_problem(spec.trial_name) is None
        assert trial_attempt(spec.trial_name, spec.task, RUN) == (spec.attempt, 3)
    assert len({s.trial_name for s in specs}) == len(specs)
    # The plan the runner writes (trials.json) takes them through its model and schema pattern.
    plan = parse_document(TrialsPlan, {
        "schema": "benchseal.trials/v1", "run_id": RUN, "agent": "oracle", "agent_version": None,
        "harbor_version": "0.26.0", "model": None,
        "trials": [{"task": s.task, "trial_name": s.trial_name} for s in specs]}, "trials.json")
    assert [t.trial_name for t in plan.trials] == [s.trial_name for s in specs]


def test_the_longest_task_and_the_most_attempts_still_name_a_trial() -> None:
    task = "t" * 64
    names = task_trial_names(task, RUN, MAX_TASK_ATTEMPTS)
    assert names[-1] == f"{task}__a10of10__{SHORT}" and len(names) == MAX_TASK_ATTEMPTS
    for k, name in enumerate(names, start=1):
        assert trial_name_problem(name) is None, name
        assert PlannedTrial(task=task, trial_name=name).trial_name == name
        assert trial_attempt(name, task, RUN) == (k, MAX_TASK_ATTEMPTS)


@pytest.mark.parametrize("attempts", [0, -1, MAX_TASK_ATTEMPTS + 1, True, 2.0, "2"])
def test_a_plan_refuses_an_impossible_number_of_attempts(attempts: object) -> None:
    with pytest.raises(ValidationError) as caught:
        plan_trials(RUN, TASKS, attempts)  # type: ignore[arg-type]
    assert caught.value.field == "attempts"
    with pytest.raises(ValueError):
        trial_name("hello", RUN, 4, 3)


@pytest.mark.parametrize(("trial", "task"), [
    (f"hello__a0of3__{SHORT}", "hello"),  # attempts count from 1
    (f"hello__a4of3__{SHORT}", "hello"),  # past n
    (f"hello__a1of1__{SHORT}", "hello"),  # one attempt is named <task>__<short>
    (f"hello__a1of11__{SHORT}", "hello"),  # more than the policy allows
    (f"hello__a01of3__{SHORT}", "hello"),  # one spelling per attempt
    (f"hello__a1of3__{SHORT}", "hell"),  # another task's
    ("hello__a1of3__ffffffffffff", "hello"),  # another run's
    (f"hello__{SHORT}x", "hello"),
    (f"hello__a__{SHORT}", "hello"),
])
def test_trial_attempt_reads_only_this_task_and_run(trial: str, task: str) -> None:
    assert trial_attempt(trial, task, RUN) is None


@pytest.mark.parametrize("attempts", [1, 2, 3, 10])
def test_within_a_run_names_of_different_tasks_and_attempts_never_collide(attempts: int) -> None:
    # A task may itself end in what looks like an attempt: with the run's one n, its names are its own.
    tasks = ["a", "a__a1of2", "a__a1", "a1of2", "a__a1of10", "a__a10"]
    names = [n for task in tasks for n in task_trial_names(task, RUN, attempts)]
    assert len(set(names)) == len(names)
    for task in tasks:
        for k, name in enumerate(task_trial_names(task, RUN, attempts), start=1):
            owners = [(t, parsed) for t in tasks if (parsed := trial_attempt(name, t, RUN)) and parsed[1] == attempts]
            assert owners == [(task, (k, attempts))], (name, owners)
    # Another n can spell the same name for another task (a__a1of2 once, a's first of two): the plan
    # pairs each trial with its task, and evidence_trials holds a run to one n.
    assert trial_name("a__a1of2", RUN) == trial_name("a", RUN, 1, 2)


def test_the_name_pattern_still_refuses_what_is_not_a_plain_trial_dir() -> None:
    assert TRIAL_NAME_PATTERN.startswith("^") and TRIAL_NAME_PATTERN.endswith("$")
    for bad in ("../x__a1of2__r1", "Hello__a1of2__r1", "hello__a1of2__r1/x", "__a1of2__r1",
                "hello__a1of2__R1", "hello__a1of2__" + "r" * 13):
        assert trial_name_problem(bad) is not None, bad


# --- a batch: some of a run's trials -------------------------------------------------------------

def test_a_batch_runs_exactly_the_trials_it_names() -> None:
    specs = plan_trials(RUN, TASKS[:2], 3)
    picked = (f"fix-mean__a1of3__{SHORT}", f"cli-flag__a3of3__{SHORT}")
    chosen = select_trials(specs, picked)
    assert [s.trial_name for s in chosen] == [f"cli-flag__a3of3__{SHORT}", f"fix-mean__a1of3__{SHORT}"]  # plan order
    assert select_trials(specs, None) == specs


@pytest.mark.parametrize(("names", "rule"), [
    ((f"fix-mean__a4of3__{SHORT}",), "is not a trial this suite, run and --attempts plan"),
    ((f"fix-mean__{SHORT}",), "is not a trial this suite, run and --attempts plan"),  # planned with one attempt
    ((f"other__a1of3__{SHORT}",), "is not a trial"),  # a task the batch's suite dir does not hold
    ((f"fix-mean__a1of3__{SHORT}", f"fix-mean__a1of3__{SHORT}"), "is given twice"),
    ((), "names no trial"),
])
def test_a_batch_naming_a_trial_the_runner_does_not_plan_is_refused(names: tuple[str, ...], rule: str) -> None:
    with pytest.raises(ValidationError) as caught:
        select_trials(plan_trials(RUN, TASKS[:2], 3), names)
    assert caught.value.field == "--trial" and rule in caught.value.rule


def _suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite"
    for task in TASKS[:2]:
        (suite / task).mkdir(parents=True)
        (suite / task / "task.toml").write_text("[task]\n\n[metadata.benchseal]\ngrading = \"exit-status\"\n")
    return suite


def test_trial_run_stops_at_a_bad_attempts_or_trial_with_exit_2(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    assert discover_tasks(suite) == TASKS[:2]
    base = [sys.executable, "-m", "pipeline", "trial", "run", "--suite-dir", str(suite), "--out", str(tmp_path / "out"),
            "--run-id", RUN]
    env = {**os.environ, "HARBOR_TELEMETRY": "0"}
    for bad in ("0", "11", "two"):
        done = subprocess.run([*base, "--attempts", bad], capture_output=True, text=True, env=env, timeout=120,
                              check=False)
        assert done.returncode == 2 and "--attempts" in done.stderr and "Traceback" not in done.stderr, done.stderr
    done = subprocess.run([*base, "--attempts", "2", "--trial", f"fix-mean__a3of2__{SHORT}"], capture_output=True,
                          text=True, env=env, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "--trial" in done.stderr and "is not a trial this suite, run and --attempts plan" in done.stderr
    assert not (tmp_path / "out" / "trials.json").exists()  # refused before the plan was written


def test_trial_spec_defaults_to_the_first_attempt() -> None:
    assert TrialSpec(task="hello", trial_name=f"hello__{SHORT}").attempt == 1
