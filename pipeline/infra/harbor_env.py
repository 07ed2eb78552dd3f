"""A Harbor docker environment that keeps secret values out of every argv.

Harbor 0.26's docker backend passes exec environment variables as
``docker compose exec -e KEY=VALUE`` (visible in ``/proc/*/cmdline``) and writes
startup env values into a plain compose file. This subclass passes ``-e KEY``
without a value and puts the values into the compose process's own environment,
from which compose reads them; the startup compose file lists names only.

Imported only inside the runner image (or a host with harbor installed), via
``EnvironmentConfig(import_path="pipeline.infra.harbor_env:SecretSafeDockerEnvironment")``.
"""

from __future__ import annotations

import contextvars
import json
from pathlib import Path
from typing import Any

from harbor.constants import MAIN_SERVICE_NAME
from harbor.environments.docker import COMPOSE_NO_NETWORK_PATH, ENV_COMPOSE_NAME
from harbor.environments.docker.docker import DockerEnvironment

# Values for the compose subprocess currently being started from this asyncio task.
_exec_values: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("benchseal_exec_values", default=None)

IMPORT_PATH = "pipeline.infra.harbor_env:SecretSafeDockerEnvironment"


class SecretSafeDockerEnvironment(DockerEnvironment):  # type: ignore[misc]
    """Docker environment whose compose argv and files carry env names, never values.

    Every service it starts (agent and separate verifier alike: Harbor drops
    ``extra_docker_compose`` for the verifier) also gets Harbor's no-network
    overlay, so a trial has no network at all.
    """

    @property
    def _docker_compose_paths(self) -> list[Path]:
        paths: list[Path] = list(super()._docker_compose_paths)
        if COMPOSE_NO_NETWORK_PATH not in paths:
            paths.append(COMPOSE_NO_NETWORK_PATH)
        return paths

    def _write_env_compose_file(self) -> Path:
        import tempfile

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
