"""The host program of a Python release agent's own container: ``python3 -m pipeline.runner.agent_host``.

A ``kind = "python"`` agent is the adopter's code: it never runs in the runner process (which holds
Harbor's verifier, every task's ``solution/`` and ``tests/`` and the engine socket). The runner
(``pipeline.runner.agent_box``) starts a container of the runner image for each trial, with only
that trial's box directory bound at ``BOX_MOUNT`` (the channel's Unix socket and the agent's logs
dir), and runs this program there:

* ``serve SOCKET``: connect to the runner's channel, read the ``start`` frame, import the agent's
  class from ``AGENT_PYTHON_DIR``, construct it (logs dir, model name, kwargs) and run its
  ``setup`` and ``run`` against a ``RemoteEnvironment``: exec, upload, download, is_dir and is_file
  go over the channel to the runner, which performs them on that trial's task container and
  nothing else. Last frame: ``done`` with the AgentContext as JSON, or ``failed`` with the
  exception's type name and message;
* ``probe PACKAGE IMPORT_PATH``: print one JSON line, the installed distribution's version or
  why the class cannot be imported (``agent_check.probe_version``, before any trial).

The channel: frames of a 4-byte big-endian length and a JSON object (at most ``MAX_FRAME_BYTES``);
file contents travel base64-encoded, at most ``MAX_TRANSFER_BYTES`` each.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import struct
import sys
import tarfile
import tempfile
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline.core.project import AGENT_PYTHON_DIR

BOX_MOUNT = "/box"  # where the agent's container sees its trial's box directory
SOCKET_NAME = "channel.sock"
LOGS_NAME = "logs"
MAX_FRAME_BYTES = 48 << 20
MAX_TRANSFER_BYTES = 32 << 20
MAX_MESSAGE_CHARS = 2000
_HEADER = struct.Struct(">I")


class ChannelError(Exception):
    """The channel broke its protocol (a frame too large, not a JSON object) or closed mid-frame."""


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next frame, or None at a clean end of the stream."""
    try:
        head = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ChannelError("the channel closed inside a frame header") from None
    (size,) = _HEADER.unpack(head)
    if size > MAX_FRAME_BYTES:
        raise ChannelError(f"a frame of {size} bytes (at most {MAX_FRAME_BYTES})")
    try:
        data = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise ChannelError("the channel closed inside a frame") from None
    try:
        frame = json.loads(data)
    except ValueError:
        raise ChannelError("a frame that is not JSON") from None
    if not isinstance(frame, dict):
        raise ChannelError("a frame that is not a JSON object")
    return frame


def encode_frame(frame: dict[str, Any]) -> bytes:
    data = json.dumps(frame, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME_BYTES:
        raise ChannelError(f"a frame of {len(data)} bytes (at most {MAX_FRAME_BYTES})")
    return _HEADER.pack(len(data)) + data


def pack_dir(source: Path) -> bytes:
    """``source``'s contents as a tar (links as links, never followed), bounded."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(source.rglob("*")):
            tar.add(path, arcname=path.relative_to(source).as_posix(), recursive=False)
            if buffer.tell() > MAX_TRANSFER_BYTES:
                raise ValueError(f"{source} is larger than {MAX_TRANSFER_BYTES} bytes")
    return buffer.getvalue()


def unpack_dir(data: bytes, target: Path) -> None:
    """A tar from the other side, extracted with the data filter (no absolute names, no link leaving it)."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        tar.extractall(target, filter="data")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise ValueError("expected base64 text")
    data = base64.b64decode(text, validate=True)
    if len(data) > MAX_TRANSFER_BYTES:
        raise ValueError(f"a transfer of {len(data)} bytes (at most {MAX_TRANSFER_BYTES})")
    return data


def probe(package: str, import_path: str) -> dict[str, str]:
    """The installed distribution's version, or the reason the agent cannot be used (one JSON object)."""
    if AGENT_PYTHON_DIR not in sys.path:
        sys.path.append(AGENT_PYTHON_DIR)  # last: the agent's modules never shadow benchseal's or Harbor's
    try:
        installed = version(package)
    except PackageNotFoundError:
        return {"missing": package}
    module, _, name = import_path.partition(":")
    try:
        getattr(import_module(module), name)
    except BaseException as exc:  # the adopter's module may raise anything on import
        return {"import_error": f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE_CHARS]}
    return {"version": installed}


