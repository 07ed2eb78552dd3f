"""Fail-closed correlation of a dispatch with the workflow run it started.

GitHub's repository_dispatch returns no run id, so the run is found by its
``display_title``, which the infra workflow's ``run-name`` ends with
``" " + correlation_id``. Rules (each a test in tests/dispatch/):

* exact delimited token: ``display_title.endswith(" " + correlation)``, so an
  id that is a substring or a prefix of another run's id never matches;
* only runs created at or after (dispatch time - skew allowance): the
  ``created`` filter has second precision and clocks differ;
* every page of the listing is read (bounded); zero matches after the last
  poll, or more than one match at any poll (duplicate delivery), fail;
* the matched run must end ``completed``/``success``; anything else fails;
* never "the newest run", never logs: only the runs listing and run status.

One list request per poll serves both discovery and status (the listing
carries ``status``/``conclusion``), and keeps checking for duplicates while
the run is in progress.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from pipeline.dispatch.client import Transient, classify
from pipeline.errors import CheckFailed, InfrastructureError

if TYPE_CHECKING:
    from github.Repository import Repository
    from github.Workflow import Workflow
    from github.WorkflowRun import WorkflowRun


class Clock(Protocol):
    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        import time

        time.sleep(max(0.0, seconds))


@dataclass(frozen=True)
class PollConfig:
    """Bounds of the wait. Discovery: ``attempts`` polls ``interval_s`` apart."""

    attempts: int = 30
    interval_s: float = 5.0
    skew_s: float = 120.0
    max_backoff_s: float = 120.0
    max_runs: int = 1000
    max_transient_errors: int = 10

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.interval_s < 0 or self.skew_s < 0 or self.max_runs < 1:
            raise ValueError("PollConfig: attempts and max_runs must be >= 1, interval_s and skew_s >= 0")


@dataclass(frozen=True)
class RunState:
    run_id: int
    html_url: str
    status: str
    conclusion: str | None
    display_title: str


def title_matches(display_title: str | None, correlation: str) -> bool:
    return isinstance(display_title, str) and display_title.endswith(" " + correlation)


def created_filter(since: datetime) -> str:
    return ">=" + since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def floor_seconds(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(microsecond=0)


def _state(run: WorkflowRun) -> RunState:
    return RunState(run.id, run.html_url, run.status, run.conclusion, run.display_title)


class Correlator:
    """Polls one repository for the run of one dispatch."""

    def __init__(
        self,
        repository: Repository,
        correlation: str,
        *,
        since: datetime,
        event: str,
        workflow: Workflow | None = None,
        poll: PollConfig | None = None,
        clock: Clock | None = None,
        on_poll: Callable[[int, str], None] | None = None,
    ) -> None:
        self.repository = repository
        self.correlation = correlation
        self.since = floor_seconds(since)
        self.event = event
        self.workflow = workflow
        self.poll = poll or PollConfig()
        self.clock = clock or SystemClock()
        self.on_poll = on_poll  # observers (bench); never logs
        self.polls = 0
        self._transient_streak = 0

    # --- one poll ------------------------------------------------------------------

    def _list(self) -> Any:
        kwargs: dict[str, Any] = {"event": self.event, "created": created_filter(self.since)}
        if self.workflow is not None:
            return self.workflow.get_runs(**kwargs)
        return self.repository.get_workflow_runs(**kwargs)

    def matches(self) -> list[RunState]:
        """All runs of this dispatch visible now (every page, bounded)."""
        found: list[RunState] = []
        limit = self.poll.max_runs
        for seen, run in enumerate(self._list(), start=1):
            if seen > limit:
                raise CheckFailed(
                    f"more than {limit} runs created since {self.since:%Y-%m-%dT%H:%M:%SZ} in "
                    f"{self.repository.full_name}; refusing to decide which one is {self.correlation!r}")
            created = run.created_at
            if created is not None and created.astimezone(UTC) < self.since:
                continue
            if title_matches(run.display_title, self.correlation):
                found.append(_state(run))
        return found

    def _wait(self, transient: Transient | None) -> None:
        """Sleep before the next poll: the interval, or a backoff after a transient failure."""
        if transient is None:
            self._transient_streak = 0
            self.clock.sleep(self.poll.interval_s)
            return
        self._transient_streak += 1
        if self._transient_streak > self.poll.max_transient_errors:
            raise InfrastructureError(
                f"GitHub kept failing while waiting for run {self.correlation!r} ({transient.reason}, "
                f"{self._transient_streak} times in a row)")
        self.clock.sleep(backoff(self.poll, transient, self._transient_streak))

    def _guarded(self, call: Callable[[], Any]) -> tuple[Any, Transient | None]:
        try:
            return call(), None
        except CheckFailed:
            raise
        except Exception as exc:
            transient = classify(exc)
            if transient is None:
                from github import GithubException

                status = exc.status if isinstance(exc, GithubException) else type(exc).__name__
                raise CheckFailed(f"listing workflow runs of {self.repository.full_name} failed: {status}") from None
            return None, transient

    # --- the state machine ---------------------------------------------------------------

    def find(self) -> RunState:
        """Discovery: exactly one match within ``attempts`` polls."""
        for attempt in range(1, self.poll.attempts + 1):
            self.polls += 1
            found, transient = self._guarded(self.matches)
            if self.on_poll:
                self.on_poll(attempt, "transient" if transient else f"{len(found)} match(es)")
            if transient is None:
                if len(found) > 1:
                    raise self._ambiguous(found)
                if len(found) == 1:
                    match: RunState = found[0]
                    return match
            if attempt < self.poll.attempts:
                self._wait(transient)
        raise CheckFailed(
            f"no workflow run in {self.repository.full_name} has a title ending in {self.correlation!r} "
            f"after {self.poll.attempts} polls {self.poll.interval_s:g} s apart; not adopting any other run")

    def _ambiguous(self, found: list[RunState]) -> CheckFailed:
        ids = ", ".join(str(r.run_id) for r in found)
        return CheckFailed(
            f"{len(found)} workflow runs in {self.repository.full_name} match correlation {self.correlation!r} "
            f"(runs {ids}): duplicate delivery or a reused id; refusing to pick one")

    def follow(self, run: RunState, deadline: datetime) -> RunState:
        """Poll the listing until the run completes, failing on a second match."""
        current = run
        transient: Transient | None = None
        while current.status != "completed":
            if self.clock.now() >= deadline:
                raise CheckFailed(
                    f"workflow run {current.run_id} ({current.html_url}) did not complete before the timeout "
                    f"(status {current.status})")
            self._wait(transient)
            self.polls += 1
            found, transient = self._guarded(self.matches)
            if transient is not None:
                continue
            if len(found) > 1:
                raise self._ambiguous(found)
            same = [r for r in found if r.run_id == run.run_id]
            if not same:
                raise CheckFailed(f"workflow run {run.run_id} matching {self.correlation!r} disappeared from the listing")
            current = same[0]
        return current


def backoff(poll: PollConfig, transient: Transient, streak: int) -> float:
    """Rate limits: wait at least Retry-After. Server errors: exponential from the interval."""
    if transient.rate_limited:
        delay = max(poll.interval_s, transient.retry_after or 0.0)
    else:
        delay = poll.interval_s * (2 ** min(streak - 1, 6))
    return min(delay, max(poll.max_backoff_s, poll.interval_s))


def watch_run(
    repository: Repository,
    run_id: int,
    correlation: str,
    *,
    deadline: datetime,
    poll: PollConfig,
    clock: Clock,
) -> RunState:
    """Follow a run whose id GitHub returned (workflow_dispatch with return_run_details)."""
    streak = 0
    while True:
        try:
            state = _state(repository.get_workflow_run(run_id))
            streak = 0
        except Exception as exc:
            transient = classify(exc)
            if transient is None:
                raise CheckFailed(f"workflow run {run_id} in {repository.full_name} cannot be read") from None
            streak += 1
            if streak > poll.max_transient_errors:
                raise InfrastructureError(f"GitHub kept failing while reading run {run_id} ({transient.reason})") from None
            clock.sleep(backoff(poll, transient, streak))
            continue
        if not title_matches(state.display_title, correlation):
            raise CheckFailed(
                f"workflow run {run_id} has title {state.display_title!r}, which does not end in {correlation!r}: "
                "the dispatched workflow's run-name must end with the correlation id")
        if state.status == "completed":
            return state
        if clock.now() >= deadline:
            raise CheckFailed(f"workflow run {run_id} ({state.html_url}) did not complete before the timeout")
        clock.sleep(poll.interval_s)


def deadline_after(clock: Clock, timeout_s: float) -> datetime:
    return clock.now() + timedelta(seconds=timeout_s)
