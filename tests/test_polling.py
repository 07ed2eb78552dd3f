"""pipeline.core.polling: the one bounded wait (tenacity) behind every local service's start and stop."""

from __future__ import annotations

import pytest

from pipeline.core.polling import poll_until


def test_returns_the_first_result() -> None:
    calls: list[int] = []

    def check() -> str | None:
        calls.append(1)
        return "ready" if len(calls) == 3 else None

    assert poll_until(check, timeout=10, interval=0.01) == "ready"
    assert len(calls) == 3


def test_gives_up_with_none_after_the_timeout() -> None:
    calls: list[int] = []

    def never() -> None:
        calls.append(1)

    assert poll_until(never, timeout=0.05, interval=0.01) is None
    assert len(calls) >= 2  # it retried, and it stopped (the call returned)


def test_an_exception_is_not_retried() -> None:
    calls: list[int] = []

    def exits() -> None:
        calls.append(1)
        raise RuntimeError("child exited")

    with pytest.raises(RuntimeError, match="child exited"):
        poll_until(exits, timeout=10, interval=0.01)
    assert calls == [1]
