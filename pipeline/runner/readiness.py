"""Which of a batch's tasks may start: the worker says so per task once the task's image is ready.

The worker builds a batch's missing task images while its runner container already runs the trials of the
tasks that are ready (issue 36.5: builds off the critical path). Readiness is one empty file per task in a
directory the worker creates after granting the batch dir to the sandbox, so it stays the worker's (the
runner cannot write there), written only after the task's ``task.toml`` names its image (atomically). The
runner's trial of a task waits for that file before it takes a slot (``ReadyTasks``).

Harbor-free: the worker (``mark_ready``) and ``benchseal trial run`` (``ReadyTasks``) share it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from pathlib import Path

from pipeline.core.errors import ValidationError
from pipeline.runner.plan import TASK_NAME_RE

READY_DIR = "ready"  # under a batch dir: <batch>/ready/<task>
POLL_SECONDS = 0.1  # one listing for all waiting trials; a build takes seconds, a trial several


def make_ready_dir(batch_dir: Path) -> Path:
    """The batch's readiness dir, created by the worker (mode 0755: the sandbox reads it, only the worker writes)."""
    ready = batch_dir / READY_DIR
    ready.mkdir(mode=0o755)
    os.chmod(ready, 0o755)  # noqa: S103 - whatever the umask; readable by the sandbox, writable by the worker only
    return ready


def mark_ready(ready_dir: Path, tasks: Iterable[str]) -> None:
    """Say each of ``tasks`` may start (its task.toml is final); marking one twice is a no-op."""
    for task in tasks:
        if not TASK_NAME_RE.match(task):
            raise ValidationError("task", f"must match {TASK_NAME_RE.pattern}", task)
        try:
            fd = os.open(ready_dir / task, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            continue
        try:
            os.fchmod(fd, 0o644)  # whatever the worker's umask: the sandbox reads the dir as others
        finally:
            os.close(fd)


class ReadyTasks:
    """The runner's side: ``await wait(task)`` returns once the worker marked ``task`` ready.

    One poller lists the directory for every waiting trial (a few hundred trials may wait on one build)."""

    def __init__(self, ready_dir: Path, poll_seconds: float = POLL_SECONDS) -> None:
        self._dir = ready_dir
        self._poll_seconds = poll_seconds
        self._events: dict[str, asyncio.Event] = {}
        self._poller: asyncio.Task[None] | None = None

    async def wait(self, task: str) -> None:
        """Return once ``task`` is marked; an unreadable directory raises here (the trial fails, never hangs)."""
        event = self._events.setdefault(task, asyncio.Event())
        while not event.is_set():
            if self._poller is None or self._poller.done():
                if self._poller is not None:
                    self._poller.result()  # a failed listing: raised in every waiting trial
                self._poller = asyncio.create_task(self._poll())
            waiting = asyncio.ensure_future(event.wait())
            await asyncio.wait({waiting, self._poller}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()

    async def _poll(self) -> None:
        while any(not event.is_set() for event in self._events.values()):
            present = set(os.listdir(self._dir))  # OSError (gone, unreadable): every waiting trial gets it
            for task, event in self._events.items():
                if task in present:
                    event.set()
            await asyncio.sleep(self._poll_seconds)
