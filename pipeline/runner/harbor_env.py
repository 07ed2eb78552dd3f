"""Harbor's compose-based docker environment, kept for the benchmark's comparison only.

The runner's trials use ``pipeline.runner.engine_env.EngineEnvironment`` (the engine API through
the Docker SDK); this one is chosen when ``BENCHSEAL_HARBOR_DISABLE`` names ``engine-api``
(``bench/worker.py``'s "before" and ablation variants). It keeps secret values out of every argv:

Harbor 0.26's docker backend passes exec environment variables as
``docker compose exec -e KEY=VALUE`` (visible in ``/proc/*/cmdline``) and writes
startup env values into a plain compose file. This subclass passes ``-e KEY``
without a value and puts the values into the compose process's own environment,
from which compose reads them; the startup compose file lists names only.

A release's npm agent (``set_agent_mount``) reaches every task container as a read-only bind of
its files (Node and the package), so nothing is installed at trial time.

It also removes per-trial work the suites do not need (measured in docs/infra.md):

* ``stop_signal: SIGKILL`` on every service: a task's PID 1 (``sleep infinity``)
  ignores SIGTERM, so ``compose down`` would wait its 10 s grace period;
* ``pull_policy: never`` for prebuilt task images (the worker loads them by digest);
* no ``compose down --remove-orphans`` before ``up``: compose projects are named
  after the run's trials, and the worker removes a failed attempt's containers
  before the next attempt starts;
* teardown off the critical path: ``stop()`` hands ``compose down`` to a background
  task and returns; ``drain_teardowns()`` (awaited by ``run_suite`` before it returns)
  waits for all of them, so no container outlives the runner.

``BENCHSEAL_HARBOR_DISABLE`` (comma-separated names of ``pipeline.runner.tunings.TUNINGS``)
turns single changes off; only the benchmark uses it, to measure each one's effect.

Imported only inside the runner image (or a host with harbor installed), via
``EnvironmentConfig(import_path=pipeline.runner.trial.COMPOSE_IMPORT_PATH)``.
"""

from __future__ import annotations

import contextvars
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from harbor.constants import MAIN_SERVICE_NAME
from harbor.environments.base import ExecResult
from harbor.environments.docker import COMPOSE_NO_NETWORK_PATH, ENV_COMPOSE_NAME
from harbor.environments.docker.docker import DockerEnvironment

from pipeline.runner.envshared import agent_mount, record_timing, spawn_teardown
from pipeline.runner.tunings import enabled_tunings

# Values for the compose subprocess currently being started from this asyncio task.
_exec_values: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("benchseal_exec_values", default=None)

COMPOSE_DIR = Path(__file__).with_name("compose")
COMPOSE_FAST_STOP_PATH = COMPOSE_DIR / "fast-stop.yaml"
COMPOSE_NEVER_PULL_PATH = COMPOSE_DIR / "never-pull.yaml"
AGENT_OVERLAY_NAME = "agent-mount.compose.json"


def _agent_overlay() -> Path | None:
    """The release agent's read-only bind (``envshared.set_agent_mount``) as a compose overlay, or None."""
    mount = agent_mount()
    if mount is None:
        return None
    source, target = mount
    overlay = source.parent / AGENT_OVERLAY_NAME
    if not overlay.is_file():
        volume = {"type": "bind", "source": str(source), "target": target, "read_only": True}
        overlay.write_text(json.dumps({"services": {MAIN_SERVICE_NAME: {"volumes": [volume]}}}, indent=2),
                           encoding="utf-8")
    return overlay


class SecretSafeDockerEnvironment(DockerEnvironment):  # type: ignore[misc]
    """Docker environment whose compose argv and files carry env names, never values.

    Every service it starts (agent and separate verifier alike: Harbor drops
    ``extra_docker_compose`` for the verifier) also gets Harbor's no-network
    overlay, so a trial has no network at all.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tunings = enabled_tunings()
        self._starting = False

    @property
    def _docker_compose_paths(self) -> list[Path]:
        paths: list[Path] = list(super()._docker_compose_paths)
        if COMPOSE_NO_NETWORK_PATH not in paths:
            paths.append(COMPOSE_NO_NETWORK_PATH)
        if "stop-signal" in self._tunings:
            paths.append(COMPOSE_FAST_STOP_PATH)
        if "never-pull" in self._tunings and self._use_prebuilt:
            paths.append(COMPOSE_NEVER_PULL_PATH)
        overlay = _agent_overlay()
        if overlay is not None:
            paths.append(overlay)
        return paths

    def _write_env_compose_file(self) -> Path:
        self._cleanup_env_compose_file()
        self._env_compose_temp_dir = tempfile.TemporaryDirectory()
        path = Path(self._env_compose_temp_dir.name) / ENV_COMPOSE_NAME
        # A list entry "KEY" makes compose take the value from its own environment,
        # which _compose_env_vars fills in (persistent env is merged there).
        names = sorted(self._startup_env())
        path.write_text(json.dumps({"services": {"main": {"environment": names}}}, indent=2))
        result: Path = path
        return result

    def _compose_env_vars(self, include_os_env: bool = True) -> dict[str, str]:
        env: dict[str, str] = super()._compose_env_vars(include_os_env=include_os_env)
        env.update(self._startup_env())
        env.update(_exec_values.get() or {})
        return env

    async def _compose_exec(
        self,
        command: str,
        *,
        service: str,
        cwd: str | None,
        env: dict[str, str] | None,
        timeout_sec: int | None,
        user: str | int | None,
    ) -> Any:
        exec_command = ["exec"]
        if cwd:
            exec_command.extend(["-w", cwd])
        for key in env or {}:
            exec_command.extend(["-e", key])
        if user is not None:
            exec_command.extend(["-u", str(user)])
        exec_command.append(service)
        if service == MAIN_SERVICE_NAME:
            exec_command.extend(self._platform.exec_shell_args(command))
        else:
            exec_command.extend(["sh", "-c", command])
        token = _exec_values.set(dict(env or {}))
        try:
            return await self._run_docker_compose_command(
                exec_command,
                check=False,
                timeout_sec=timeout_sec,
                on_output=self._output_callback(),
            )
        finally:
            _exec_values.reset(token)

    async def _run_docker_compose_command(self, command: list[str], *args: Any, **kwargs: Any) -> Any:
        if self._starting and command == ["down", "--remove-orphans"] and "no-predown" in self._tunings:
            return ExecResult(stdout=None, stderr=None, return_code=0)
        started = time.monotonic()
        try:
            return await super()._run_docker_compose_command(command, *args, **kwargs)
        finally:
            self._record_timing(f"compose {command[0]}", started)

    async def start(self, force_build: bool) -> None:
        started = time.monotonic()
        self._starting = True
        try:
            await super().start(force_build)
        finally:
            self._starting = False
            self._record_timing("start", started)

    async def stop(self, delete: bool) -> None:
        if "async-stop" not in self._tunings:
            await self._stop_now(delete)
            return
        spawn_teardown(self._stop_now(delete), f"teardown-{self.session_id}")

    async def _stop_now(self, delete: bool) -> None:
        started = time.monotonic()
        try:
            await super().stop(delete)
        finally:
            self._record_timing("stop", started)

    def _record_timing(self, op: str, started: float) -> None:
        record_timing(Path(self.trial_paths.trial_dir), self.session_id, op, started)
