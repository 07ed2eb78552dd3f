"""Run a suite's Harbor trials (executed inside the runner image by ``benchseal trial run``).

Local task paths only, ``HARBOR_TELEMETRY=0``, benchseal's engine environment
(``pipeline.runner.engine_env``: the engine API through the Docker SDK, network none). Secrets are
handed over by NAME: the agent env holds ``${NAME}`` templates that Harbor
resolves from this process's environment, so config.json never holds a value.

The output directory gets ``harbor/<trial>/`` (Harbor's trial dirs) and
``trials.json`` (which task ran in which trial dir); grading happens on the
worker side from Harbor's result.json files.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.models.task.artifacts import normalize_artifact_entries
from harbor.models.task.config import VerifierEnvironmentMode
from harbor.models.task.verifier_mode import resolve_task_verifier_mode
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig, VerifierConfig
from harbor.trial.single_step import SingleStepTrial
from harbor.trial.trial import Trial

from pipeline.core.contracts import AgentArtifact
from pipeline.core.documents import PlannedTrial, TrialsPlan, dump_document
from pipeline.core.errors import UsageError, ValidationError
from pipeline.core.project import AGENT_MANIFEST_PATH, PLACEHOLDER_KEY, AgentManifest, NpmAgent
from pipeline.infra.sandbox.relay import TcpToUnixRelay
from pipeline.runner.agent_box import IMPORT_PATH as BOX_AGENT_IMPORT_PATH
from pipeline.runner.agent_box import agent_image as box_image
from pipeline.runner.agent_box import model_base_url, set_agent_image
from pipeline.runner.agent_check import AGENT_COPY, mount_agent_files, release_agent
from pipeline.runner.cli_agent import IMPORT_PATH as CLI_AGENT_IMPORT_PATH
from pipeline.runner.engine_env import EngineEnvironment
from pipeline.runner.envshared import drain_teardowns
from pipeline.runner.grader import IMPORT_PATH as GRADER_IMPORT_PATH
from pipeline.runner.plan import TRIALS_FILE, TrialSpec, discover_tasks, plan_trials, select_trials, task_grading
from pipeline.runner.readiness import ReadyTasks
from pipeline.runner.tunings import enabled_tunings

# The trial environments (import paths: Harbor imports the one it is given when a trial creates it).
ENGINE_IMPORT_PATH = "pipeline.runner.engine_env:EngineEnvironment"
COMPOSE_IMPORT_PATH = "pipeline.runner.harbor_env:SecretSafeDockerEnvironment"  # the benchmark's "before" only

# Trials whose agent environment starts ahead, while they wait for a slot (the "prestart" tuning).
LOOKAHEAD = 2
ENV_NAME_RE = re.compile(r"\A[A-Z_][A-Z0-9_]{0,63}\Z")
@dataclass(frozen=True)
class ModelAccess:
    """How a model-backed agent reaches its model from the network-less runner.

    There is no key here: the agent holds ``PLACEHOLDER_KEY`` and the worker's relay adds the real one.
    """

    socket: Path  # the worker's relay socket (mounted)
    path: str  # the endpoint's path, e.g. /v1
    name: str  # LiteLLM model name


def run_suite(
    suite_dir: Path,
    out_dir: Path,
    *,
    run_id: str,
    agent: str,
    secret_env: tuple[str, ...] = (),
    concurrency: int = 3,
    secret_dir: Path | None = None,
    agent_version: str | None = None,
    model: ModelAccess | None = None,
    expect_agent: AgentArtifact | None = None,
    manifest_path: Path = Path(AGENT_MANIFEST_PATH),
    attempts: int = 1,
    trials: tuple[str, ...] | None = None,
    agent_image: str | None = None,
    ready_dir: Path | None = None,
) -> list[TrialSpec]:
    """Run every task of ``suite_dir`` ``attempts`` times with ``agent`` (only the trials ``trials``
    names, when given: a worker's batch); return the planned trials.

    ``expect_agent`` (the payload's artifact): the release's agent this image must carry
    (``manifest_path``) and that must report exactly its version, checked before any trial.
    ``agent_image``: the runner's own image (by id), which a Python release agent runs in, a container
    of its own per trial (``pipeline.runner.agent_box``).
    ``ready_dir``: a task's trials start only once the worker marked the task ready there (its image built
    and named in its task.toml; ``pipeline.runner.readiness``), so they run while other images still build.
    """
    for name in secret_env:
        if not ENV_NAME_RE.match(name):
            raise ValidationError("secret_env", f"must match {ENV_NAME_RE.pattern}", name)
        if name not in os.environ and secret_dir is not None and (secret_dir / name).is_file():
            # The worker mounts secrets as files: the value enters this process only, never Env or argv.
            os.environ[name] = (secret_dir / name).read_text(encoding="utf-8")
        if name not in os.environ:
            raise UsageError(f"secret_env: {name} is not set in the environment")
    harbor_version = _harbor_version()
    if agent_version is not None and agent_version != harbor_version:
        raise ValidationError("--agent-version", f"the policy pins {agent} to harbor {agent_version}; "
                              f"this runner has harbor {harbor_version}", agent_version)
    set_agent_image(agent_image)
    release = release_agent(agent, expect_agent, manifest_path, agent_image)
    if model is not None:
        # A placeholder: the relay outside the sandbox replaces it with the real key.
        os.environ["OPENAI_API_KEY"] = PLACEHOLDER_KEY
    if concurrency < 1:
        raise ValidationError("concurrency", "must be >= 1", concurrency)
    if ready_dir is not None and not ready_dir.is_dir():
        raise ValidationError("--ready-dir", "must be an existing directory (the worker's readiness marks)", str(ready_dir))
    enabled_tunings()  # a bad BENCHSEAL_HARBOR_DISABLE is a usage error before any trial starts
    os.environ["HARBOR_TELEMETRY"] = "0"
    suite_dir = suite_dir.resolve()
    out_dir = out_dir.resolve()
    trials_dir = out_dir / "harbor"
    trials_dir.mkdir(parents=True, exist_ok=True)
    tasks = discover_tasks(suite_dir)
    grading = {task: task_grading(suite_dir, task) for task in tasks}  # graded by exit status, or refused (exit 2)
    specs = select_trials(plan_trials(run_id, tasks, attempts), trials)
    if release is not None and isinstance(release.spec, NpmAgent):
        mount_agent_files(manifest_path.parent, out_dir / AGENT_COPY)
    dump_document(TrialsPlan(run_id=run_id, agent=agent,
                             agent_version=release.artifact.version if release is not None else agent_version,
                             harbor_version=harbor_version,
                             model=model.name if model else None,
                             trials=tuple(PlannedTrial(task=s.task, trial_name=s.trial_name,
                                                       canary=grading[s.task].canary) for s in specs)),
                  out_dir / TRIALS_FILE)
    relay = None
    api_base = None
    if model is not None:
        relay = TcpToUnixRelay(model.socket)
        relay.start()
        api_base = f"http://127.0.0.1:{relay.port}{model.path.rstrip('/')}"
    try:
        asyncio.run(_run_all(suite_dir, trials_dir, specs, agent, secret_env, concurrency, model, api_base, release,
                             ReadyTasks(ready_dir) if ready_dir is not None else None))
    finally:
        if relay is not None:
            relay.stop()
    return specs


def _harbor_version() -> str | None:

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
    model: ModelAccess | None = None,
    api_base: str | None = None,
    release: AgentManifest | None = None,
    ready: ReadyTasks | None = None,
) -> None:
    gate = asyncio.Semaphore(concurrency)
    # The next LOOKAHEAD trials' agent environments start while they wait for a slot: a freed slot's next trial
    # finds its container up (its start off the trial's critical path), never more than this many idle.
    lookahead = LOOKAHEAD if "prestart" in enabled_tunings() else 0
    ahead = asyncio.Semaphore(concurrency + lookahead)

    async def one(spec: TrialSpec) -> None:
        if ready is not None:
            await ready.wait(spec.task)  # before taking a slot: a ready task's trial never queues behind a build
        async with ahead:
            trial = await create_trial(_trial_config(suite_dir / spec.task, trials_dir, spec.trial_name, agent,
                                                     secret_env, model, api_base, release))
            environment = trial.agent_environment
            prestarted = lookahead > 0 and isinstance(environment, EngineEnvironment)
            if prestarted:
                environment.prestart(force_build=trial.config.environment.force_build)
            ran = False
            try:
                async with gate:
                    ran = True
                    await trial.run()  # stops its environment, whatever happens in it
            finally:
                if prestarted and not ran:  # cancelled while waiting for a slot: its container goes
                    await asyncio.shield(environment.stop(delete=True))

    try:
        results = await asyncio.gather(*(one(s) for s in specs), return_exceptions=True)
    finally:
        # Environments tear down in the background (off each trial's critical path);
        # none may outlive this process.

        await drain_teardowns()
    for spec, result in zip(specs, results, strict=True):
        if isinstance(result, BaseException):
            # The trial's own result.json (if any) carries the details; a trial
            # without one is graded as an infrastructure error.
            print(f"trial {spec.trial_name}: {type(result).__name__}: {result}", flush=True)


def _trial_config(task_dir: Path, trials_dir: Path, trial_name: str, agent: str, secret_env: tuple[str, ...],
                  model: ModelAccess | None = None, api_base: str | None = None,
                  release: AgentManifest | None = None) -> TrialConfig:
    return TrialConfig(
        task=TaskConfig(path=task_dir),
        trial_name=trial_name,
        trials_dir=trials_dir,
        agent=_agent_config(AgentConfig, agent, secret_env, model, api_base, release),
        environment=EnvironmentConfig(import_path=environment_import_path(), delete=True),
        # benchseal's verifier: the test command's exit status, never a reward file (pipeline.runner.grader).
        verifier=VerifierConfig(import_path=GRADER_IMPORT_PATH),
    )


async def create_trial(config: TrialConfig) -> Any:
    """Harbor's trial for ``config``, without the work nothing uses (``agent_logs_unread``)."""
    trial = await Trial.create(config)
    if agent_logs_unread(trial):
        trial._upload_agent_logs = _nothing
    if isinstance(trial.agent_environment, EngineEnvironment):
        # Its log dirs in its setup, or riding its first upload (EngineEnvironment.eager_dirs).
        trial.agent_environment.eager_dirs = True
    return trial


async def _nothing() -> None:
    return None


def agent_logs_unread(trial: Any) -> bool:
    """Whether nothing reads the agent's environment's ``/logs/agent`` after the agent phase, so Harbor's copy of
    the trial's agent logs back into it (one archive upload a trial, for a verifier in that environment) is skipped:
    one step, one agent, a separate verifier (which gets the artifacts only), no collect hook (a command run there
    before the artifacts are taken), and no artifact at, under or above ``/logs/agent``. The environment is removed
    right after its artifacts are taken; nothing leaves it or is checked differently."""
    if not isinstance(trial, SingleStepTrial) or trial.user_agent is not None:
        return False
    config = trial.task.config
    if resolve_task_verifier_mode(config) != VerifierEnvironmentMode.SEPARATE or config.verifier.collect:
        return False
    logs = PurePosixPath(str(trial.agent_env_paths.agent_dir))
    for artifact in normalize_artifact_entries([*config.artifacts, *trial.config.artifacts]):
        source = PurePosixPath(posixpath.normpath(str(artifact.source)))
        if not source.is_absolute() or source == logs or logs in source.parents or source in logs.parents:
            return False
    return True


def environment_import_path() -> str:
    """The engine environment; Harbor's compose one when ``BENCHSEAL_HARBOR_DISABLE`` names ``engine-api``."""
    return ENGINE_IMPORT_PATH if "engine-api" in enabled_tunings() else COMPOSE_IMPORT_PATH


def _agent_config(config_cls: Any, agent: str, secret_env: tuple[str, ...], model: ModelAccess | None,
                  api_base: str | None, release: AgentManifest | None = None) -> Any:
    if release is not None:
        # The release's own agent, baked into this image: run by import path, nothing installed.
        spec = release.spec
        model_name = model.name if model is not None else None
        if isinstance(spec, NpmAgent):
            return config_cls(import_path=CLI_AGENT_IMPORT_PATH, model_name=model_name, env={},
                              kwargs={"model_path": model.path if model is not None else "/v1"})
        # A Python agent is the adopter's code: never imported here. It runs in a container of its own
        # (the runner image, agent_box), which reaches the model through its gateway, as a task container does.
        image = box_image()
        if image is None:
            raise ValidationError("--agent-image", "is required to run a Python release agent")
        return config_cls(import_path=BOX_AGENT_IMPORT_PATH, model_name=model_name, env={},
                          kwargs={"agent_image": image, "agent_import_path": spec.import_path,
                                  "agent_kwargs": {"api_base": model_base_url(model.path)} if model is not None else {}})
    # Values stay templates (${NAME}) that Harbor resolves from this process's environment.
    if model is None:
        return config_cls(name=agent, env={name: "${" + name + "}" for name in secret_env})
    # A model-backed agent runs in THIS process; Harbor hands AgentConfig.env to the task
    # container (terminus-2 starts its tmux session with `-e KEY=VALUE`), so the env stays
    # empty and LiteLLM reads the key from this process's environment (set in run_suite).
    # No terminal recording: asciinema is not in the offline task images (and would be fetched).
    return config_cls(name=agent, model_name=model.name, env={},
                      kwargs={"api_base": api_base, "record_terminal_session": False})
