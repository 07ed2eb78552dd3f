"""Worker side of an agent's secrets and model access (what the runner container gets).

* Secrets by reference (never to a release's own agent, which is the adopter's code):
  each ``secret_env`` value is written to a 0400 file in a
  private 0700 directory OUTSIDE the run dir, bind-mounted read-only into the
  runner at ``SECRETS_MOUNT``. The container's Env, Labels and argv carry names
  and paths only; ``benchseal trial run`` reads the files into its own process.
* Model access: the runner keeps ``network_mode: none``. For a model-backed
  agent the worker serves a Unix socket (``relay.UnixToTcpRelay``) that connects
  to the suite's policy endpoint and nothing else, mounted at ``MODEL_MOUNT``.
  The model key never enters the sandbox: it is not among the secret files, the
  agent holds a placeholder, and the relay adds the real key on the way out.
* Version pin: the policy's agent version goes to the runner, which refuses
  to run (exit 2) when its Harbor does not match.
* Engine access: the runner's ``/var/run/docker.sock`` is an API-filtering proxy
  (``engine_proxy.EngineProxy``): its own trial containers only, binds under the
  run dir only, no privileged or host-namespace containers, pulls of the base only.

* Trial containers: the engine proxy gives each one network ``none``, or, for a
  model-backed agent, the network namespace of its own model gateway, so the model is
  ``127.0.0.1:GATEWAY_PORT`` there and nothing else is. Each gateway gets a relay socket of its
  own (``GatewayRelays``), which counts the model usage it relays under the container's compose
  project (its trial): the worker records a trial's model calls and tokens from there
  (``RunnerAgentSetup.usage``), never from what the agent reports.

Private directories (secrets, relay socket, engine socket) are created 0700 in
the temp dir and held with an exclusive ``flock`` for their lifetime; they are
removed when the attempt ends. A worker killed with -9 cannot remove them, but
the kernel drops its lock: ``reap_private_dirs`` (run by every worker before it
claims) removes every such directory (marked ``LOCK_MARKER``) whose lock nobody holds, so a secret file
outlives its worker only until the next worker on the host polls the queue. A lock is not proof of a live
worker, though: a child the worker forked holds it too until its exec (a few ms after a kill -9; measured:
23 of 200 kills of a process spawning subprocesses left it held). The directory's name says who made it
(pid namespace, pid, start time): where that process is provably gone, the directory goes, held or not.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pwd
import re
import shutil
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.contracts import DispatchPayload
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError
from pipeline.infra.intake.policy import AgentPolicy, InfraPolicy
from pipeline.infra.sandbox import engine as sandbox
from pipeline.infra.sandbox.engine_proxy import EnginePolicy, EngineProxy, ModelGateway
from pipeline.infra.sandbox.relay import CallUsage, UnixToTcpRelay, UsageTally

SECRETS_MOUNT = "/run/benchseal/secrets"
MODEL_MOUNT = "/run/benchseal/model"
MODEL_SOCKET = "model.sock"
PRIVATE_PREFIXES = ("benchseal-secrets-", "benchseal-model-", "benchseal-engine-")
LOCK_MARKER = ".benchseal-flock"

log = logging.getLogger("benchseal.agents")


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot: with the pid, it names one process); None when gone."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat_line.rsplit(")", 1)[1].split()[19])  # field 22; the command before ")" may hold anything


def _owner_tag() -> str:
    """``<pid namespace>.<pid>.<start time>.``: the process a private dir's name says made it ("" without a /proc
    that says: the dir's lock alone counts then)."""
    pid = os.getpid()
    started = _start_time(pid)
    try:
        namespace = _pid_namespace()
    except OSError:
        return ""
    return f"{namespace}.{pid}.{started}." if started is not None else ""


_OWNER = re.compile(r"(\d+)\.(\d+)\.(\d+)\.[a-z0-9_]+")


def _owner_gone(suffix: str) -> bool:
    """Whether the process that made a private dir (``suffix``: its name after the prefix, ``_owner_tag`` and
    mkdtemp's random part) is provably gone: in this pid namespace, and no process of that pid started at that
    time. Anything else (no tag, another namespace, a /proc that does not answer) is not proof."""
    match = _OWNER.fullmatch(suffix)
    if match is None:
        return False
    namespace, pid, started = map(int, match.groups())
    try:
        if namespace != _pid_namespace():
            return False
    except OSError:
        return False
    return _start_time(pid) != started


