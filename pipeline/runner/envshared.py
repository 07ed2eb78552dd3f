"""What both trial environments of the runner share (Harbor-free, so importing it costs nothing).

* the release agent's read-only mount (``set_agent_mount``, set once per run by ``agent_check``);
* teardowns handed off the critical path by ``stop()`` and awaited by ``drain_teardowns()``
  before ``run_suite`` returns, so no trial container outlives the runner;
* the per-operation timings file of each trial dir (``TIMINGS_FILE``; names only, never a command
  line or a value);
* ``created_id``: the id in the engine's answer to a create, checked (a 2xx answer without one is
  named, never a bare ``KeyError``).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from pipeline.core.digests import ENGINE_ID_PATTERN

# One JSON object per engine operation (or compose command) and per start/stop, in each trial dir.
TIMINGS_FILE = "env-timings.jsonl"
# Teardowns started by stop() and not finished yet (all environments of this process).
_teardowns: set[asyncio.Task[None]] = set()
# The release agent's files for every task container, read-only: (host source, container target).
_agent_mount: tuple[Path, str] | None = None


def set_agent_mount(source: Path, target: str) -> None:
    """Every task container this process starts gets ``source`` bound read-only at ``target``."""
    global _agent_mount
    _agent_mount = (source, target)


def agent_mount() -> tuple[Path, str] | None:
    return _agent_mount


def spawn_teardown(coro: Coroutine[Any, Any, None], name: str) -> None:
    """Run ``coro`` in the background; ``drain_teardowns`` waits for it."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _teardowns.add(task)
    task.add_done_callback(_teardowns.discard)


async def drain_teardowns() -> None:
    """Wait until every environment stopped by this process is torn down."""
    while _teardowns:
        pending = list(_teardowns)
        for task, result in zip(pending, await asyncio.gather(*pending, return_exceptions=True), strict=True):
            if isinstance(result, BaseException):
                # The environments log their own failures; this is what escaped them (runner.log).
                print(f"{task.get_name()}: {type(result).__name__}: {result}", flush=True)


_ENGINE_ID = re.compile(ENGINE_ID_PATTERN)


class EngineAnswerError(RuntimeError):
    """The engine answered a create with success but without the id of what it created."""


def created_id(answer: object, what: str) -> str:
    """The engine's id of what it just created (``{"Id": <64 hex>, ...}``); ``EngineAnswerError`` naming the
    answer otherwise."""
    ident = answer.get("Id") if isinstance(answer, dict) else None
    if not isinstance(ident, str) or not _ENGINE_ID.fullmatch(ident):
        raise EngineAnswerError(f"the engine's answer to the {what} create has no id: {str(answer)[:300]!r}")
    return ident


def record_timing(trial_dir: Path, session: str, op: str, started: float) -> None:
    """Append one line to the trial dir's timings file. Measurement only: a failure never affects the trial."""
    try:
        line = json.dumps({"session": session, "op": op, "seconds": round(time.monotonic() - started, 4)})
        with (trial_dir / TIMINGS_FILE).open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    except OSError:
        pass