# --- serve: the agent's side of the channel ---------------------------------------------------


def _harbor() -> Any:
    """Harbor's environment base class (imported here only: ``probe`` stays Harbor-free and fast)."""
    # lazy: Harbor costs 0.7 s in a box (2026-12-06); the probe needs none of it
    from harbor.environments.base import BaseEnvironment

    return BaseEnvironment


class Channel:
    """Calls to the runner, each answered by a ``reply`` frame with its id (several may be in flight)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next = 0
        self._loop_task: asyncio.Task[None] | None = None

    def listen(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._replies())

    async def send(self, frame: dict[str, Any]) -> None:
        data = encode_frame(frame)
        async with self._lock:
            self._writer.write(data)
            await self._writer.drain()

    async def call(self, op: str, **args: Any) -> Any:
        self._next += 1
        ident = self._next
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        try:
            await self.send({"kind": "call", "id": ident, "op": op, "args": args})
            reply = await future
        finally:
            self._pending.pop(ident, None)
        if not reply.get("ok"):
            raise RuntimeError(str(reply.get("error") or f"{op} failed"))
        return reply.get("result")

    async def _replies(self) -> None:
        try:
            while (frame := await read_frame(self._reader)) is not None:
                ident = frame.get("id")
                future = self._pending.get(ident) if isinstance(ident, int) else None
                if future is not None and not future.done():
                    future.set_result(frame)
        except (ChannelError, OSError):
            pass
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError("the runner closed the channel"))

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        self._writer.close()


def remote_environment_class() -> type:
    base = _harbor()

    class RemoteEnvironment(base):  # type: ignore[misc,valid-type]
        """The trial's task environment as the agent sees it: every operation is a call to the runner."""

        def __init__(self, channel: Channel, info: dict[str, Any]) -> None:
            # lazy: Harbor, loaded by _harbor() already (the probe never loads it)
            from harbor.models.task.config import EnvironmentConfig
            from harbor.models.trial.paths import TrialPaths

            self._channel = channel
            root = Path(tempfile.mkdtemp(prefix="benchseal-env-"))
            (root / "environment").mkdir()
            super().__init__(environment_dir=root / "environment", environment_name=str(info["name"]),
                             session_id=str(info["session_id"]), trial_paths=TrialPaths(root / "trial"),
                             task_env_config=EnvironmentConfig.model_validate(info["task_env"]))
            self.default_user = info.get("default_user")

        @staticmethod
        def type() -> str:
            return "benchseal-remote"

        @property
        def capabilities(self) -> Any:
            from harbor.environments.capabilities import EnvironmentCapabilities  # lazy: as above

            return EnvironmentCapabilities(disable_internet=True)

        def _validate_definition(self) -> None:
            pass

        async def start(self, force_build: bool) -> None:
            raise RuntimeError("the task environment is started and stopped by the runner")

        async def stop(self, delete: bool) -> None:
            return None

        async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                       timeout_sec: int | None = None, user: str | int | None = None) -> Any:
            from harbor.environments.base import ExecResult  # lazy: as above

            # user None: the runner's environment applies the trial's default user.
            result = await self._channel.call("exec", command=command, cwd=cwd, env=env, timeout_sec=timeout_sec,
                                              user=user)
            return ExecResult.model_validate(result)

        async def upload_file(self, source_path: Path | str, target_path: str) -> None:
            source = Path(source_path)
            if source.stat().st_size > MAX_TRANSFER_BYTES:
                raise ValueError(f"{source} is larger than {MAX_TRANSFER_BYTES} bytes")
            await self._channel.call("upload_file", data=b64(source.read_bytes()), name=source.name,
                                     target=target_path)

        async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
            await self._channel.call("upload_dir", data=b64(pack_dir(Path(source_dir))), target=target_dir)

        async def download_file(self, source_path: str, target_path: Path | str) -> None:
            target = Path(target_path)
            if target.is_dir():
                target = target / PurePosixPath(source_path).name
            data = unb64(await self._channel.call("download_file", source=source_path))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

        async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
            unpack_dir(unb64(await self._channel.call("download_dir", source=source_dir)), Path(target_dir))

        async def is_dir(self, path: str, user: str | int | None = None) -> bool:
            return bool(await self._channel.call("is_dir", path=path, user=user))

        async def is_file(self, path: str, user: str | int | None = None) -> bool:
            return bool(await self._channel.call("is_file", path=path, user=user))

    return RemoteEnvironment


