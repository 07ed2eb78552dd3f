"""Fail-closed correlation of a dispatch with the workflow run it started.

GitHub's repository_dispatch returns no run id, so the run is found by its
``display_title``, which the infra workflow's ``run-name`` ends with
``" " + correlation_id``. Rules (each a test in tests/dispatch/):

* only runs of the dispatched workflow count: the listing is the workflow's
  own (``GET .../actions/workflows/{id}/runs``) and every run is checked again
  on the client by ``workflow_id`` and ``path``, so a run of another workflow
  reacting to the same event is never adopted, in either dispatch mode;
* exact delimited token: ``display_title.endswith(" " + correlation)``, so an
  id that is a substring, a prefix, a different case or followed by
  whitespace never matches;
* only runs created at or after (dispatch time - skew allowance): the
  ``created`` filter has second precision and clocks differ;
* a run of the workflow carrying the token but with another event,
  repository, head repository or branch fails the whole dispatch;
* zero matches after the last discovery poll, or more than one at any poll
  (duplicate delivery), fail;
* a match is trusted only after a second listing still shows exactly that one
  match: a run already complete when first seen is confirmed by one more poll,
  so a duplicate that appears a moment later is still caught;
* a run id GitHub returned (``return_run_details``) gets the same checks
  before anything else, and must then be the one match of the listing;
* the run must end ``completed``/``success``; never "the newest run", never logs.

One list request per poll: the listing asks for 100 runs per page (GitHub's
maximum) filtered by workflow, event and ``created``, so one page holds every
candidate; more pages are read only when ``total_count`` says so (bounded).
The listing carries ``status``/``conclusion``, so discovery, following and the
duplicate check share that one request.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import github
from github import GithubException, UnknownObjectException

from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.core.waiting import WaitReporter
from pipeline.dispatch.client import Transient, classify

DEFAULT_WORKFLOW_FILE = "benchmark.yml"
WORKFLOWS_DIR = ".github/workflows/"
# A plain file name in .github/workflows: no directory, no "..", lowercase extension.
WORKFLOW_FILE_RE = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\.(?:yml|yaml)\Z")
MAX_PAGE_SIZE = 100  # GitHub's per_page maximum


class Clock(Protocol):
    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
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
    page_size: int = MAX_PAGE_SIZE

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.interval_s < 0 or self.skew_s < 0 or self.max_runs < 1:
            raise ValueError("PollConfig: attempts and max_runs must be >= 1, interval_s and skew_s >= 0")
        if not 1 <= self.page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"PollConfig: page_size must be 1..{MAX_PAGE_SIZE}")


def validate_workflow_file(value: str, field: str = "workflow_file") -> str:
    """The infra workflow's file name: a plain ``NAME.yml``/``NAME.yaml`` in .github/workflows."""
    if not isinstance(value, str) or not WORKFLOW_FILE_RE.match(value) or ".." in value:
        raise ValidationError(field, "must be a plain workflow file name ending in .yml or .yaml "
                                     "(e.g. benchmark.yml; no directory, no '..')", value)
    return value


@dataclass(frozen=True)
class Target:
    """What the dispatched workflow's run must look like."""

    repo: str  # canonical OWNER/NAME of the infra repository (as GitHub spells it)
    workflow_id: int
    workflow_path: str  # .github/workflows/<file>
    event: str  # repository_dispatch | workflow_dispatch
    branch: str  # the branch the run executes on (the default branch)
    correlation: str

    def describe(self) -> str:
        return f"{self.workflow_path} (workflow {self.workflow_id}) in {self.repo}"


@dataclass(frozen=True)
class WorkflowRunState:
    run_id: int
    html_url: str
    status: str
    conclusion: str | None
    display_title: str


@dataclass(frozen=True)
class RunFacts:
    """The fields of a workflow run the checks read, type-checked (a listing may be hostile)."""

    state: WorkflowRunState
    workflow_id: int
    path: str
    event: str
    head_branch: str | None
    created_at: datetime
    repository: str | None
    head_repository: str | None


def title_matches(display_title: str | None, correlation: str) -> bool:
    return isinstance(display_title, str) and display_title.endswith(" " + correlation)


