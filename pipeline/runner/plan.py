"""Which trials a suite's run is made of: its tasks, each attempt's trial name, a batch's selection.

Harbor-free, so the worker (which plans a run's trials and batches, and grades ``trials.json``)
and ``benchseal trial run`` inside the runner share one rule without the worker importing Harbor.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.contracts import MAX_TASK_ATTEMPTS, task_trial_names
from pipeline.core.errors import ValidationError

TASK_NAME_RE = re.compile(r"\A[a-z0-9][a-z0-9_-]{0,63}\Z")
TRIALS_FILE = "trials.json"
# What every task must declare in its task.toml for benchseal to grade it (pipeline.runner.grader):
#   [metadata.benchseal]
#   grading = "exit-status"   # tests/test.sh exits 0 exactly when the task is solved
#   canary = true             # optional: tests no honest solution passes (never scored; a pass = tampering)
GRADING_PROTOCOL = "exit-status"


@dataclass(frozen=True)
class TrialSpec:
    task: str
    trial_name: str
    attempt: int = 1  # k of the task's ``attempts`` (1 when the task runs once)


def discover_tasks(suite_dir: Path) -> list[str]:
    """Task directory names (sorted) of a suite: every subdirectory with a task.toml."""
    if not suite_dir.is_dir():
        raise ValidationError("suite_dir", "must be an existing directory", str(suite_dir))
    tasks = sorted(p.name for p in suite_dir.iterdir() if (p / "task.toml").is_file())
    for name in tasks:
        if not TASK_NAME_RE.match(name):
            raise ValidationError("suite_dir", f"task directory name {name!r} must match {TASK_NAME_RE.pattern}")
    if not tasks:
        raise ValidationError("suite_dir", "contains no task (no */task.toml)", str(suite_dir))
    return tasks


def select_tasks(tasks: list[str], subset: tuple[str, ...] | None, field: str = "payload.tasks") -> list[str]:
    """The tasks a run plans: every one of ``tasks`` (the staged dataset's), or only those ``subset`` names
    (the payload's ``tasks``); a name the dataset does not hold is refused naming it, before anything runs."""
    if not subset:
        return tasks
    held = set(tasks)
    for name in subset:
        if name not in held:
            raise ValidationError(field, "is not a task of the suite's dataset (its task directories)", name)
    wanted = set(subset)
    return [task for task in tasks if task in wanted]


def plan_trials(run_id: str, tasks: list[str], attempts: int = 1) -> list[TrialSpec]:
    """``attempts`` trials of each task, task by task (``contracts.trial_name``: with one attempt the
    names are ``<task>__<short>`` as they always were; with n > 1, ``<task>__a<k>of<n>__<short>``)."""
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_TASK_ATTEMPTS:
        raise ValidationError("attempts", f"must be an integer from 1 to {MAX_TASK_ATTEMPTS}", attempts)
    return [TrialSpec(task=t, trial_name=name, attempt=k)
            for t in tasks for k, name in enumerate(task_trial_names(t, run_id, attempts), start=1)]


def select_trials(specs: list[TrialSpec], names: tuple[str, ...] | None) -> list[TrialSpec]:
    """The planned trials ``names`` lists (all of them when None): a worker's batch runs some of a
    run's trials (the batch's suite dir holds its tasks, not which attempts of them). A name that is
    not planned here, or a name given twice, is a usage error (exit 2)."""
    if names is None:
        return specs
    planned = {s.trial_name for s in specs}
    for name in names:
        if name not in planned:
            raise ValidationError("--trial", "is not a trial this suite, run and --attempts plan", name)
        if names.count(name) > 1:
            raise ValidationError("--trial", "is given twice", name)
    if not names:
        raise ValidationError("--trial", "names no trial")
    wanted = set(names)
    return [s for s in specs if s.trial_name in wanted]


@dataclass(frozen=True)
class TaskGrading:
    """How benchseal grades one task (its task.toml's ``[metadata.benchseal]``)."""

    task: str
    canary: bool = False


def task_grading(suite_dir: Path, task: str) -> TaskGrading:
    """A task's ``[metadata.benchseal]``: it must declare ``grading = "exit-status"`` (a task whose
    test command reports through a reward file could score every trial 1.0 under benchseal's
    grader: refused), and may be a ``canary``. ValidationError naming the task and the key otherwise."""
    where = f"suite task {task}: task.toml"
    try:
        config = tomllib.loads((suite_dir / task / "task.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValidationError(where, f"must be readable TOML ({exc})") from None
    metadata: Any = config.get("metadata")
    section: Any = metadata.get("benchseal") if isinstance(metadata, dict) else None
    if not isinstance(section, dict):
        raise ValidationError(f"{where} [metadata.benchseal]", f'must exist and declare grading = "{GRADING_PROTOCOL}" '
                              "(tests/test.sh exits 0 exactly when the task is solved)")
    unknown = sorted(set(section) - {"grading", "canary"})
    if unknown:
        raise ValidationError(f"{where} [metadata.benchseal]", "holds only grading and canary", ", ".join(unknown))
    if section.get("grading") != GRADING_PROTOCOL:
        raise ValidationError(f"{where} metadata.benchseal.grading", f'must be "{GRADING_PROTOCOL}" (tests/test.sh '
                              "exits 0 exactly when the task is solved)", section.get("grading"))
    canary = section.get("canary", False)
    if not isinstance(canary, bool):
        raise ValidationError(f"{where} metadata.benchseal.canary", "must be true or false", canary)
    return TaskGrading(task=task, canary=canary)


def suite_grading(suite_dir: Path, tasks: list[str]) -> dict[str, TaskGrading]:
    """``task_grading`` of each task; a suite made only of canaries has nothing to score (refused)."""
    graded = {task: task_grading(suite_dir, task) for task in tasks}
    if graded and all(g.canary for g in graded.values()):
        raise ValidationError("suite_dir", "has only canary tasks: nothing would be scored", str(suite_dir))
    return graded