def _known_model(model_name: object, parsed: object) -> None:
    """Harbor's ``BaseAgent`` parses its model name with LiteLLM, whose import alone takes 4-10 s per box
    on this project's machines (2026-12-06): the runner parsed it already with the same Harbor and
    LiteLLM (``parsed``: provider, model id), so that one name's answer is handed over, any other
    name is still parsed here. Set up before any of the agent's code runs."""
    if not isinstance(model_name, str) or not isinstance(parsed, list) or len(parsed) != 2:
        return
    # lazy: Harbor, as in _harbor()
    import harbor.agents.agent_auth_resolution as resolution
    import harbor.agents.base as agents_base

    original = resolution.parse_model_name
    answer = (parsed[0] if isinstance(parsed[0], str) else None, str(parsed[1]))

    def parse_model_name(name: str, *, skip_model_parsing: bool = False) -> tuple[str | None, str]:
        if name == model_name and not skip_model_parsing:
            return answer
        result: tuple[str | None, str] = original(name, skip_model_parsing=skip_model_parsing)
        return result

    resolution.parse_model_name = parse_model_name
    agents_base.parse_model_name = parse_model_name


def _failure(exc: BaseException) -> dict[str, Any]:
    return {"kind": "failed", "type": type(exc).__name__[:200], "message": str(exc)[:MAX_MESSAGE_CHARS]}


async def serve(socket_path: str) -> int:
    reader, writer = await asyncio.open_unix_connection(socket_path, limit=MAX_FRAME_BYTES)
    start = await read_frame(reader)
    if start is None or start.get("kind") != "start":
        return 3
    channel = Channel(reader, writer)
    channel.listen()
    try:
        from harbor.models.agent.context import AgentContext  # lazy: as above (serve only)

        _known_model(start.get("model_name"), start.get("model_parse"))
        if AGENT_PYTHON_DIR not in sys.path:
            sys.path.append(AGENT_PYTHON_DIR)
        module, _, name = str(start["import_path"]).partition(":")
        agent_class = getattr(import_module(module), name)
        logs_dir = Path(BOX_MOUNT) / LOGS_NAME
        logs_dir.mkdir(parents=True, exist_ok=True)
        agent = agent_class(logs_dir=logs_dir, model_name=start.get("model_name"), **dict(start.get("kwargs") or {}))
        agent.session_id = start.get("session_id")
        environment = remote_environment_class()(channel, start["environment"])
        context = AgentContext()
        await agent.setup(environment)
        await agent.run(str(start["instruction"]), environment, context)
        if context.is_empty():
            agent.populate_context_post_run(context)
        outcome: dict[str, Any] = {"kind": "done", "context": context.model_dump(mode="json")}
    except BaseException as exc:  # the agent's own failure, whatever it is, goes back as its outcome
        outcome = _failure(exc)
    try:
        await channel.send(outcome)
    except ChannelError as exc:  # e.g. a context too large for one frame
        await channel.send(_failure(exc))
    await channel.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 3 and args[0] == "probe":
        print(json.dumps(probe(args[1], args[2])), flush=True)
        return 0
    if len(args) == 2 and args[0] == "serve":
        os.environ.setdefault("HARBOR_TELEMETRY", "0")
        return asyncio.run(serve(args[1]))
    print("usage: python3 -m pipeline.runner.agent_host serve SOCKET | probe PACKAGE IMPORT_PATH", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
