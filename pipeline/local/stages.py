"""Stage timing and progress for ``benchseal release``: one place that knows how long each step took."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from pipeline.core.waiting import WaitLines, WaitReporter, reporting, wait_text


@dataclass
class StageClock:
    """Wall time per stage, in the order the stages ran, with a rich spinner while one runs."""

    console: Console | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    _progress: Progress | None = None

    def __enter__(self) -> StageClock:
        if self.console is not None:
            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                console=self.console, transient=False,
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    @contextmanager
    def stage(self, name: str, description: str) -> Iterator[None]:
        """Time ``name``; a wait inside it (the agent's npm release) is said on the stage's line, or in
        plain lines when the console is no terminal (a CI log)."""
        task = self._progress.add_task(description, total=1) if self._progress is not None else None
        waits: WaitReporter | None = None
        if self.console is not None and self._progress is not None and task is not None:
            waits = _StageWaits(self._progress, task, description) if self.console.is_terminal \
                else WaitLines(self.console.file, tty=False)
        started = time.monotonic()
        try:
            with reporting(waits):
                yield
        finally:
            elapsed = time.monotonic() - started
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed
            if self._progress is not None and task is not None:
                self._progress.update(task, completed=1, description=f"{description} [dim]done[/dim]")

    def add(self, name: str, seconds: float) -> None:
        """A stage measured inside another one (e.g. signing inside evidence)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds


class _StageWaits:
    """On a terminal: the running stage's own line says what it waits for (rich redraws it)."""

    def __init__(self, progress: Progress, task: TaskID, description: str) -> None:
        self.progress, self.task, self.description = progress, task, description

    def update(self, what: str, elapsed: float, limit: float) -> None:
        self.progress.update(self.task, description=f"{self.description} [dim]({escape(wait_text(what, elapsed, limit))})[/dim]")

    def done(self, what: str, elapsed: float, found: bool) -> None:
        self.progress.update(self.task, description=self.description)