def created_filter(since: datetime) -> str:
    return ">=" + since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def floor_seconds(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(microsecond=0)


def _full_name(value: object) -> str | None:
    if isinstance(value, Mapping):
        name = value.get("full_name")
        return name if isinstance(name, str) else None
    return None


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)  # Python >= 3.11 reads a "Z" offset
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def parse_run(data: object) -> RunFacts:
    """Type-check one workflow run object; CheckFailed when a field the checks need is malformed."""
    if not isinstance(data, Mapping):
        raise CheckFailed("GitHub returned a workflow run that is not an object")
    run_id = data.get("id")
    if not isinstance(run_id, int) or isinstance(run_id, bool):
        raise CheckFailed(f"GitHub returned a workflow run without an integer id ({run_id!r})")
    strings = {key: data.get(key) for key in ("html_url", "status", "display_title", "path", "event")}
    bad = sorted(key for key, value in strings.items() if not isinstance(value, str))
    conclusion = data.get("conclusion")
    workflow_id = data.get("workflow_id")
    head_branch = data.get("head_branch")
    if not (conclusion is None or isinstance(conclusion, str)):
        bad.append("conclusion")
    if not isinstance(workflow_id, int) or isinstance(workflow_id, bool):
        bad.append("workflow_id")
    if not (head_branch is None or isinstance(head_branch, str)):
        bad.append("head_branch")
    created_at = _time(data.get("created_at"))
    if created_at is None:
        bad.append("created_at")
    if bad or not isinstance(workflow_id, int) or created_at is None:
        raise CheckFailed(f"workflow run {run_id} from GitHub has malformed field(s) {', '.join(bad)}")
    state = WorkflowRunState(run_id, str(strings["html_url"]), str(strings["status"]), conclusion,
                     str(strings["display_title"]))
    return RunFacts(state, workflow_id, str(strings["path"]), str(strings["event"]), head_branch,
                    created_at, _full_name(data.get("repository")),
                    _full_name(data.get("head_repository")))


def path_names_workflow(path: str, target: Target) -> bool:
    """GitHub reports a run's ``path`` as ``.github/workflows/F``, optionally ``@ref`` and, for some
    runs, prefixed by ``OWNER/NAME/`` of the repository; only this repository's file is accepted
    (which ref it was taken from is :func:`path_ref_reason`'s rule)."""
    file_path, at, ref = path.partition("@")
    if at and (not ref or any(c.isspace() for c in ref)):
        return False
    if file_path == target.workflow_path:
        return True
    prefix = target.repo + "/"
    return (file_path.lower().startswith(prefix.lower())
            and file_path[len(prefix):] == target.workflow_path)


def path_ref_reason(path: str, target: Target) -> str | None:
    """A ref in the run's ``path`` must be the branch the dispatch runs on, exactly
    (``refs/heads/B``, or ``B`` as GitHub also reports it): the workflow file taken from another
    ref is another workflow, whatever ``head_branch`` says."""
    _, at, ref = path.partition("@")
    if at and ref not in (f"refs/heads/{target.branch}", target.branch):
        return f"ran the workflow file at {ref!r}, not at refs/heads/{target.branch}"
    return None


def foreign_reason(run: RunFacts, target: Target) -> str | None:
    """Why a run is not one of the target workflow's runs (None: it is)."""
    if run.workflow_id != target.workflow_id:
        return f"belongs to workflow {run.workflow_id}, not {target.workflow_id}"
    if not path_names_workflow(run.path, target):
        return f"has workflow path {run.path!r}, not {target.workflow_path!r}"
    return None


def conflict_reason(run: RunFacts, target: Target) -> str | None:
    """Why a run of the target workflow that carries our token cannot be the dispatched one."""
    if run.event != target.event:
        return f"was triggered by {run.event!r}, not {target.event!r}"
    for what, name in (("repository", run.repository), ("head repository", run.head_repository)):
        if name is None or name.lower() != target.repo.lower():
            return f"has {what} {name!r}, not {target.repo!r}"
    if run.head_branch != target.branch:
        return f"ran on branch {run.head_branch!r}, not {target.branch!r}"
    return path_ref_reason(run.path, target)


def check_returned_run(run: RunFacts, target: Target, since: datetime) -> None:
    """The run GitHub named (``return_run_details``) passes every check a listed match must pass."""
    reason = foreign_reason(run, target) or conflict_reason(run, target)
    if reason is None and not title_matches(run.state.display_title, target.correlation):
        reason = (f"has title {run.state.display_title!r}, which does not end in ' {target.correlation}' "
                  "(the dispatched workflow's run-name must end with the correlation id)")
    if reason is None and run.created_at < since:
        reason = f"was created at {run.created_at}, before the dispatch (window starts {since:%Y-%m-%dT%H:%M:%SZ})"
    if reason is not None:
        raise CheckFailed(f"workflow run {run.state.run_id} returned by the dispatch is not the dispatched run of "
                          f"{target.describe()}: it {reason}; refusing to follow it")


