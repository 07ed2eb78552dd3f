"""A Python release agent in a container of its own: the Harbor agent the runner runs instead of the adopter's class.

The adopter's agent class is never imported into the runner (which holds Harbor's verifier, every
task's ``solution/`` and ``tests/`` in the run dir, and the engine socket). For each trial
``IsolatedPythonAgent.run``:

1. makes the trial's box directory (``<trial dir>/agent-box``: the channel's Unix socket and the
   agent's logs dir, nothing else) and listens on the socket;
2. creates, through the runner's engine client (the engine proxy), a container of the runner image
   itself (``--agent-image``: the worker passes the image id it runs the runner from) running
   ``python3 -m pipeline.runner.agent_host serve``: only the box directory bound (at
   ``agent_host.BOX_MOUNT``), network none, or for a model-backed agent the trial's model gateway
   the proxy gives every container it creates (``127.0.0.1:GATEWAY_PORT``, nothing else), all
   capabilities dropped, no-new-privileges, a read-only root with a tmpfs ``/tmp``, a process bound,
   and the place an older runner image kept the suites (``IMAGE_SUITES``) hidden under an empty read-only tmpfs;
3. serves the channel (``agent_host``): the agent's exec, upload, download, is_dir and is_file are
   performed on THIS trial's environment (the one Harbor passed in) and nothing else; files travel
   as bytes, bounded (``MAX_TRANSFER_BYTES``; a download is sized in the container first);
4. takes the agent's outcome: ``done`` -> its AgentContext, validated as Harbor's model, copied into
   the trial's; ``failed``, the agent's process ending without an outcome or breaking the channel ->
   ``AgentFailed`` (the agent's own fault, whatever type it raised: an agent cannot pass for the
   machinery). What fails under one of its operations is answered to the agent, which decides (as
   an in-process agent would). Only the runner's side failing before the agent's code runs (the
   engine, the image, the box not connecting) is ``ChannelFault`` (infrastructure);
5. always (a timeout cancels ``run``): removes the container, copies the agent's logs (regular
   files only, bounded) into the trial's agent dir beside the container's output
   (``BOX_LOG``), and removes the box directory.

The adopter's ``setup`` runs inside the box as part of ``run``, under the agent's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions
from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from harbor.models.trial.result import AgentInfo, ModelInfo
from pydantic import ValidationError as PydanticValidationError

from pipeline.core.errors import AgentFailed, ChannelFault, ValidationError
from pipeline.core.project import AGENT_MANIFEST_PATH, PLACEHOLDER_KEY, AgentManifest, read_manifest_file
from pipeline.infra.sandbox.relay import GATEWAY_PORT
from pipeline.runner import agent_host
from pipeline.runner.engine_env import engine
from pipeline.runner.envshared import EngineAnswerError, created_id, record_timing

IMPORT_PATH = "pipeline.runner.agent_box:IsolatedPythonAgent"
BOX_DIR = "agent-box"  # in the trial dir, removed when the trial's agent phase ends
BOX_LOG = "agent-box.log"  # the container's own output, in the trial's agent dir
CONNECT_SECONDS = 60  # the box connects before it imports anything of the adopter's
PROBE_SECONDS = 60
BOX_SERVICE, PROBE_SERVICE = "agent-box", "agent-probe"  # their compose service labels
MAX_LOG_BYTES = 64 << 20  # the agent's logs copied back, in all
MAX_LOG_FILES = 10_000
MAX_CONTAINER_LOG = 2_000_000
MAX_CALLS_IN_FLIGHT = 16
PIDS_LIMIT = 1024
BOX_TMP = "/tmp"  # noqa: S108 -- the box's own tmpfs (its root is read-only), not this process's
# A runner image carries no suites (the worker stages the dataset outside it); one built before did (the app
# layer's APP_ROOT/suites: every task's solution/ and tests/): a box sees an empty read-only tmpfs there instead.
IMAGE_SUITES = "/opt/benchseal/suites"
_MASKED = {IMAGE_SUITES: "ro,size=4k,mode=0555"}

# Blocking engine calls (and one wait per box for its whole life): a pool of their own.
_calls = ThreadPoolExecutor(max_workers=64, thread_name_prefix="agent-box")
_agent_image: str | None = None


def set_agent_image(image: str | None) -> None:
    """The image (the runner's own, by id) every Python agent's container of this process is made of."""
    global _agent_image
    _agent_image = image


def agent_image() -> str | None:
    return _agent_image


def model_base_url(path: str) -> str:
    """The model as a box sees it: the trial's gateway on its loopback."""
    return f"http://127.0.0.1:{GATEWAY_PORT}{path.rstrip('/')}"


def _container_name(session: str) -> str:
    name = re.sub(r"[^a-z0-9_.-]", "-", session.lower()).lstrip("._-") or "agent"
    return f"{name[:100]}-box"


async def _call[R](fn: Callable[..., R], *args: Any) -> R:
    return await asyncio.get_running_loop().run_in_executor(_calls, fn, *args)


def box_host_config(api: Any, binds: list[str] | None = None, tmp_size: str = "1g") -> Any:
    """What every box gets (the probe's too): no network of its own (the proxy adds the trial's model gateway
    when there is one), no capability, no new privileges, a read-only root with a tmpfs ``/tmp``, a process
    bound, the image's suites hidden, and only ``binds`` (the box dir) from outside."""
    return api.create_host_config(network_mode="none", binds=binds or None, cap_drop=["ALL"],
                                  security_opt=["no-new-privileges"], read_only=True,
                                  tmpfs={BOX_TMP: f"rw,nosuid,nodev,size={tmp_size}", **_MASKED}, pids_limit=PIDS_LIMIT)


# --- the version probe (agent_check), in a box without any bind ------------------------------


def probe_in_box(image: str, package: str, import_path: str) -> dict[str, str]:
    """``agent_host.probe`` run in a container of ``image`` (nothing bound, network none): its JSON answer."""
    api = engine()
    host = box_host_config(api, tmp_size="64m")
    try:
        created = api.create_container(image, entrypoint=["python3", "-m", "pipeline.runner.agent_host"],
                                       command=["probe", package, import_path], environment={"HOME": BOX_TMP},
                                       labels={"com.docker.compose.service": PROBE_SERVICE}, stop_signal="SIGKILL",
                                       host_config=host)
        ident = created_id(created, "probe container")
    except (docker.errors.DockerException, requests.exceptions.RequestException, EngineAnswerError) as exc:
        raise ChannelFault(f"could not create the agent's probe container from {image}: {exc}") from None
    try:
        api.start(ident)
        try:
            code = int(api.wait(ident, timeout=PROBE_SECONDS)["StatusCode"])
        except (requests.exceptions.Timeout, requests.exceptions.ConnectionError):
            raise ValidationError("agent import_path", f"{import_path} did not import within {PROBE_SECONDS} s") from None
        output = api.logs(ident, stdout=True, stderr=False)[-65536:].decode("utf-8", "replace")
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise ChannelFault(f"the agent's probe container failed: {exc}") from None
    finally:
        with contextlib.suppress(docker.errors.DockerException, requests.exceptions.RequestException):
            api.remove_container(ident, force=True)
    for line in reversed(output.splitlines()):
        with contextlib.suppress(ValueError):
            answer = json.loads(line)
            if isinstance(answer, dict) and all(isinstance(v, str) for v in answer.values()):
                return answer
    raise ValidationError("agent import_path", f"probing {import_path} exited {code} without an answer")


# --- the agent ---------------------------------------------------------------------------------


class IsolatedPythonAgent(BaseAgent):  # type: ignore[misc]
    """Runs the release's Python agent in a container of its own; see the module docstring."""

    def __init__(self, logs_dir: Path, model_name: str | None = None, *, agent_image: str, agent_import_path: str,
                 agent_kwargs: dict[str, Any] | None = None, manifest_path: str = AGENT_MANIFEST_PATH,
                 **kwargs: Any) -> None:
        kwargs.pop("mcp_servers", None)  # task MCP servers and skills are not handed to a box (yet)
        kwargs.pop("skills_dir", None)
        super().__init__(logs_dir, model_name, **kwargs)
        manifest: AgentManifest | None = read_manifest_file(Path(manifest_path))
        if manifest is None:  # the runner checked it before any trial
            raise ValueError(f"no agent manifest at {manifest_path}")
        self._manifest = manifest
        self._image = agent_image
        self._import_path = agent_import_path
        self._agent_kwargs = dict(agent_kwargs or {})

    @staticmethod
    def name() -> str:
        return "benchseal-isolated-python"

    def version(self) -> str:
        return self._manifest.artifact.version

    def to_agent_info(self) -> AgentInfo:
        # The release's agent, by the name and version the build checked (not this wrapper's).
        model = ModelInfo(name=self._parsed_model_name, provider=self._parsed_model_provider) \
            if self._parsed_model_name else None
        return AgentInfo(name=self._manifest.artifact.name, version=self._manifest.artifact.version, model_info=model)

    async def setup(self, environment: BaseEnvironment) -> None:
        return None  # the adopter's setup runs in the box, at the start of run()

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        box = _Box(self.logs_dir, self.session_id or "agent", self._image)
        try:
            await box.open()
            await box.send({"kind": "start", "import_path": self._import_path, "instruction": instruction,
                            "model_name": self.model_name, "kwargs": self._agent_kwargs,
                            # Harbor's parse of the model name (this process has LiteLLM loaded; a box need not).
                            "model_parse": [self._parsed_model_provider, self._parsed_model_name]
                            if self.model_name and self._parsed_model_name else None,
                            "session_id": self.session_id,
                            "environment": {"name": environment.environment_name,
                                            "session_id": environment.session_id,
                                            "default_user": environment.default_user,
                                            # No env values: the task's env reaches execs on this side.
                                            "task_env": environment.task_env_config.model_dump(
                                                mode="json", exclude={"env"})}})
            started = time.monotonic()
            try:
                outcome = await box.serve(environment)
            finally:
                box._record("box-run", started)
        finally:
            await box.close()
        if outcome.get("kind") == "done":
            try:
                reported = AgentContext.model_validate(outcome.get("context"))
            except PydanticValidationError as exc:
                raise AgentFailed(f"the agent reported an invalid context: {exc.errors()[0].get('msg')}") from None
            for field in AgentContext.model_fields:
                setattr(context, field, getattr(reported, field))
            return
        raise AgentFailed(f"{outcome.get('type')}: {outcome.get('message')}"[:agent_host.MAX_MESSAGE_CHARS])


class _Box:
    """One trial's agent container and its channel (``IsolatedPythonAgent.run``)."""

    def __init__(self, logs_dir: Path, session: str, image: str) -> None:
        self.logs_dir = logs_dir
        self.dir = logs_dir.parent / BOX_DIR
        self.name = _container_name(session)
        self.project = re.sub(r"[^a-z0-9_-]", "-", session.lower().removesuffix("__agent"))
        self.image = image
        self.container: str | None = None
        self._server: asyncio.AbstractServer | None = None
        self._connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader: asyncio.StreamReader | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._exited: asyncio.Future[int] | None = None

    async def open(self) -> None:
        started = time.monotonic()
        try:
            await self._open()
        finally:
            self._record("box-start", started)

    def _record(self, op: str, started: float) -> None:
        record_timing(self.dir.parent, f"{self.project}__agent-box", op, started)

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            if self.dir.exists():
                shutil.rmtree(self.dir)
            (self.dir / agent_host.LOGS_NAME).mkdir(parents=True)
            listener = _bind_channel(self.dir / agent_host.SOCKET_NAME)
            self._connected = loop.create_future()
            self._server = await asyncio.start_unix_server(self._accept, sock=listener,
                                                           limit=agent_host.MAX_FRAME_BYTES)
            self.container = await _call(self._create)
            await _call(engine().start, self.container)
        except (OSError, docker.errors.DockerException, requests.exceptions.RequestException, EngineAnswerError) as exc:
            raise ChannelFault(f"could not start the agent's container: {exc}") from None
        self._exited = loop.run_in_executor(_calls, self._wait)
        self._exited.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no warning
        waiting: set[asyncio.Future[Any]] = {self._connected, self._exited}
        done, _ = await asyncio.wait(waiting, timeout=CONNECT_SECONDS, return_when=asyncio.FIRST_COMPLETED)
        if self._connected not in done:
            how = f"exited {self._exited.result()}" if self._exited in done and not self._exited.exception() \
                else f"did not connect within {CONNECT_SECONDS} s"
            raise ChannelFault(f"the agent's container {how}: {self._tail()}")
        self._reader, self._writer = self._connected.result()

    def _create(self) -> str:
        api = engine()
        host = box_host_config(api, binds=[f"{self.dir}:{agent_host.BOX_MOUNT}:rw"])
        # The compose project label: the worker's leftover sweep finds the box by its trial's name.
        labels = {"com.docker.compose.project": self.project, "com.docker.compose.service": BOX_SERVICE}
        env = {"HOME": BOX_TMP, "OPENAI_API_KEY": PLACEHOLDER_KEY, "HARBOR_TELEMETRY": "0"}
        created = engine().create_container(
            self.image, entrypoint=["python3", "-m", "pipeline.runner.agent_host"],
            command=["serve", f"{agent_host.BOX_MOUNT}/{agent_host.SOCKET_NAME}"], name=self.name,
            environment=env, labels=labels, working_dir=BOX_TMP, stop_signal="SIGKILL", host_config=host)
        return created_id(created, "agent box container")

    def _wait(self) -> int:
        return int(engine().wait(self.container, timeout=None)["StatusCode"])

    def _tail(self) -> str:
        try:
            text = engine().logs(self.container, stdout=True, stderr=True)[-600:].decode("utf-8", "replace")
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return "(no output)"
        return " | ".join(line.strip() for line in text.splitlines() if line.strip())[-400:] or "(no output)"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connected is None or self._connected.done():
            writer.close()  # one connection per box
            return
        self._connected.set_result((reader, writer))

    async def send(self, frame: dict[str, Any]) -> None:
        assert self._writer is not None
        data = agent_host.encode_frame(frame)
        async with self._lock:
            self._writer.write(data)
            await self._writer.drain()

    async def serve(self, environment: BaseEnvironment) -> dict[str, Any]:
        """Answer the agent's calls until its outcome; an end without one is the agent's failure."""
        assert self._reader is not None
        gate = asyncio.Semaphore(MAX_CALLS_IN_FLIGHT)
        while True:
            try:
                frame = await agent_host.read_frame(self._reader)
            except (agent_host.ChannelError, OSError) as exc:
                return {"kind": "failed", "type": "ChannelError", "message": f"the agent broke the channel: {exc}"}
            if frame is None:
                code = await self._exit_code()
                return {"kind": "failed", "type": "AgentExited",
                        "message": f"the agent's process ended without an outcome (exit {code}): {self._tail()}"}
            if frame.get("kind") in ("done", "failed"):
                return frame
            if frame.get("kind") != "call":
                return {"kind": "failed", "type": "ChannelError", "message": "the agent sent an unknown frame"}
            await gate.acquire()
            task = asyncio.get_running_loop().create_task(self._answer(environment, frame))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(lambda _: gate.release())

    async def _exit_code(self) -> str:
        if self._exited is None:
            return "?"
        try:
            return str(await asyncio.wait_for(asyncio.shield(self._exited), timeout=5))
        except (TimeoutError, docker.errors.DockerException, requests.exceptions.RequestException):
            return "?"

    async def _answer(self, environment: BaseEnvironment, frame: dict[str, Any]) -> None:
        ident = frame.get("id")
        try:
            result = await _perform(environment, str(frame.get("op")), frame.get("args"))
            reply: dict[str, Any] = {"kind": "reply", "id": ident, "ok": True, "result": result}
        except Exception as exc:  # told to the agent, as an in-process agent would see it: its to handle
            reply = {"kind": "reply", "id": ident, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        with contextlib.suppress(OSError, agent_host.ChannelError, AssertionError):
            await self.send(reply)

    async def close(self) -> None:
        started = time.monotonic()
        try:
            await self._close()
        finally:
            self._record("box-stop", started)

    async def _close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._writer is not None:
            self._writer.close()
        if self._server is not None:
            self._server.close()
        if self.container is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(_call(self._collect_and_remove))
        with contextlib.suppress(BaseException):
            await asyncio.shield(_call(self._copy_logs))
        shutil.rmtree(self.dir, ignore_errors=True)

    def _collect_and_remove(self) -> None:
        api = engine()
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(docker.errors.DockerException, requests.exceptions.RequestException, OSError):
            output = api.logs(self.container, stdout=True, stderr=True)[-MAX_CONTAINER_LOG:]
            (self.logs_dir / BOX_LOG).write_bytes(output)
        with contextlib.suppress(docker.errors.NotFound):
            api.remove_container(self.container, force=True, v=True)
        self.container = None

    def _copy_logs(self) -> None:
        """The agent's logs into the trial's agent dir: regular files only (no link is followed), bounded."""
        source = self.dir / agent_host.LOGS_NAME
        budget, files = MAX_LOG_BYTES, 0
        for root, dirs, names in os.walk(source, followlinks=False):
            for name in sorted(names):
                path = Path(root) / name
                info = path.lstat()
                if not stat.S_ISREG(info.st_mode) or info.st_size > budget or files >= MAX_LOG_FILES:
                    continue
                target = self.logs_dir / path.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                except OSError:
                    continue
                with os.fdopen(fd, "rb") as src, os.fdopen(out, "wb") as dst:
                    budget -= dst.write(src.read(budget + 1)[:budget])
                files += 1
            dirs[:] = [d for d in sorted(dirs) if not (Path(root) / d).is_symlink()]


def _bind_channel(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, bound through a short private link to its directory: a run dir's
    path can exceed a socket path's 107 bytes. Not through ``/proc/self/fd/N``: a number another thread of
    this process may close and reuse between open and bind (seen: "Not a directory" under load)."""
    short = Path(tempfile.mkdtemp(prefix="bsbox-"))  # 0700, this process's user only
    try:
        (short / "d").symlink_to(path.parent, target_is_directory=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(short / "d" / path.name))
            listener.listen(1)
        except OSError:
            listener.close()
            raise
        return listener
    finally:
        shutil.rmtree(short, ignore_errors=True)


# --- the agent's operations on its one environment ---------------------------------------------


def _str(args: dict[str, Any], key: str, optional: bool = False) -> Any:
    value = args.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string")
    return value


def _user(args: dict[str, Any]) -> str | int | None:
    value = args.get("user")
    if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ValueError("user must be a string or an integer")


async def _size_of(environment: BaseEnvironment, path: str) -> int:
    """Bytes under ``path`` in the container (measured as root before a download)."""
    result = await environment.exec(f"du -s -b -- {_quote(path)} | cut -f1", user="root", timeout_sec=120)
    text = (result.stdout or "").strip()
    if result.return_code != 0 or not text.isdigit():
        raise FileNotFoundError(f"{path}: not found in the task environment")
    return int(text)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


async def _perform(environment: BaseEnvironment, op: str, raw: Any) -> Any:
    args: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if op == "exec":
        env = args.get("env")
        if env is not None and not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                  for k, v in env.items())):
            raise ValueError("env must map strings to strings")
        timeout = args.get("timeout_sec")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
            raise ValueError("timeout_sec must be a number")
        result = await environment.exec(_str(args, "command"), cwd=_str(args, "cwd", optional=True), env=env,
                                        timeout_sec=int(timeout) if timeout is not None else None, user=_user(args))
        return result.model_dump(mode="json")
    if op in ("is_dir", "is_file"):
        check = environment.is_dir if op == "is_dir" else environment.is_file
        return bool(await check(_str(args, "path"), user=_user(args)))
    with tempfile.TemporaryDirectory(prefix="benchseal-box-") as tmp:
        scratch = Path(tmp)
        if op == "upload_file":
            name = Path(_str(args, "name")).name or "file"
            source = scratch / name
            source.write_bytes(agent_host.unb64(args.get("data")))
            await environment.upload_file(source, _str(args, "target"))
            return None
        if op == "upload_dir":
            agent_host.unpack_dir(agent_host.unb64(args.get("data")), scratch / "dir")
            await environment.upload_dir(scratch / "dir", _str(args, "target"))
            return None
        if op in ("download_file", "download_dir"):
            path = _str(args, "source")
            if await _size_of(environment, path) > agent_host.MAX_TRANSFER_BYTES:
                raise ValueError(f"{path} is larger than {agent_host.MAX_TRANSFER_BYTES} bytes")
            if op == "download_file":
                await environment.download_file(path, scratch / "file")
                return agent_host.b64((scratch / "file").read_bytes())
            await environment.download_dir(path, scratch / "dir")
            return agent_host.b64(agent_host.pack_dir(scratch / "dir"))
    raise ValueError(f"unknown operation {op!r}")
