"""Stage timing and progress for ``benchseal release``: one place that knows how long each step took."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


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
        task = self._progress.add_task(description, total=1) if self._progress is not None else None
        started = time.monotonic()
        try:
            yield
        finally:
            elapsed = time.monotonic() - started
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed
            if self._progress is not None and task is not None:
                self._progress.update(task, completed=1, description=f"{description} [dim]done[/dim]")

    def add(self, name: str, seconds: float) -> None:
        """A stage measured inside another one (e.g. signing inside evidence)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