def _private_dir(prefix: str, locks: list[int]) -> Path:
    """A new 0700 directory in the temp dir, named for this process (``_owner_tag``), locked (flock) by it
    until ``close``."""
    if prefix not in PRIVATE_PREFIXES:
        raise ValueError(f"unknown private dir prefix {prefix!r}")
    path = Path(tempfile.mkdtemp(prefix=prefix + _owner_tag()))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    locks.append(fd)
    # Marks a directory whose lifetime is its lock (a directory without it is never reaped).
    (path / LOCK_MARKER).touch(mode=0o400)
    return path


def _lock_free(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def reap_private_dirs(tmp: Path | None = None) -> list[Path]:
    """Remove private dirs (secrets, relay, engine sockets) whose creating process is gone: its lock is free,
    or its name says who made it and that process is no more (the lock held by a child it forked)."""
    root = Path(tmp or tempfile.gettempdir())
    removed: list[Path] = []
    for prefix in PRIVATE_PREFIXES:
        for path in sorted(root.glob(prefix + "*")):
            try:
                if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid() \
                        or not (path / LOCK_MARKER).is_file():
                    continue
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                if not _lock_free(fd) and not _owner_gone(path.name[len(prefix):]):
                    continue  # held: a live worker's attempt
                shutil.rmtree(path, ignore_errors=True)
                if not path.exists():
                    removed.append(path)
                    log.warning("removed %s, left behind by a worker that died", path)
            finally:
                os.close(fd)
    return removed


class GatewayRelays:
    """A relay socket per model gateway, made when the engine proxy starts one (``ModelGateway.socket_for``), in
    the relay's private directory: the same endpoint, key and rules as the runner's own socket, its usage counted
    under the trial container's compose project. ``owner``: (uid, gid) the sockets are given to (the sandbox's
    service user, which connects as container root)."""

    def __init__(self, sockets: Path, host: str, port: int, *, tls: bool, model_path: str, api_key: str,
                 usage: UsageTally, owner: tuple[int, int] | None) -> None:
        self._sockets, self._host, self._port, self._tls = sockets, host, port, tls
        self._model_path, self._api_key, self._usage, self._owner = model_path, api_key, usage, owner
        self._lock = threading.Lock()
        self.relays: list[UnixToTcpRelay] = []

    def __call__(self, project: str) -> str:
        with self._lock:
            name = f"gateway-{len(self.relays) + 1}.sock"
            relay = UnixToTcpRelay(self._sockets / name, self._host, self._port, tls=self._tls,
                                   model_path=self._model_path, api_key=self._api_key, usage=self._usage,
                                   usage_key=project.lower())
            self.relays.append(relay)
        if self._owner is not None:
            os.chown(self._sockets / name, *self._owner)
        relay.start()
        return name

    def stop(self) -> None:
        with self._lock:
            relays, self.relays = self.relays, []
        for relay in relays:
            relay.stop()


@dataclass
class RunnerAgentSetup:
    """Extra argv (names and paths only), volumes, and what to tear down afterwards."""

    args: list[str] = field(default_factory=list)
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    relay: UnixToTcpRelay | None = None
    gateways: GatewayRelays | None = None
    # The model usage every relay of this setup counted, by trial container's compose project ("": the runner's own).
    usage: UsageTally = field(default_factory=UsageTally)
    engine: EngineProxy | None = None
    dirs: list[Path] = field(default_factory=list)
    locks: list[int] = field(default_factory=list)  # flock'd fds of ``dirs`` (released by close or by death)

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
        if self.gateways is not None:
            self.gateways.stop()
            self.gateways = None
        if self.engine is not None:
            self.engine.stop()
            self.engine = None
        for path in self.dirs:
            try:
                sandbox.reclaim(path)  # a gateway may have left entries the worker could not otherwise remove
            except (InfrastructureError, CheckFailed) as exc:
                log.warning("%s", exc)
            shutil.rmtree(path, ignore_errors=True)
        self.dirs.clear()
        for fd in self.locks:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.locks.clear()


def trial_usage(usage: UsageTally, trial: str, trials: Sequence[str]) -> CallUsage | None:
    """``trial``'s model usage as its containers' gateways counted it (None when no relay counted: the agent has no
    model). A count's key is a compose project: the agent box's is the trial's name, the task environment's
    ``<trial>__env``; each key goes to the one of ``trials`` (the batch's) it names most specifically."""
    if not usage.counting:
        return None
    total = CallUsage()
    for key, counted in usage.snapshot().items():
        named = [t for t in trials if key == t.lower() or key.startswith(t.lower() + "__")]
        if named and max(named, key=len) == trial:
            total = total.plus(counted)
    return total


def prepare_runner_agent(policy: InfraPolicy, payload: DispatchPayload, *, run_dir: Path | None = None,
                         docker_socket: str = "/var/run/docker.sock",
                         pull_repositories: tuple[str, ...] = (), runner_image: str | None = None,
                         labels: dict[str, str] | None = None, sandbox_user: str | None = None,
                         granted: Path | None = None,
                         usage: UsageTally | None = None) -> RunnerAgentSetup:
    """Secret files, the model relay, the agent arguments and (with ``run_dir``) the filtered engine socket.

    With a model and ``runner_image``, the engine proxy starts a model gateway (that image,
    carrying ``labels``) for each trial container; without, trial containers get no network.
    Everything the runner creates through the proxy carries ``labels`` too (the worker removes it by them).
    With ``sandbox_user`` (the rootless sandbox engine's service user, which is container root
    there), the private dirs' contents are that user's and the dirs get an ACL entry for it alone:
    still 0700/0400 to everyone else, never world-readable. ``usage``: where the relays count the model usage
    (the caller's, so it outlives the setup; a new one otherwise).
    """
    entry, model = policy.agent(payload.agent, payload.suite)
    setup = RunnerAgentSetup(usage=usage if usage is not None else UsageTally())
    try:
        if isinstance(entry, AgentPolicy):  # a Harbor agent: the runner's Harbor must be that version
            setup.args += ["--agent-version", entry.version]
        if payload.agent_artifact is not None:
            # The runner compares it with the manifest its image carries before any trial.
            setup.args += ["--expect-agent", payload.agent_artifact.model_dump_json()]
        present = [name for name in policy.secret_env if name in os.environ]
        if model is not None and not os.environ.get(model.key_env):
            raise UsageError(f"agent {payload.agent} needs the model key: {model.key_env} is not set in the worker's environment")
        if model is not None:
            present = [name for name in present if name != model.key_env]  # the relay's alone
        if payload.agent_artifact is not None:
            # A release's own agent is the adopter's code, and a Python one runs in the runner process:
            # no secret of the infra host is handed to it (its model key stays with the relay).
            present = []
        if present:
            secrets = _private_dir("benchseal-secrets-", setup.locks)
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
        gateway = None
        if model is not None:
            sockets = _private_dir("benchseal-model-", setup.locks)
            setup.dirs.append(sockets)
            host, port, tls = model.host_port
            setup.usage.counting = True
            setup.relay = UnixToTcpRelay(sockets / MODEL_SOCKET, host, port, tls=tls, model_path=model.path,
                                         api_key=os.environ[model.key_env], usage=setup.usage)
            setup.relay.start()
            setup.volumes[str(sockets)] = {"bind": MODEL_MOUNT, "mode": "rw"}
            setup.args += ["--model-socket", f"{MODEL_MOUNT}/{MODEL_SOCKET}", "--model-path", model.path or "/",
                           "--model-name", model.name]
            if runner_image is not None:
                account = pwd.getpwnam(sandbox_user) if sandbox_user is not None else None
                setup.gateways = GatewayRelays(sockets, host, port, tls=tls, model_path=model.path,
                                               api_key=os.environ[model.key_env], usage=setup.usage,
                                               owner=(account.pw_uid, account.pw_gid) if account else None)
                gateway = ModelGateway(image=runner_image, socket_dir=sockets, mount=MODEL_MOUNT,
                                       socket_name=MODEL_SOCKET, labels=dict(labels or {}),
                                       socket_for=setup.gateways)
        if run_dir is not None:
            engine = _private_dir("benchseal-engine-", setup.locks)
            setup.dirs.append(engine)
            setup.engine = EngineProxy(engine / "docker.sock", EnginePolicy(
                bind_roots=(run_dir,), pull_repositories=pull_repositories, gateway=gateway,
                labels=dict(labels or {}),
                # ``granted``: the batch dir the worker granted the sandbox's user; kept reachable with these dirs.
                reachable=(*([granted] if granted is not None else []), *setup.dirs),
                reachable_by=sandbox.service_uid(sandbox_user) if sandbox_user is not None else None),
                upstream=docker_socket)
            setup.engine.start()
            setup.volumes[str(engine / "docker.sock")] = {"bind": "/var/run/docker.sock", "mode": "rw"}
        if sandbox_user is not None:
            for path in setup.dirs:
                sandbox.grant(path, sandbox.Sandbox(base=sandbox.DEFAULT_DIR, user=sandbox_user))
    except BaseException:
        setup.close()
        raise
    return setup