class Correlator:
    """Polls one workflow's runs for the run of one dispatch: one list request per poll."""

    def __init__(
        self,
        gh: github.Github,
        target: Target,
        *,
        since: datetime,
        poll: PollConfig | None = None,
        clock: Clock | None = None,
        on_poll: Callable[[int, str], None] | None = None,
        progress: WaitReporter | None = None,
    ) -> None:
        self.gh = gh
        self.target = target
        self.correlation = target.correlation
        self.since = floor_seconds(since)
        self.poll = poll or PollConfig()
        self.clock = clock or SystemClock()
        self.on_poll = on_poll  # observers (bench); never logs
        self.progress = progress  # what the wait waits for, how long of how long (pipeline.core.waiting)
        self._started: datetime | None = None
        self._reported: str | None = None  # the last wait reported, to close when the wait ends
        self.polls = 0
        self.list_requests = 0
        self._transient_streak = 0

    # --- one poll ------------------------------------------------------------------

    def _list_page(self, page: int) -> tuple[int, list[object]]:
        url = f"/repos/{self.target.repo}/actions/workflows/{self.target.workflow_id}/runs"
        params = {"event": self.target.event, "created": created_filter(self.since),
                  "per_page": self.poll.page_size, "page": page}
        self.list_requests += 1
        _, data = self.gh.requester.requestJsonAndCheck("GET", url, parameters=params)
        if not isinstance(data, Mapping):
            raise CheckFailed(f"listing runs of {self.target.describe()}: GitHub answered no object")
        total, runs = data.get("total_count"), data.get("workflow_runs")
        if not isinstance(total, int) or isinstance(total, bool) or total < 0 or not isinstance(runs, list):
            raise CheckFailed(f"listing runs of {self.target.describe()}: malformed total_count/workflow_runs")
        return total, runs

    def listing(self) -> list[RunFacts]:
        """Every run of the workflow in the window: one page, more only when total_count says so."""
        total, runs = self._list_page(1)
        page = 1
        by_id: dict[int, RunFacts] = {}
        while True:
            if total > self.poll.max_runs:
                raise CheckFailed(
                    f"{total} runs of {self.target.describe()} created since {self.since:%Y-%m-%dT%H:%M:%SZ} "
                    f"(more than {self.poll.max_runs}); refusing to decide which one is {self.correlation!r}")
            for item in runs:
                facts = parse_run(item)
                by_id[facts.state.run_id] = facts  # pages can overlap when runs arrive between requests
            if not runs or page * self.poll.page_size >= total:
                return list(by_id.values())
            page += 1
            total, runs = self._list_page(page)

    def matches(self) -> list[WorkflowRunState]:
        """The runs of this dispatch visible now; fails on a conflicting run of the workflow."""
        found: list[WorkflowRunState] = []
        for run in self.listing():
            if not title_matches(run.state.display_title, self.correlation):
                continue
            if run.created_at < self.since:
                continue  # a stale run from before this dispatch
            if foreign_reason(run, self.target) is not None:
                continue  # another workflow's run: never counted, never adopted
            conflict = conflict_reason(run, self.target)
            if conflict is not None:
                raise CheckFailed(f"workflow run {run.state.run_id} of {self.target.describe()} carries correlation "
                                  f"{self.correlation!r} but {conflict}; refusing to pick a run")
            found.append(run.state)
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
        except (CheckFailed, InfrastructureError):
            raise
        except Exception as exc:
            transient = classify(exc)
            if transient is None:
                raise CheckFailed(f"listing runs of {self.target.describe()} failed: {describe_failure(exc)}") from None
            return None, transient

    def _poll(self, attempt: int | None = None) -> tuple[list[WorkflowRunState], Transient | None]:
        self.polls += 1
        found, transient = self._guarded(self.matches)
        if self.on_poll:
            self.on_poll(attempt or self.polls, "transient" if transient else f"{len(found)} match(es)")
        if transient is None and len(found) > 1:
            raise self._ambiguous(found)
        return found or [], transient

    # --- the state machine ---------------------------------------------------------------

    def _elapsed(self) -> float:
        return (self.clock.now() - (self._started or self.clock.now())).total_seconds()

    def _report(self, what: str, limit: float) -> None:
        if self.progress is not None:
            self._reported = what
            self.progress.update(what, self._elapsed(), limit)

    def _close(self, what: str | None, found: bool) -> None:
        if self.progress is not None and self._reported is not None:
            self.progress.done(what or self._reported, self._elapsed(), found)
            self._reported = None

    def _looking_for(self) -> str:
        return f"the run of {self.target.workflow_path} in {self.target.repo} titled '... {self.correlation}'"

    @staticmethod
    def _following(run: WorkflowRunState) -> str:
        return f"workflow run {run.run_id} to complete ({run.html_url}, {run.status})"

    def find(self) -> WorkflowRunState:
        """Discovery: exactly one match within ``attempts`` polls."""
        for attempt in range(1, self.poll.attempts + 1):
            found, transient = self._poll(attempt)
            if transient is None and len(found) == 1:
                return found[0]
            if attempt < self.poll.attempts:
                self._report(self._looking_for(), self.poll.attempts * self.poll.interval_s)
                self._wait(transient)
        raise CheckFailed(
            f"no run of {self.target.describe()} has a title ending in {self.correlation!r} "
            f"after {self.poll.attempts} polls {self.poll.interval_s:g} s apart; not adopting any other run")

    def _ambiguous(self, found: list[WorkflowRunState]) -> CheckFailed:
        ids = ", ".join(str(r.run_id) for r in found)
        return CheckFailed(
            f"{len(found)} workflow runs of {self.target.describe()} match correlation {self.correlation!r} "
            f"(runs {ids}): duplicate delivery or a reused id; refusing to pick one")

    def follow(self, run: WorkflowRunState, deadline: datetime) -> WorkflowRunState:
        """Poll the listing until the run completes and a second listing has confirmed it is the
        only match; fails on a second match at any poll."""
        current = run
        sightings = 1  # listings that showed exactly this run and nothing else
        transient: Transient | None = None
        limit = (deadline - (self._started or self.clock.now())).total_seconds()
        while current.status != "completed" or sightings < 2:
            if current.status == "completed" and current.conclusion != "success":
                return current  # a failure needs no confirmation: it fails either way
            if current.status != "completed" and self.clock.now() >= deadline:
                raise CheckFailed(
                    f"workflow run {current.run_id} ({current.html_url}) did not complete before the timeout "
                    f"(status {current.status})")
            # A completed run gets exactly one confirming poll, even past the deadline (bounded).
            self._report(self._following(current), limit)
            self._wait(transient)
            found, transient = self._poll()
            if transient is not None:
                continue
            same = [r for r in found if r.run_id == run.run_id]
            if not same:
                raise CheckFailed(f"workflow run {run.run_id} matching {self.correlation!r} disappeared from the "
                                  f"listing of {self.target.describe()}")
            current = same[0]
            sightings += 1
        return current

    def wait(self, deadline: datetime, expected_id: int | None = None) -> WorkflowRunState:
        """Find exactly one match (``expected_id`` if GitHub named the run), then follow it to the end."""
        self._started = self.clock.now()
        try:
            found = self.find()
            if expected_id is not None and found.run_id != expected_id:
                raise CheckFailed(f"the only run of {self.target.describe()} matching {self.correlation!r} is "
                                  f"{found.run_id}, but the dispatch returned run {expected_id}; refusing both")
            state = self.follow(found, deadline)
        except BaseException:
            self._close(None, False)  # the line a terminal was rewriting ends before the error is printed
            raise
        self._close(self._following(state), True)
        return state

    # --- a run GitHub named ------------------------------------------------------------

    def verify_returned(self, run_id: int) -> None:
        """Read the run ``return_run_details`` named and check it; bounded retries while it is not visible."""
        url = f"/repos/{self.target.repo}/actions/runs/{run_id}"
        streak = 0
        for attempt in range(1, self.poll.attempts + 1):
            try:
                _, data = self.gh.requester.requestJsonAndCheck("GET", url)
            except Exception as exc:
                transient = classify(exc)

                if isinstance(exc, UnknownObjectException):
                    if attempt < self.poll.attempts:
                        self.clock.sleep(self.poll.interval_s)
                    continue
                if transient is None:
                    raise CheckFailed(f"workflow run {run_id} returned by the dispatch cannot be read: "
                                      f"{describe_failure(exc)}") from None
                streak += 1
                if streak > self.poll.max_transient_errors:
                    raise InfrastructureError(
                        f"GitHub kept failing while reading run {run_id} ({transient.reason})") from None
                self.clock.sleep(backoff(self.poll, transient, streak))
                continue
            check_returned_run(parse_run(data), self.target, self.since)
            return
        raise CheckFailed(f"workflow run {run_id} returned by the dispatch was not found in {self.target.repo} "
                          f"after {self.poll.attempts} attempts")


def describe_failure(exc: BaseException) -> str:
    """A short, secret-free description of a failed request (status and GitHub's message line)."""

    if isinstance(exc, GithubException):
        message = exc.data.get("message") if isinstance(exc.data, dict) else None
        first = str(message).splitlines()[0] if message else ""
        return f"HTTP {exc.status}" + (f" ({first})" if first else "")
    return type(exc).__name__


def backoff(poll: PollConfig, transient: Transient, streak: int) -> float:
    """Rate limits: wait at least Retry-After. Server errors: exponential from the interval."""
    if transient.rate_limited:
        delay = max(poll.interval_s, transient.retry_after or 0.0)
    else:
        delay = poll.interval_s * (2 ** min(streak - 1, 6))
    return min(delay, max(poll.max_backoff_s, poll.interval_s))
