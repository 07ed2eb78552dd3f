"""GitHub emulator: see ``emulator.py`` and docs/github.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.doubles.github.clock import FakeClock, SystemClock
from tests.doubles.github.emulator import DispatchEvent, GitHubEmulator, Run, RunHandle
from tests.doubles.github.validation import SPEC_CORRECTIONS, Violation

if TYPE_CHECKING:
    import github

__all__ = [
    "SPEC_CORRECTIONS",
    "DispatchEvent",
    "FakeClock",
    "GitHubEmulator",
    "Run",
    "RunHandle",
    "SystemClock",
    "Violation",
    "client",
]


def client(base_url: str, token: str) -> github.Github:
    """The production client factory pointed at the emulator (no inter-request sleeps, no retry backoff)."""
    from pipeline.dispatch.client import make_client

    return make_client(base_url=base_url, token=token, backoff_factor=0.0)
