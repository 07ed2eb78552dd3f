"""Worker side of an agent's secrets and model access (what the runner container gets).

* Secrets by reference: each ``secret_env`` value is written to a 0400 file in a
  private 0700 directory OUTSIDE the run dir, bind-mounted read-only into the
  runner at ``SECRETS_MOUNT``. The container's Env, Labels and argv carry names
  and paths only; ``benchseal trial run`` reads the files into its own process.
* Model access: the runner keeps ``network_mode: none``. For a model-backed
  agent the worker serves a Unix socket (``relay.UnixToTcpRelay``) that connects
  to the suite's policy endpoint and nothing else, mounted at ``MODEL_MOUNT``.
* Version pin: the policy's agent version goes to the runner, which refuses
  to run (exit 2) when its Harbor does not match.
* Engine access: the runner's ``/var/run/docker.sock`` is an API-filtering proxy
  (``engine_proxy.EngineProxy``): its own trial containers only, binds under the
  run dir only, no privileged or host-namespace containers, pulls of the base only.

Both directories are removed when the attempt ends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.contracts import DispatchPayload
from pipeline.errors import UsageError
from pipeline.infra.engine_proxy import EnginePolicy, EngineProxy
from pipeline.infra.policy import InfraPolicy
from pipeline.infra.relay import UnixToTcpRelay

SECRETS_MOUNT = "/run/benchseal/secrets"
MODEL_MOUNT = "/run/benchseal/model"
MODEL_SOCKET = "model.sock"


@dataclass
class RunnerAgentSetup:
    """Extra argv (names and paths only), volumes, and what to tear down afterwards."""

    args: list[str] = field(default_factory=list)
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    relay: UnixToTcpRelay | None = None
    engine: EngineProxy | None = None
    dirs: list[Path] = field(default_factory=list)

    secrets_dir: Path | None = None

    def drop_secrets(self) -> None:
        """Remove the secret files (the runner has read them once it has planned its trials)."""
        if self.secrets_dir is not None:
            shutil.rmtree(self.secrets_dir, ignore_errors=True)
            self.secrets_dir = None

    @property
    def model_connections(self) -> int:
        return self.relay.connections if self.relay is not None else 0

    def close(self) -> None:
        if self.relay is not None:
            self.relay.stop()
            self.relay = None
        if self.engine is not None:
            self.engine.stop()
            self.engine = None
        for path in self.dirs:
            shutil.rmtree(path, ignore_errors=True)
        self.dirs.clear()


def prepare_runner_agent(policy: InfraPolicy, payload: DispatchPayload, *, run_dir: Path | None = None,
                         docker_socket: str = "/var/run/docker.sock",
                         pull_repositories: tuple[str, ...] = ()) -> RunnerAgentSetup:
    """Secret files, the model relay, the agent arguments and (with ``run_dir``) the filtered engine socket."""
    entry, model = policy.agent(payload.agent, payload.suite)
    setup = RunnerAgentSetup()
    try:
        if run_dir is not None:
            engine = Path(tempfile.mkdtemp(prefix="benchseal-engine-"))
            setup.dirs.append(engine)
            setup.engine = EngineProxy(engine / "docker.sock", EnginePolicy(
                bind_roots=(run_dir,), pull_repositories=pull_repositories), upstream=docker_socket)
            setup.engine.start()
            setup.volumes[str(engine / "docker.sock")] = {"bind": "/var/run/docker.sock", "mode": "rw"}
        if entry is not None:
            setup.args += ["--agent-version", entry.version]
        present = [name for name in policy.secret_env if name in os.environ]
        if model is not None and model.key_env not in present:
            raise UsageError(f"agent {payload.agent} needs the model key: {model.key_env} is not set in the worker's environment")
        if present:
            secrets = Path(tempfile.mkdtemp(prefix="benchseal-secrets-"))
            setup.dirs.append(secrets)
            setup.secrets_dir = secrets
            for name in present:
                path = secrets / name
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(os.environ[name])
                setup.args += ["--secret-env", name]
            setup.args += ["--secret-dir", SECRETS_MOUNT]
            setup.volumes[str(secrets)] = {"bind": SECRETS_MOUNT, "mode": "ro"}
        if model is not None:
            sockets = Path(tempfile.mkdtemp(prefix="benchseal-model-"))
            setup.dirs.append(sockets)
            host, port, tls = model.host_port
            setup.relay = UnixToTcpRelay(sockets / MODEL_SOCKET, host, port, tls=tls)
            setup.relay.start()
            setup.volumes[str(sockets)] = {"bind": MODEL_MOUNT, "mode": "rw"}
            setup.args += ["--model-socket", f"{MODEL_MOUNT}/{MODEL_SOCKET}", "--model-path", model.path or "/",
                           "--model-name", model.name, "--model-key-env", model.key_env]
    except BaseException:
        setup.close()
        raise
    return setup
