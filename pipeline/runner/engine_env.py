"""benchseal's Harbor environment: one task container driven through the engine API (Docker SDK).

Harbor 0.26's docker environment runs one ``docker compose`` process per operation (up, exec, cp,
down: 0.15-0.4 s each on this project's machines, about ten per environment). This environment
implements ``harbor.environments.base.BaseEnvironment`` with engine API calls made by the Docker
SDK from the runner process itself (the engine proxy's socket is the runner's
``/var/run/docker.sock``; every call is one request, blocking SDK calls run in worker threads):

* ``start``: the task's prebuilt image (``[environment] docker_image``, which the worker pins by
  image id; never pulled: a missing image is an error), else an image built from
  ``environment/Dockerfile`` through ``/build`` (classic builder, tagged per environment, removed
  with it); then one container create and start. The container: ``sh -c "sleep infinity"``,
  network ``none`` (the proxy forces it too, or the trial's model gateway), ``StopSignal``
  SIGKILL, the task's cpus / memory_mb as limits, the release agent's files bound read-only
  (``envshared.set_agent_mount``), no environment variables (the task's ``[environment].env``
  reaches every exec through Harbor's persistent env, in the exec's request body), and the labels
  compose would give it (``com.docker.compose.project`` = the session), by which the worker finds
  a dead attempt's leftovers;
* ``exec``: exec create (command ``bash -c``, env, user, workdir in the JSON body: no value in any
  argv) and start, whose multiplexed stream is read to its end (a timeout or cancellation closes it),
  then the exit code from exec inspect;
* ``upload_*`` / ``download_*``: tar archives through ``PUT`` / ``GET /containers/{id}/archive``
  (owner root in the container; extracted on this side with Harbor's transfer filter, member by
  member: absolute paths, links leaving the target and device files are skipped); ``is_dir`` /
  ``is_file`` as root are a ``HEAD`` of the same resource (no process in the container; an archive
  upload is not cheaper than an exec: the engine extracts it in a re-executed helper process);
  downloads under the log dirs' parent (``/logs``) read one archive of it, taken by the first and kept
  until anything else is done in the container (Harbor's copies of the agent's log file, ``/logs/agent``
  and the ``/logs/artifacts`` artifact: one download where there were three and a stat); a path whose
  entries could differ from the engine's own archive of it (a link, a hard link leaving it) and a
  snapshot over the download bounds go to the engine;
* Harbor's dir commands (as root) issued before anything else was done in a started container run
  with the log dirs in one exec before the next other operation (a verifier environment's three
  ``empty_dirs``); an agent's environment whose image has no ``/logs`` sends its log dirs as archive
  entries with its first upload into ``/`` (the oracle's ``/solution``: no exec for them); and
  ``upload_root_only`` gives the grader a fresh root-only ``/tests`` in one archive upload whose
  entries carry the owners and modes (``pipeline.runner.rootonly``);
* ``stop``: the container (and a built image) removed with force (SIGKILL) in a background task
  (``envshared.drain_teardowns`` awaits them all before the runner exits).

A task ``docker-compose.yaml`` (several services) is refused: no suite here has one. Each operation
appends a line to the trial dir's ``env-timings.jsonl``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import posixpath
import re
import socket
import struct
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import IO, Any, TypeVar

import docker
import docker.errors
from harbor.constants import MAIN_SERVICE_NAME
from harbor.environments.base import BaseEnvironment, ExecResult, transfer_tar_filter
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.definition import (
    COMPOSE_FILE_NAME,
    DOCKERFILE_NAME,
    require_agent_environment_definition,
    should_use_prebuilt_docker_image,
)
from harbor.models.trial.config import ResourceMode

from pipeline.infra.sandbox.limits import DEFAULT_FSIZE, TRIAL_PIDS
from pipeline.runner import rootonly
from pipeline.runner.envshared import agent_mount, created_id, record_timing, spawn_teardown
from pipeline.runner.tunings import enabled_tunings

ENGINE_ENV = "DOCKER_HOST"  # the runner's is unset: the SDK's default, /var/run/docker.sock (the proxy)
_GO_MODE_DIR = 1 << 31
_GO_MODE_SYMLINK = 1 << 27
_GO_MODE_TYPE = (1 << 31) | (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 23) | (1 << 21) | (1 << 19)
# What one download (a trial's /app artifacts, its log dirs) may bring out of a container: whatever the agent
# left there is copied into the trial dir and then into the run's evidence, which has limits of its own (the
# export's 512 MiB): an agent must not be able to keep its run from being sealed. Sizes are apparent sizes
# (a sparse file counts in full). Over a bound nothing is extracted and the download fails; Harbor's artifact
# collection is best effort, so the verifier then sees the task's own /app and the trial fails as the agent's.
MAX_DOWNLOAD_BYTES = 64 << 20
MAX_DOWNLOAD_MEMBERS = 20_000
# The snapshot of /logs (downloads under it read one archive of it) only while it is this small: logs are, and a
# download of one small path must not bring a large /logs out each time (a bigger one: each path asked of the engine).
SNAPSHOT_MAX_BYTES = 8 << 20
# Each stream of one exec's output kept in memory (an agent printing gigabytes must not exhaust the runner).
MAX_EXEC_OUTPUT = 16 << 20
_T = TypeVar("_T")

# Blocking engine calls run here: a long exec (the agent's) holds a thread, so more than asyncio's
# default pool (cpus + 4), which concurrent trials could exhaust while a teardown waits behind them.
_calls = ThreadPoolExecutor(max_workers=64, thread_name_prefix="engine")
_client_lock = threading.Lock()
_client: Any = None


class EngineFault(RuntimeError):
    """The engine failed to start an environment: the infrastructure's fault (``scoring.INFRA_EXCEPTIONS``)."""


