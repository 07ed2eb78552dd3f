"""Run a suite's Harbor trials (executed inside the runner image by ``benchseal trial run``).

Local task paths only, ``HARBOR_TELEMETRY=0``, the secrets-safe docker
environment (which also applies Harbor's no-network overlay). Secrets are
handed over by NAME: the agent env holds ``${NAME}`` templates that Harbor
resolves from this process's environment, so config.json never holds a value.

The output directory gets ``harbor/<trial>/`` (Harbor's trial dirs) and
``trials.json`` (which task ran in which trial dir); grading happens on the
worker side from Harbor's result.json files.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import UsageError, ValidationError
from pipeline.fsutil import atomic_write_json

ENV_NAME_RE = re.compile(r"\A[A-Z_][A-Z0-9_]{0,63}\Z")
TASK_NAME_RE = re.compile(r"\A[a-z0-9][a-z0-9_-]{0,63}\Z")
TRIALS_FILE = "trials.json"
# What pipeline.infra.harbor_env changes in Harbor's per-trial work (docs/infra.md), by name.
TUNINGS = ("stop-signal", "never-pull", "no-predown", "async-stop")
DISABLE_ENV = "BENCHSEAL_HARBOR_DISABLE"


def enabled_tunings(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """``TUNINGS`` minus the ones named in ``BENCHSEAL_HARBOR_DISABLE`` (an unknown name is an error)."""
    raw = (os.environ if environ is None else environ).get(DISABLE_ENV, "")
    disabled = {item.strip() for item in raw.split(",") if item.strip()}
    unknown = sorted(disabled - set(TUNINGS))
    if unknown:
        raise ValidationError(DISABLE_ENV, f"unknown names {unknown}; known: {', '.join(TUNINGS)}")
    return frozenset(TUNINGS) - disabled


@dataclass(frozen=True)
class TrialSpec:
    task: str
    trial_name: str


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


def plan_trials(run_id: str, tasks: list[str]) -> list[TrialSpec]:
    # Deterministic trial names let the worker tell a missing trial from a present one.
    short = re.sub(r"[^a-z0-9]", "", run_id.lower())[-12:]
    return [TrialSpec(task=t, trial_name=f"{t}__{short}") for t in tasks]


def run_suite(
    suite_dir: Path,
    out_dir: Path,
    *,
    run_id: str,
    agent: str,
    secret_env: tuple[str, ...] = (),
    concurrency: int = 3,
) -> list[TrialSpec]:
    """Run every task of ``suite_dir`` once with ``agent``; return the planned trials."""
    for name in secret_env:
        if not ENV_NAME_RE.match(name):
            raise ValidationError("secret_env", f"must match {ENV_NAME_RE.pattern}", name)
        if name not in os.environ:
            raise UsageError(f"secret_env: {name} is not set in the environment")
    if concurrency < 1:
        raise ValidationError("concurrency", "must be >= 1", concurrency)
    enabled_tunings()  # a bad BENCHSEAL_HARBOR_DISABLE is a usage error before any trial starts
    os.environ["HARBOR_TELEMETRY"] = "0"
    suite_dir = suite_dir.resolve()
    out_dir = out_dir.resolve()
    trials_dir = out_dir / "harbor"
    trials_dir.mkdir(parents=True, exist_ok=True)
    specs = plan_trials(run_id, discover_tasks(suite_dir))
    atomic_write_json(
        out_dir / TRIALS_FILE,
        {"run_id": run_id, "agent": agent, "harbor_version": _harbor_version(), "trials": [{"task": s.task, "trial_name": s.trial_name} for s in specs]},
    )
    asyncio.run(_run_all(suite_dir, trials_dir, specs, agent, secret_env, concurrency))
    return specs


def _harbor_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("harbor")
    except PackageNotFoundError:
        return None


async def _run_all(
    suite_dir: Path,
    trials_dir: Path,
    specs: list[TrialSpec],
    agent: str,
    secret_env: tuple[str, ...],
    concurrency: int,
) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(spec: TrialSpec) -> None:
        async with gate:
            await _run_trial(suite_dir / spec.task, trials_dir, spec.trial_name, agent, secret_env)

    try:
        results = await asyncio.gather(*(one(s) for s in specs), return_exceptions=True)
    finally:
        # Environments tear down in the background (off each trial's critical path);
        # none may outlive this process.
        from pipeline.infra.harbor_env import drain_teardowns

        await drain_teardowns()
    for spec, result in zip(specs, results, strict=True):
        if isinstance(result, BaseException):
            # The trial's own result.json (if any) carries the details; a trial
            # without one is graded as an infrastructure error.
            print(f"trial {spec.trial_name}: {type(result).__name__}: {result}", flush=True)


async def _run_trial(task_dir: Path, trials_dir: Path, trial_name: str, agent: str, secret_env: tuple[str, ...]) -> None:
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    from pipeline.infra.harbor_env import IMPORT_PATH

    config = TrialConfig(
        task=TaskConfig(path=task_dir),
        trial_name=trial_name,
        trials_dir=trials_dir,
        agent=AgentConfig(name=agent, env={name: "${" + name + "}" for name in secret_env}),
        environment=EnvironmentConfig(import_path=IMPORT_PATH, delete=True),
    )
    trial = await Trial.create(config)
    await trial.run()
