"""Clocks shared by the emulator and the code under test.

A ``FakeClock`` moves only when someone sleeps on it, so a test of a
30-poll loop takes milliseconds and the emulator sees the same time.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class FakeClock:
    """Deterministic clock: ``sleep`` advances time instantly."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
        self._lock = threading.Lock()
        self.slept: list[float] = []

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._now.timestamp()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(max(0.0, seconds))