def engine() -> Any:
    """The process's one engine client (API version negotiated once)."""
    global _client
    with _client_lock:
        if _client is None:
            _client = docker.APIClient(base_url=os.environ.get(ENGINE_ENV) or "unix:///var/run/docker.sock",
                                       version="auto", timeout=600)
        return _client


def _project_name(session_id: str) -> str:
    """The compose project name Harbor's docker environment gives ``session_id`` (lowercase, [a-z0-9_-])."""
    name = session_id.lower()
    if not re.match(r"^[a-z0-9]", name):
        name = "0" + name
    return re.sub(r"[^a-z0-9_-]", "-", name)


class EngineEnvironment(BaseEnvironment):  # type: ignore[misc]
    """A task's one container on the engine, driven through the engine API (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("keep_containers", None)  # a DockerEnvironment option: containers are always removed
        super().__init__(*args, **kwargs)
        self._tunings = enabled_tunings()
        self._project = _project_name(self.session_id)
        self._container: str | None = None
        self._built_image: str | None = None
        self._starting: asyncio.Future[Any] | None = None
        # The log dirs start() owes (Harbor's mount targets, made 0777 as root), run with the first thing done in
        # the container: merged into Harbor's own next dir command (a verifier environment's first one empties
        # /logs/verifier), else alone before any other operation. One exec fewer per verifier environment.
        self._owed_dirs: str | None = None
        # Harbor's own dir commands (empty_dirs / ensure_dirs as root) issued while the log dirs are still owed, so
        # before anything else was done in the container: run with them, in one exec, just before the next other
        # operation (a verifier environment's empty_dirs of /logs/verifier, /logs/artifacts and /app: three execs
        # become one); the dirs they make, where an empty directory's upload then needs nothing sent.
        self._deferred: list[str] = []
        self._deferred_dirs: set[str] = set()
        self._owed_lock = asyncio.Lock()
        # One archive of the log dirs' parent (/logs), taken by the first download under it and read by the next
        # ones (Harbor's copies of the agent's log file, /logs/agent and the /logs/artifacts artifact, and their
        # is_dir) until anything else is done in the container (an exec, an upload, stop): one engine download where
        # there were three and a stat. Each path's entries are those the engine's own archive of it would hold.
        self._snapshot: IO[bytes] | None = None
        self._snapshot_refused = False  # over the download bounds, or not there: each path asked of the engine
        self._snapshot_lock = threading.Lock()
        # Made by start() itself instead (the runner sets it on a trial's agent environment, whose first operation
        # is never Harbor's dir command): their exec stays in Harbor's environment setup, as with Harbor's own
        # environments, and is not counted in the agent's phase. Unless a stat there finds no log dirs' parent
        # (/logs): then what the command would make is known (the parent root's 0755, each dir root's 0777) and
        # rides as archive entries with the first upload into / (the oracle's /solution), no exec at all; any other
        # first operation settles them with the exec first, as a verifier environment's.
        self.eager_dirs = False
        self._owed_entries: tuple[tuple[str, int], ...] | None = None
        # ``prestart``'s start, begun before the trial's turn (the runner's lookahead), and its force_build.
        self._prestarted: tuple[asyncio.Task[None], bool] | None = None

    # --- what Harbor asks of an environment ------------------------------------------------

    @staticmethod
    def type() -> str:
        return "benchseal-engine"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # Every container has network none (or the trial's model gateway, forced by the proxy).
        return EnvironmentCapabilities(disable_internet=True)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    def _validate_definition(self) -> None:
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image,
                                             extra_docker_compose_paths=self.extra_docker_compose_paths)
        if (self.environment_dir / COMPOSE_FILE_NAME).exists():
            raise ValueError(f"{self.environment_dir / COMPOSE_FILE_NAME}: compose task environments (several "
                             "services) are not supported by benchseal's engine environment")

    def prestart(self, force_build: bool) -> None:
        """Begin ``start(force_build)`` now, in the background: the runner's lookahead, for a trial still waiting for
        its slot. Harbor's own ``start`` then waits for that same start (its failure surfaces there, as ever), and
        ``stop`` removes what it made, also where the trial never ran."""
        if self._prestarted is None:
            task = asyncio.get_running_loop().create_task(self._start(force_build), name=f"prestart-{self.session_id}")
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved by start or stop
            self._prestarted = (task, force_build)

    async def start(self, force_build: bool) -> None:
        if self._prestarted is None:
            await self._start(force_build)
            return
        task, prestarted_with = self._prestarted
        if prestarted_with != force_build:
            raise EngineFault(f"starting the environment {self.session_id} failed: it was started ahead with "
                              f"force_build={prestarted_with}, and Harbor asks for force_build={force_build}")
        await asyncio.shield(task)  # a timeout cancels this wait, not the start: stop removes what it made

    async def _start(self, force_build: bool) -> None:
        started = time.monotonic()
        try:
            image = await self._image(force_build)
            self._starting = asyncio.get_running_loop().run_in_executor(_calls, self._create_and_start, image)
            await asyncio.shield(self._starting)
            await self._upload_environment_dir_after_start()
            targets = self._mount_targets(writable_only=True)
            dirs = self._ensure_dirs_command(targets, chmod=True) if targets else None
            entries = await self._log_dir_entries(targets) if dirs is not None and self.eager_dirs else None
            if dirs is not None and self.eager_dirs and entries is None:
                await self._exec_command(dirs, user="root")
            else:
                self._owed_dirs, self._owed_entries = dirs, entries
        except (asyncio.CancelledError, TimeoutError):
            raise
        except Exception as exc:
            # Before any agent code runs in it (an agent's environment, or a fresh verifier environment):
            # a failure here is the machinery's, so the grader counts it as an infrastructure error.
            raise EngineFault(f"starting the environment {self.session_id} failed: {_engine_error(exc)}") from exc
        finally:
            self._record("start", started)

    async def stop(self, delete: bool) -> None:
        self._forget_snapshot()
        if "async-stop" in self._tunings:
            spawn_teardown(self._stop_now(), f"teardown-{self.session_id}")
        else:
            await self._stop_now()

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        await self._settle()
        return await self._exec_command(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)

    async def _exec_command(self, command: str, *, cwd: str | None = None, env: dict[str, str] | None = None,
                            timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        self._forget_snapshot()
        started = time.monotonic()
        try:
            result = await self._exec(["bash", "-c", command], cwd=cwd or self.task_env_config.workdir,
                                      env=self._merge_env(env), user=self._resolve_user(user), timeout_sec=timeout_sec)
        finally:
            self._record("exec", started)
        callback = self._output_callback()
        if callback is not None:
            for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
                for line in (text or "").splitlines(keepends=True):
                    await callback(line, stream)
        return result

    async def ensure_dirs(self, dirs: Any, *, chmod: bool = True) -> ExecResult | None:
        if not dirs or not chmod:
            return await super().ensure_dirs(dirs, chmod=chmod)  # not as root: after the owed dirs (exec settles)
        return await self._dirs_as_root(self._ensure_dirs_command(dirs, chmod=True), dirs)

    async def empty_dirs(self, dirs: Any, *, chmod: bool = True) -> ExecResult | None:
        if not dirs:
            return None
        return await self._dirs_as_root(self._empty_dirs_command(dirs, chmod=chmod), dirs)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        self._forget_snapshot()
        await self._op("upload", self._upload_file, Path(source_path), target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        self._forget_snapshot()
        source = Path(source_dir)
        if (self._owed_dirs is not None and posixpath.normpath(target_dir) in self._deferred_dirs
                and source.is_dir() and not any(source.iterdir())):
            # Nothing to copy into a directory a deferred dir command makes (Harbor re-uploads an agent's empty
            # artifacts dir into every verifier environment): no engine operation at all, and none recorded.
            return
        if self._owed_entries is not None and source.is_dir() and self._clear_of_logs(target_dir):
            async with self._owed_lock:
                entries = self._owed_entries
                if entries is not None and not self._deferred:
                    await self._upload_dir_with_log_dirs(source, target_dir, entries)
                    return
        await self._op("upload", self._upload_dir, source, target_dir)

    async def _upload_dir_with_log_dirs(self, source: Path, target: str, entries: tuple[tuple[str, int], ...]) -> None:
        """The upload, the owed log dirs riding in its archive when it lands in ``/`` (a missing target dir there).
        Into an existing dir they stay owed (its archive goes there): the next operation settles them, still before
        any agent code (only an exec runs any, and ``target`` is clear of the log dirs). A failure is the
        machinery's (EngineFault), as the exec's in start() would have been."""
        started = time.monotonic()
        try:
            rode = await self._call(self._upload_dir, source, target, entries)
        except (asyncio.CancelledError, TimeoutError):
            raise
        except Exception as exc:
            raise EngineFault(f"preparing the environment {self.session_id} failed: uploading {target} with its "
                              f"log dirs: {_engine_error(exc)}") from exc
        finally:
            self._record("upload", started)
        if rode:
            self._owed_dirs = self._owed_entries = None

    async def upload_root_only(self, source_dir: Path, target_dir: str, root_dirs: tuple[str, ...] = ()) -> None:
        """``source_dir`` as a fresh ``target_dir`` that only root can use, and each of ``root_dirs`` made (if
        missing) root's, in one archive upload whose entries carry the owners and modes of the grader's root-only
        rule (``pipeline.runner.rootonly``, shared with the grader's chmod path). What ``target_dir`` held before
        (a task image's own) is removed first, by an exec only when a stat finds something there. The grader's tests
        (``pipeline.runner.grader``): one stat and one upload where a mkdir, the upload and a chown/chmod exec were."""
        self._forget_snapshot()
        await self._settle()
        target = posixpath.normpath(target_dir)
        if target == "/" or any(posixpath.normpath(d) in ("/", target) for d in root_dirs):
            raise ValueError(f"upload_root_only: {target_dir} / {root_dirs} would replace the root or overlap")
        kind = await self._stat(target)
        if kind != "missing":
            started = time.monotonic()
            try:
                result = await self._exec(["rm", "-rf", "--", target], cwd=None, env=None, user="root",
                                          timeout_sec=None)
            finally:
                self._record("exec", started)
            if result.return_code != 0:
                raise RuntimeError(f"rm -rf {target} failed in {self.session_id}: {result.stderr or result.stdout}")
        started = time.monotonic()
        try:
            data = _pack_root_only(source_dir, target.lstrip("/"), tuple(d.strip("/") for d in root_dirs))
            if not await self._call(self._put, "/", data):
                raise RuntimeError(f"could not upload into / of {self.session_id}")
        finally:
            self._record("upload", started)

    async def _stat(self, path: str) -> str | None:
        """What ``path`` is in the container (``_stat_kind``), one engine request recorded as a "stat"."""
        started = time.monotonic()
        try:
            return await self._call(self._stat_kind, path)
        finally:
            self._record("stat", started)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self._download(self._download_file, source_path, Path(target_path))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self._download(self._download_dir, source_dir, Path(target_dir))

    async def _download(self, fn: Callable[[str, Path], bool], source: str, target: Path) -> None:
        await self._settle()
        started = time.monotonic()
        fetched = True
        try:
            fetched = await self._call(fn, source, target)
        finally:
            # "snapshot": served from the snapshot already held, no engine request.
            self._record("download" if fetched else "snapshot", started)

    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        kind = await self._kind_as_root(path, user)
        return kind == "dir" if kind is not None else bool(await super().is_dir(path, user=user))

    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        kind = await self._kind_as_root(path, user)
        return kind == "file" if kind is not None else bool(await super().is_file(path, user=user))

    # --- the log dirs start() owes ---------------------------------------------------------------

    async def _settle(self) -> None:
        """The owed log dirs, and Harbor's dir commands deferred with them, made in one exec as root before anything
        else is done in the container. Nothing but root dir commands ran there yet (no agent code, no upload): a
        failure is the machinery's (EngineFault), raised here, where Harbor itself would have gone on regardless."""
        if self._owed_dirs is None:
            return
        async with self._owed_lock:
            if self._owed_dirs is None:
                return
            deferred = " && ".join(f"{{ {command}; }}" for command in self._deferred)
            # As start() ran them: the log dirs' output and status ignored; the deferred commands' are checked.
            command = f"{{ {self._owed_dirs}; }} >/dev/null 2>&1; {deferred}" if deferred else self._owed_dirs
            result = await self._owed_exec(command)
            if deferred and result.return_code != 0:
                raise EngineFault(f"preparing the environment {self.session_id} failed: its directory commands "
                                  f"exited {result.return_code}: {(result.stderr or result.stdout or '').strip()[:300]}")
            self._deferred.clear()
            self._deferred_dirs.clear()

    async def _dirs_as_root(self, command: str, dirs: Any) -> ExecResult:
        """Harbor's dir command (ensure_dirs / empty_dirs, as root): deferred to the next other operation while the
        log dirs are owed (its status is then checked there: what Harbor gets back here is a success), else run."""
        if self._owed_dirs is None:
            return await self._exec_command(command, user="root")
        async with self._owed_lock:
            if self._owed_dirs is None:
                return await self._exec_command(command, user="root")
            self._deferred.append(command)
            self._deferred_dirs.update(posixpath.normpath(str(d)) for d in dirs)
            return ExecResult(stdout=None, stderr=None, return_code=0)

    async def _log_dir_entries(self, targets: list[str]) -> tuple[tuple[str, int], ...] | None:
        """The archive entries that make exactly what ``mkdir -p TARGETS && chmod 777 TARGETS`` (as root, umask
        022) would: when the log dirs' one parent is a dir of ``/`` that a stat finds missing, that parent root's
        0755 and each target root's 0777. None (the exec, then): anything there (an image's own /logs, a link)."""
        root = self._logs_root()
        if root is None or posixpath.dirname(root) != "/" or root == "/":
            return None
        kind = await self._stat(root)
        if kind != "missing":
            return None
        return ((root.lstrip("/"), 0o755),
                *((posixpath.normpath(t).lstrip("/"), 0o777) for t in dict.fromkeys(targets)))

    def _clear_of_logs(self, target: str) -> bool:
        """Whether an upload into ``target`` cannot touch the log dirs' parent (neither it, under it, nor above)."""
        root, target = self._logs_root(), posixpath.normpath(target)
        return (root is not None and target != "/" and target != root and not target.startswith(root + "/")
                and not root.startswith(target + "/"))

    async def _owed_exec(self, command: str) -> ExecResult:
        try:
            result = await self._exec_command(command, user="root")
        except (asyncio.CancelledError, TimeoutError):
            raise
        except Exception as exc:  # start()'s work, before any agent code ran: the machinery's failure
            raise EngineFault(f"starting the environment {self.session_id} failed: {_engine_error(exc)}") from exc
        self._owed_dirs = self._owed_entries = None
        return result

    # --- start and stop ----------------------------------------------------------------------

    async def _image(self, force_build: bool) -> str:
        prebuilt = self.task_env_config.docker_image
        if should_use_prebuilt_docker_image(self.environment_dir, docker_image=prebuilt, force_build=force_build):
            return str(prebuilt)  # never pulled: the worker loaded it; the create fails when it is absent
        started = time.monotonic()
        try:
            return await self._call(self._build)
        finally:
            self._record("build", started)

    def _build(self) -> str:
        tag = f"{self._project}-main"
        api = engine()
        output = api.build(path=str(self.environment_dir), dockerfile=DOCKERFILE_NAME, tag=tag, rm=True,
                           forcerm=True, pull=False, decode=True, network_mode="none")
        for chunk in output:
            if "error" in chunk:
                raise RuntimeError(f"building the environment image of {self.environment_name} failed: "
                                   f"{str(chunk.get('error'))[:2000]}")
        self._built_image = tag
        return tag

    def _create_and_start(self, image: str) -> None:
        api = engine()
        host: dict[str, Any] = {"network_mode": "none"}
        mounts = [docker.types.Mount(target=str(m["target"]), source=str(m["source"]), type="bind",
                                     read_only=bool(m.get("read_only")))
                  for m in self._host_mounts if m.get("type") == "bind"]
        if any(m.get("type") != "bind" for m in self._host_mounts):
            raise ValueError("only bind mounts are supported by benchseal's engine environment")
        shared = agent_mount()
        if shared is not None:
            mounts.append(docker.types.Mount(target=shared[1], source=str(shared[0]), type="bind", read_only=True))
        if mounts:
            host["mounts"] = mounts
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        if cpus is not None:
            host["nano_cpus"] = int(float(cpus) * 1e9)
        memory = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        if memory is not None:
            host["mem_limit"] = f"{int(memory)}m"
            host["memswap_limit"] = host["mem_limit"]  # no swap beyond the declared memory
        # A bound on processes, and on a file's size (RLIMIT_FSIZE: a sparse file counts by its apparent size).
        host["pids_limit"] = TRIAL_PIDS
        storage = self.task_env_config.storage_mb
        fsize = int(storage) << 20 if storage else DEFAULT_FSIZE
        host["ulimits"] = [docker.types.Ulimit(name="fsize", soft=fsize, hard=fsize)]
        reservation = self._resource_request_value("memory", auto_mode=ResourceMode.LIMIT)
        if reservation is not None:
            host["mem_reservation"] = f"{int(reservation)}m"
        labels = {"com.docker.compose.project": self._project, "com.docker.compose.service": MAIN_SERVICE_NAME,
                  "com.docker.compose.container-number": "1", "com.docker.compose.oneoff": "False",
                  "com.docker.compose.project.working_dir": str(self.environment_dir.resolve())}
        created = api.create_container(image, command=["sh", "-c", "sleep infinity"], name=f"{self._project}-main-1",
                                       labels=labels, stop_signal="SIGKILL", stop_timeout=1,
                                       host_config=api.create_host_config(**host))
        self._container = created_id(created, "container")
        api.start(self._container)

    async def _stop_now(self) -> None:
        started = time.monotonic()
        try:
            if self._prestarted is not None:
                with contextlib.suppress(BaseException):
                    await self._prestarted[0]  # begun ahead: its container (or its failure) first
            if self._starting is not None:
                with contextlib.suppress(BaseException):
                    await self._starting  # a start still creating its container: remove what it made
            await self._call(self._remove)
        except Exception as exc:
            self.logger.warning(f"Removing the environment {self.session_id} failed: {exc}")
        finally:
            self._record("stop", started)

    def _remove(self) -> None:
        api = engine()
        if self._container is not None:
            with contextlib.suppress(docker.errors.NotFound):
                api.remove_container(self._container, force=True, v=True)  # SIGKILL, then gone
            self._container = None
        if self._built_image is not None:
            with contextlib.suppress(docker.errors.APIError):  # in use by another environment: left to it
                api.remove_image(self._built_image)
            self._built_image = None

    # --- exec ----------------------------------------------------------------------------------

    async def _exec(self, argv: list[str], *, cwd: str | None, env: dict[str, str] | None, user: str | int | None,
                    timeout_sec: int | None) -> ExecResult:
        aborts: list[Callable[[], None]] = []
        future = asyncio.get_running_loop().run_in_executor(
            _calls, lambda: self._exec_sync(argv, cwd=cwd, env=env, user=user, on_stream=aborts.append))
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout=timeout_sec or None)
        except TimeoutError:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
        finally:
            if not future.done():
                for abort in aborts:  # the stream ends, so does its thread (the process stays, as with compose)
                    abort()

    def _exec_sync(self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
                   user: str | int | None = None,
                   on_stream: Callable[[Callable[[], None]], None] | None = None) -> ExecResult:
        api = engine()
        exec_id = created_id(api.exec_create(self._require_container(), argv, stdout=True, stderr=True,
                                             environment=[f"{k}={v}" for k, v in (env or {}).items()] or None,
                                             workdir=cwd or None, user="" if user is None else str(user)), "exec")
        # exec_start(socket=True) returns the raw socket, past http.client's buffer: bytes read with the
        # 101 head would be lost. Read the frames from the response's buffered reader instead.
        response = api._post_json(api._url("/exec/{0}/start", exec_id), data={"Tty": False, "Detach": False},
                                  headers={"Connection": "Upgrade", "Upgrade": "tcp"}, stream=True)
        api._raise_for_status(response)
        reader = response.raw._fp.fp
        raw = getattr(getattr(reader, "raw", None), "_sock", None)
        if on_stream is not None and isinstance(raw, socket.socket):
            on_stream(lambda: _shutdown(raw))
        try:
            stdout, stderr = _read_frames(reader)
        finally:
            response.close()
        code = None
        for _ in range(100):  # the stream can end a moment before the engine records the exit
            info = api.exec_inspect(exec_id)
            if not info.get("Running"):
                code = info.get("ExitCode")
                break
            time.sleep(0.01)
        return ExecResult(stdout=stdout.decode(errors="replace") or None,
                          stderr=stderr.decode(errors="replace") or None,
                          return_code=int(code) if code is not None else -1)

    # --- archives ------------------------------------------------------------------------------

    def _upload_dir(self, source: Path, target: str, leading: tuple[tuple[str, int], ...] = ()) -> bool:
        """Whether ``leading`` (root's dirs, (name, mode), to extract at ``/``) went with it: only into ``/``."""
        if not source.is_dir():
            raise FileNotFoundError(f"Source directory {source} does not exist")
        target = posixpath.normpath(target)
        if not any(source.iterdir()) and self._stat_kind(target) == "dir":
            # Nothing to copy into a directory that is there (Harbor re-uploads an agent's empty artifacts dir into
            # every verifier environment): an archive upload costs the engine a helper process, a stat does not.
            return False
        # Into an existing directory, as `docker cp SRC/. DEST`: its own mode and owner stay.
        if self._put(target, _pack(source, None)):
            return False
        parent, name = posixpath.split(target)
        rides = bool(leading) and parent == "/"
        self._put_creating(parent, _pack(source, name, leading if rides else ()))
        return rides

    def _upload_file(self, source: Path, target: str) -> None:
        if not source.is_file():
            raise FileNotFoundError(f"Source file {source} does not exist")
        if target.endswith("/") or self._stat_kind(target) == "dir":
            parent, name = target.rstrip("/") or "/", source.name
        else:
            parent, name = posixpath.split(posixpath.normpath(target))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(source, arcname=name, filter=_root_owned)
        self._put_creating(parent, buffer.getvalue())

    def _put_creating(self, parent: str, data: bytes) -> None:
        if not self._put(parent, data):
            self._mkdir(parent)
            if not self._put(parent, data):
                raise RuntimeError(f"could not upload into {parent} of {self.session_id}")

    def _put(self, path: str, data: bytes) -> bool:
        """Extract ``data`` into the directory ``path``; False when it does not exist."""
        api = engine()
        response = api.put(api._url("/containers/{0}/archive", self._require_container()), data=data,
                           params={"path": path, "noOverwriteDirNonDir": "true"},
                           headers={"Content-Type": "application/x-tar"})
        if response.status_code == 404:
            return False
        api._raise_for_status(response)
        return True

    def _mkdir(self, path: str) -> None:
        result = self._exec_sync(["mkdir", "-p", path], user="root")
        if result.return_code != 0:
            raise RuntimeError(f"mkdir -p {path} failed in {self.session_id}: {result.stderr or result.stdout}")

    def _download_file(self, source: str, target: Path) -> bool:
        """``source`` (a regular file) written to ``target``; whether the engine was asked (no snapshot served it)."""
        if target.is_dir():
            target = target / PurePosixPath(source).name
        target.parent.mkdir(parents=True, exist_ok=True)
        with self._archive_of(source) as (tar, members, fetched):
            member = next(iter(members), None)
            if member is None or not member.isfile():
                raise RuntimeError(f"{source} in {self.session_id} is not a regular file")
            extracted = tar.extractfile(member)
            if extracted is None:
                raise RuntimeError(f"{source} in {self.session_id} has no content")
            with extracted, target.open("wb") as out:
                while chunk := extracted.read(1 << 20):
                    out.write(chunk)
        return fetched

    def _download_dir(self, source: str, target: Path) -> bool:
        """``source``'s contents extracted into ``target``; whether the engine was asked (no snapshot served it)."""
        target.mkdir(parents=True, exist_ok=True)
        refused: list[str] = []
        with self._archive_of(source.rstrip("/") or "/") as (tar, members, fetched):
            _check_bounds(members, source)
            for member in members:
                # The archive is rooted at the source's own name; its contents go into target.
                rest = member.name.partition("/")[2]
                if not rest:
                    continue
                member.name = rest
                if member.islnk():
                    member.linkname = member.linkname.partition("/")[2]
                try:
                    tar.extract(member, target, filter=transfer_tar_filter)
                except tarfile.FilterError as exc:
                    refused.append(str(exc))
        if refused:
            self.logger.warning(f"Skipped {len(refused)} unsafe entries downloading {source}, e.g. {refused[0]}")
        return fetched

    @contextlib.contextmanager
    def _archive_of(self, path: str) -> Iterator[tuple[tarfile.TarFile, Any, bool]]:
        """(tar, its members, whether the engine was asked) for ``path``: from the snapshot of the log dirs' parent
        when it holds ``path`` as the engine's archive would, else the engine's archive of ``path`` itself."""
        with self._snapshot_lock:
            view = self._snapshot_view(path)
            if view is not None:
                tar, members, fetched = view
                with tar:
                    yield tar, members, fetched
                return
        with tempfile.TemporaryFile() as spool:
            self._spool(path, spool)
            with tarfile.open(fileobj=spool, mode="r:") as tar:
                yield tar, tar, True

    def _spool(self, path: str, spool: IO[bytes], limit: int | None = None) -> None:
        """The engine's archive of ``path`` written to ``spool`` (rewound), or DownloadTooLarge (over ``limit``)."""
        api = engine()
        chunks, _ = api.get_archive(self._require_container(), path, chunk_size=1 << 20)
        spooled = 0
        for chunk in chunks:
            spooled += len(chunk)
            # By default the members' bound plus room for the tar's own headers.
            if spooled > (2 * MAX_DOWNLOAD_BYTES if limit is None else limit):
                raise DownloadTooLarge(f"{path} in {self.session_id} is larger than {MAX_DOWNLOAD_BYTES >> 20} MiB: "
                                       "not copied out")
            spool.write(chunk)
        spool.seek(0)

    # --- the snapshot of the log dirs' parent ------------------------------------------------------

    def _logs_root(self) -> str | None:
        """The one parent of the environment's log dirs (``/logs``), or None."""
        parents = {posixpath.dirname(posixpath.normpath(d)) for d in self._mount_targets(writable_only=True)}
        return parents.pop() if len(parents) == 1 and "/" not in parents else None

    def _forget_snapshot(self) -> None:
        """Something is about to be done in the container: what the snapshot holds may change."""
        with self._snapshot_lock:
            if self._snapshot is not None:
                self._snapshot.close()
            self._snapshot = None
            self._snapshot_refused = False

    def _snapshot_view(self, path: str) -> tuple[tarfile.TarFile, list[tarfile.TarInfo], bool] | None:
        """(tar, ``path``'s entries renamed as the engine's archive of ``path`` names them, whether the engine was
        asked now), the snapshot taken if none is held; None: ask the engine for ``path`` itself (not under the log
        dirs' parent; the snapshot over the download bounds; ``path`` missing there, a link, or holding a hard link
        to outside it, where the engine's own archive would differ). Called with the snapshot lock held."""
        root = self._logs_root()
        path = posixpath.normpath(path)
        if root is None or not path.startswith(root + "/") or self._snapshot_refused:
            return None
        fetched = False
        if self._snapshot is None:
            spool = tempfile.TemporaryFile()
            try:
                self._spool(root, spool, SNAPSHOT_MAX_BYTES)
                with tarfile.open(fileobj=spool, mode="r:") as whole:
                    _check_bounds(whole, root)  # every entry, so reading any part of it stays within the bounds
            except (DownloadTooLarge, docker.errors.NotFound):
                spool.close()
                self._snapshot_refused = True
                return None
            except BaseException:
                spool.close()
                raise
            self._snapshot, fetched = spool, True
        self._snapshot.seek(0)
        tar = tarfile.open(fileobj=self._snapshot, mode="r:")
        prefix = posixpath.basename(root) + path[len(root):]
        base = posixpath.basename(path)
        members = [m for m in tar if m.name == prefix or m.name.startswith(prefix + "/")]
        if (not members or members[0].name != prefix or not (members[0].isdir() or members[0].isfile())
                or any(m.islnk() and not m.linkname.startswith(prefix + "/") for m in members)):
            tar.close()
            return None  # (a snapshot just taken stays, for the paths it can serve)
        for member in members:
            member.name = base + member.name[len(prefix):]
            if member.islnk():
                member.linkname = base + member.linkname[len(prefix):]
        return tar, members, fetched

    def _snapshot_kind(self, path: str) -> str | None:
        """``_stat_kind``'s answer from a snapshot already held, when it can tell; None: ask the engine."""
        root = self._logs_root()
        path = posixpath.normpath(path)
        with self._snapshot_lock:
            if self._snapshot is None or root is None or not path.startswith(root + "/"):
                return None
            self._snapshot.seek(0)
            with tarfile.open(fileobj=self._snapshot, mode="r:") as tar:
                entries = {m.name: m for m in tar}
        name = posixpath.basename(root) + path[len(root):]
        member = entries.get(name)
        if member is None:
            # Missing only when every directory on the way is one in the snapshot (not a link the engine follows).
            parent = posixpath.dirname(name)
            while parent:
                found = entries.get(parent)
                if found is None or not found.isdir():
                    return None
                parent = posixpath.dirname(parent)
            return "missing"
        if member.isdir():
            return "dir"
        if member.isfile() or member.islnk():
            return "file"
        return None if member.issym() else "other"

    async def _kind_as_root(self, path: str, user: str | int | None) -> str | None:
        """"dir", "file", "other" or "missing" from the archive stat (what root sees); None: ask a shell."""
        if self._resolve_user(user) not in (None, "root", 0, "0"):
            return None
        await self._settle()
        started = time.monotonic()
        kind = None
        try:
            kind = await self._call(self._snapshot_kind, path)
            return kind if kind is not None else await self._call(self._stat_kind, path)
        finally:
            self._record("snapshot" if kind is not None else "stat", started)

    def _stat_kind(self, path: str) -> str | None:
        api = engine()
        response = api.head(api._url("/containers/{0}/archive", self._require_container()), params={"path": path})
        if response.status_code == 404:
            return "missing"
        api._raise_for_status(response)
        stat = json.loads(base64.b64decode(response.headers.get("X-Docker-Container-Path-Stat", "") or "e30="))
        mode = int(stat.get("mode") or 0)
        if stat.get("linkTarget") or mode & _GO_MODE_SYMLINK:
            return None  # `test -d` follows links; let the shell answer
        if mode & _GO_MODE_DIR:
            return "dir"
        return "file" if not mode & _GO_MODE_TYPE else "other"

    # --- helpers -----------------------------------------------------------------------------------

    def _require_container(self) -> str:
        if self._container is None:
            raise RuntimeError(f"environment {self.session_id} is not started")
        return self._container

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(_calls, fn, *args)

    async def _op(self, op: str, fn: Callable[..., object], *args: Any) -> None:
        await self._settle()
        started = time.monotonic()
        try:
            await self._call(fn, *args)
        finally:
            self._record(op, started)

    def _record(self, op: str, started: float) -> None:
        record_timing(Path(self.trial_paths.trial_dir), self.session_id, op, started)


def _engine_error(exc: BaseException) -> str:
    """``exc`` in words that keep the engine's own: an API error as its type, status and the engine's explanation
    (the SDK's text leads with the request URL, which pushed the cause past the bound of a trial's reason)."""
    if isinstance(exc, docker.errors.APIError) and exc.explanation:
        return f"{type(exc).__name__}: the engine answered {exc.status_code}: {exc.explanation}"
    return f"{type(exc).__name__}: {exc}"


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class DownloadTooLarge(RuntimeError):
    """What a container holds at a path is more than one download may bring out (``MAX_DOWNLOAD_BYTES``)."""


def _check_bounds(entries: Any, source: str) -> None:
    """Refuse, before anything is extracted, an archive (its entries) over the download bounds (apparent sizes)."""
    total = members = 0
    for member in entries:
        members += 1
        total += max(0, member.size)
        if members > MAX_DOWNLOAD_MEMBERS or total > MAX_DOWNLOAD_BYTES:
            raise DownloadTooLarge(f"{source} holds more than {MAX_DOWNLOAD_MEMBERS} entries or {MAX_DOWNLOAD_BYTES >> 20} "
                                   "MiB: not copied out")
    # The headers are loaded now: the caller's iteration goes over them again (tarfile keeps them).


def _read_frames(reader: Any) -> tuple[bytes, bytes]:
    """(stdout, stderr) of a multiplexed exec stream (8-byte headers: stream, 0, 0, 0, big-endian length); each
    stream kept up to ``MAX_EXEC_OUTPUT`` bytes, the rest read and dropped (a marker says so)."""
    out = {1: bytearray(), 2: bytearray()}
    dropped = {1: 0, 2: 0}
    while True:
        try:
            header = reader.read(8)
        except (OSError, ValueError):
            break
        if not header or len(header) < 8:
            break
        stream, size = struct.unpack(">BxxxL", header)
        try:
            data = reader.read(size)
        except (OSError, ValueError):
            break
        key = 2 if stream == 2 else 1
        room = MAX_EXEC_OUTPUT - len(out[key])
        out[key] += data[:max(0, room)]
        dropped[key] += max(0, len(data) - max(0, room))
        if len(data) < size:
            break
    for key, count in dropped.items():
        if count:
            out[key] += f"\n[... {count} more bytes of output dropped ...]\n".encode()
    return bytes(out[1]), bytes(out[2])


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _pack_root_only(source: Path, root: str, root_dirs: tuple[str, ...]) -> bytes:
    """A tar to extract at ``/``: ``root_dirs`` (directories), then ``source``'s tree under ``root``, owners and
    modes as ``pipeline.runner.rootonly`` rules (``root`` TESTS_MODE, each entry under it closed_mode, each of
    ``root_dirs`` VERIFIER_DIR_MODE). The engine applies each entry's owner and mode, to a directory that is already
    there too. Links are archived as links, never followed."""
    buffer = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in root_dirs:
            info = tarfile.TarInfo(name)
            info.type, info.mtime = tarfile.DIRTYPE, now
            tar.addfile(_root_only(info, rootonly.VERIFIER_DIR_MODE))
        tar.add(source, arcname=root, recursive=False, filter=lambda info: _root_only(info, rootonly.TESTS_MODE))
        for path in sorted(source.rglob("*")):
            tar.add(path, arcname=f"{root}/{path.relative_to(source).as_posix()}", recursive=False, filter=_root_only)
    return buffer.getvalue()


def _root_only(info: tarfile.TarInfo, mode: int | None = None) -> tarfile.TarInfo:
    info.mode = rootonly.closed_mode(info.mode) if mode is None else mode
    info.uid, info.gid = rootonly.OWNER
    info.uname = info.gname = ""
    return info


def _pack(source: Path, root: str | None, leading: tuple[tuple[str, int], ...] = ()) -> bytes:
    """``source``'s tree as a tar: its contents, under the entry ``root`` (with the dir's own mode) when given,
    after the directory entries ``leading`` ((name, mode), owned by root).

    Links are archived as links, never followed; owners are root."""
    buffer = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, mode in leading:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, now
            tar.addfile(_root_owned(info))
        if root is not None:
            tar.add(source, arcname=root, recursive=False, filter=_root_owned)
        for path in sorted(source.rglob("*")):
            relative = path.relative_to(source).as_posix()
            tar.add(path, arcname=f"{root}/{relative}" if root else relative, recursive=False, filter=_root_owned)
    return buffer.getvalue()
