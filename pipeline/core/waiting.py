"""A long wait says what it waits for and how long of how long (issue 38.4).

A waiting loop calls ``WaitReporter.update(what, elapsed, limit)`` about once a second while it waits
and ``done`` when the wait ends; a wait that ends at its first look reports nothing. ``WaitLines``
writes them: on a terminal ONE line rewritten in place, elsewhere (a CI log, a file) a plain line at
the start and then every ``every`` seconds, with no control characters. The text is the same for
both: ``waiting for tern-cli@1.0.1 on <the configured registry URL> (12 s of 600 s)``, and at the end
``waited 14 s for …: done`` (or ``gave up``). A plain line is also written at once when ``what``
changes (a workflow run's status).

A caller several layers up (``release --local``'s stages) installs its reporter for the waits under
it with ``reporting(reporter)``; a waiting function given no reporter uses ``current_reporter()``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO, Protocol

from pipeline.core.errors import escape_text

PLAIN_EVERY_SECONDS = 10.0  # a CI log gets a line this often: alive, yet not a line per poll


class WaitReporter(Protocol):
    def update(self, what: str, elapsed: float, limit: float) -> None:
        """Still waiting for ``what``: ``elapsed`` seconds of at most ``limit``."""

    def done(self, what: str, elapsed: float, found: bool) -> None:
        """The wait for ``what`` ended after ``elapsed`` seconds: ``found`` it, or gave up."""


_CURRENT: ContextVar[WaitReporter | None] = ContextVar("benchseal_wait_reporter", default=None)


@contextmanager
def reporting(reporter: WaitReporter | None) -> Iterator[None]:
    """``reporter`` hears the waits run under this block (in this thread or task)."""
    token = _CURRENT.set(reporter)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_reporter() -> WaitReporter | None:
    return _CURRENT.get()


def wait_text(what: str, elapsed: float, limit: float) -> str:
    """The one wording of a wait (what, seconds so far, of how many), escaped for a terminal or log."""
    return escape_text(f"waiting for {what} ({max(0.0, elapsed):.0f} s of {limit:g} s)")


def done_text(what: str, elapsed: float, found: bool) -> str:
    return escape_text(f"waited {max(0.0, elapsed):.0f} s for {what}: {'done' if found else 'gave up'}")


class WaitLines:
    """``WaitReporter`` on a text stream: an updating line on a TTY, plain lines every ``every`` s otherwise."""

    def __init__(self, stream: IO[str], *, tty: bool | None = None, every: float = PLAIN_EVERY_SECONDS) -> None:
        self.stream = stream
        self.tty = _isatty(stream) if tty is None else tty
        self.every = every
        self._what: str | None = None  # what the last plain line said (a new what is said at once)
        self._last = 0.0  # elapsed at the last plain line
        self._said = False  # a line about the current wait was written (done closes it)
        self._lock = threading.Lock()  # one wait at a time, but a reporter may be shared between threads

    def update(self, what: str, elapsed: float, limit: float) -> None:
        text = wait_text(what, elapsed, limit)
        with self._lock:
            if self.tty:
                self.stream.write("\r\x1b[K" + text)  # back to the line's start, erase it, write the new text
            else:
                if what == self._what and elapsed - self._last < self.every:
                    return
                self._what, self._last = what, elapsed
                self.stream.write(text + "\n")
            self._said = True
            self.stream.flush()

    def done(self, what: str, elapsed: float, found: bool) -> None:
        with self._lock:
            if not self._said:
                return  # nothing was said about this wait: nothing to close
            self.stream.write(("\r\x1b[K" if self.tty else "") + done_text(what, elapsed, found) + "\n")
            self._said, self._what = False, None
            self.stream.flush()


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream: plain lines are always safe
        return False
