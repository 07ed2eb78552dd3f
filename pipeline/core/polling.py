"""Bounded waiting for a local service or process (tenacity), one helper for every start/stop loop.

``poll_until(check, timeout=, interval=)`` calls ``check`` until it returns something other than
None, sleeping ``interval`` between attempts, and gives up (returning None) once ``timeout``
seconds have passed since the first attempt. An exception from ``check`` is not retried: it
propagates at once (a child that exited is a failure, not a reason to wait).
"""

from __future__ import annotations

from collections.abc import Callable

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed


def _gave_up(_state: RetryCallState) -> None:
    return None


def poll_until[T](check: Callable[[], T | None], *, timeout: float, interval: float) -> T | None:
    """The first non-None result of ``check`` within ``timeout`` seconds, else None."""
    retrying = Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(interval),
                        retry=retry_if_result(lambda result: result is None), retry_error_callback=_gave_up)
    result: T | None = retrying(check)
    return result
