"""Send the digests to the infra repository and wait, fail-closed, for the run.

``repository_dispatch`` (event_type + client_payload, <= 10 keys) carries the
``benchseal.dispatch/v1`` payload as is. ``workflow_dispatch`` carries it as
string inputs ``payload`` (canonical JSON), ``tag`` and ``correlation_id`` and
asks for ``return_run_details``; the returned run is checked like any match
(correlate.py) and must be the one match of the listing. A server that rejects
that field (older GitHub Enterprise: 400 or 422) is asked once more without
it, and the run is then found by title. In both modes the infra workflow's
file (default ``benchmark.yml``) is looked up first, and only its runs count.

A dispatch POST is sent at most once per accepted request: the transport
never retries POST, and a 5xx or network error after sending is ambiguous
(the event may exist), so it is never re-sent; the correlation id then tells
whether a run appeared.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import github
import requests
import rfc8785
from github import BadCredentialsException, GithubException, UnknownObjectException

from pipeline.core.contracts import (
    DigestsFile,
    DispatchPayload,
    PayloadSource,
    load_model,
    validate_correlation,
    validate_repository,
)
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError, ValidationError
from pipeline.core.waiting import WaitReporter, current_reporter
from pipeline.dispatch.client import classify
from pipeline.dispatch.correlate import (
    DEFAULT_WORKFLOW_FILE,
    WORKFLOWS_DIR,
    Clock,
    Correlator,
    PollConfig,
    SystemClock,
    Target,
    WorkflowRunState,
    describe_failure,
    validate_workflow_file,
)
from pipeline.dispatch.resolve import tag_of_ref

DEFAULT_EVENT_TYPE = "benchseal-benchmark"
MAX_CLIENT_PAYLOAD_KEYS = 10
EVENT_TYPE_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
_SLUG_RE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class DispatchResult:
    run_id: int
    html_url: str
    conclusion: str
    correlation_id: str
    mode: str = "repository_dispatch"  # or "workflow_dispatch" / "workflow_dispatch+run-name"
    workflow_path: str = WORKFLOWS_DIR + DEFAULT_WORKFLOW_FILE

    def to_json_dict(self) -> dict[str, object]:
        return {"run_id": self.run_id, "html_url": self.html_url, "conclusion": self.conclusion,
                "correlation_id": self.correlation_id, "mode": self.mode, "workflow_path": self.workflow_path}


def new_correlation_id(env: Mapping[str, str] | None = None) -> str:
    """``<repo>-<run id>-<attempt>-<random>`` from the Actions environment, bounded and space-free."""
    env = os.environ if env is None else env
    repo = env.get("GITHUB_REPOSITORY", "").rpartition("/")[2] or "local"
    run_id = env.get("GITHUB_RUN_ID", "") or datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    attempt = env.get("GITHUB_RUN_ATTEMPT", "") or "1"
    parts = [_SLUG_RE.sub("-", p).strip("-._")[:40] or "x" for p in (repo, run_id, attempt)]
    value = "-".join([*parts, secrets.token_hex(6)])
    if not value[0].isalnum():
        value = "c" + value
    value = value[:128]
    return validate_correlation(value, "correlation_id")  # cannot fail with the rules above; fail loudly if it does


def load_digests(path: Path) -> DigestsFile:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"digests file {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ValidationError(str(path), f"must be a readable JSON document ({type(exc).__name__})") from None
    return load_model(DigestsFile, data, str(path))


def build_payload(
    digests: DigestsFile,
    *,
    correlation_id: str,
    tag: str | None = None,
    repository: str | None = None,
    suite: str = "smoke",
    agent: str = "oracle",
    tasks: tuple[str, ...] | None = None,
) -> DispatchPayload:
    """The payload: the digests file's refs only (each re-validated) plus source commit, tag, correlation
    (and ``tasks``, a subset of the suite's tasks; None: every task)."""
    refs: dict[str, str] = {}
    for role in ("runner", "api"):
        entry = digests.images.get(role)
        if entry is None:
            raise ValidationError(f"digests.images.{role}", "is required")
        refs[role] = entry.ref  # the model checked it: digest-pinned, and equal to name@digest
    source_ref = digests.source.ref
    chosen_tag = tag_of_ref(tag or source_ref.removeprefix("refs/tags/"), "tag")
    slug = validate_repository(repository or digests.source.repository, "source.repository")
    data = {
        "schema": "benchseal.dispatch/v1",
        "correlation_id": validate_correlation(correlation_id),
        "source": PayloadSource(repository=slug, commit=digests.source.commit, tag=chosen_tag).model_dump(),
        "runner": refs["runner"],
        "api": refs["api"],
        "suite": suite,
        "agent": agent,
    }
    if tasks:
        data["tasks"] = list(tasks)
    if digests.agent is not None and digests.agent.name == agent:
        # The release's own agent: named with what the build checked (calibration agents carry none).
        data["agent_artifact"] = digests.agent.model_dump(mode="json")
    return load_model(DispatchPayload, data, "payload")


def client_payload(payload: DispatchPayload) -> dict[str, object]:
    data = payload.to_json_dict()
    if len(data) > MAX_CLIENT_PAYLOAD_KEYS:
        raise ValidationError("client_payload", f"GitHub allows at most {MAX_CLIENT_PAYLOAD_KEYS} top-level keys",
                              sorted(data))
    return data


def workflow_inputs(payload: DispatchPayload) -> dict[str, str]:
    """workflow_dispatch inputs are flat strings: the payload travels as compact sorted JSON."""
    # RFC 8785 canonical JSON, of the same dict as client_payload (no null fields).
    text = rfc8785.dumps(payload.to_json_dict()).decode("utf-8")  # type: ignore[arg-type]
    return {"payload": text, "tag": payload.source.tag, "correlation_id": payload.correlation_id}


def _server_time(headers: Mapping[str, Any] | None) -> datetime | None:
    for key, value in (headers or {}).items():
        if key.lower() == "date":
            try:
                return parsedate_to_datetime(str(value)).astimezone(UTC)
            except (TypeError, ValueError):
                return None
    return None


def _post(gh: github.Github, url: str, body: dict[str, Any], clock: Clock,
          poll: PollConfig) -> tuple[int, dict[str, Any] | None, datetime, str | None]:
    """POST once. Returns (status, data, since, ambiguity); raises on a definitive rejection."""

    before = clock.now()
    try:
        headers, data = gh.requester.requestJsonAndCheck("POST", url, input=body)
    except GithubException as exc:
        transient = classify(exc)
        since = before - timedelta(seconds=poll.skew_s)
        if transient is not None and transient.rate_limited:
            raise InfrastructureError(
                f"dispatch to {url} was rate limited ({transient.reason}); it was not processed and not retried"
            ) from None
        if transient is not None:
            return exc.status, None, since, transient.reason
        raise
    except Exception as exc:
        transient = classify(exc)
        if transient is None:
            raise
        return 0, None, before - timedelta(seconds=poll.skew_s), transient.reason
    server = _server_time(headers)
    start = min(before, server) if server else before
    return 200, data if isinstance(data, dict) else None, start - timedelta(seconds=poll.skew_s), None


def _lookup(gh: github.Github, repo: str, workflow_file: str) -> tuple[Any, Any]:
    """The infra repository and its workflow ``.github/workflows/<workflow_file>``, checked."""

    what = f"repository {repo}"
    try:
        repository = gh.get_repo(repo)
        what = f"workflow {workflow_file!r} in {repo}"
        wf = repository.get_workflow(workflow_file)
        path, state, wf_id = wf.path, wf.state, wf.id
    except UnknownObjectException:
        raise CheckFailed(f"{what} not found (or the token cannot see it)") from None
    except BadCredentialsException:
        raise CheckFailed(f"reading {what}: GitHub answered HTTP 401 (bad credentials: check the token)") from None
    except GithubException as exc:
        raise InfrastructureError(f"reading {what}: GitHub answered HTTP {exc.status}") from None
    except requests.exceptions.RequestException as exc:
        # ConnectionError: nothing answered; RetryError/Timeout: it answered 5xx or too slowly, retries spent.
        how = "unreachable" if isinstance(exc, requests.exceptions.ConnectionError) else "failed"
        raise InfrastructureError(f"reading {what}: GitHub API {how} ({type(exc).__name__})") from None
    expected = WORKFLOWS_DIR + workflow_file
    if path != expected or not isinstance(wf_id, int):
        raise CheckFailed(f"GitHub answered workflow {wf_id!r} at {path!r} for {workflow_file!r}; expected {expected!r}")
    if state != "active":
        raise CheckFailed(f"workflow {expected} in {repo} is {state!r}, not 'active': a dispatch would start no run")
    return repository, wf


def _check_arguments(repo: str, workflow: str | None, workflow_file: str, workflow_dispatch: bool,
                     event_type: str, timeout_s: float) -> tuple[str, bool]:
    """The arguments, checked before GitHub is asked anything: (workflow_file, workflow_dispatch)."""
    if workflow is not None:
        validate_workflow_file(workflow, "workflow")
        if workflow_file not in (DEFAULT_WORKFLOW_FILE, workflow):
            raise ValidationError("workflow", f"names {workflow!r} but workflow_file is {workflow_file!r}", workflow)
        workflow_file, workflow_dispatch = workflow, True
    validate_workflow_file(workflow_file)
    validate_repository(repo)
    if not EVENT_TYPE_RE.match(event_type):
        raise ValidationError("event_type", "must be 1-100 characters of [A-Za-z0-9._-]", event_type)
    if timeout_s <= 0:
        raise ValidationError("timeout", "must be positive", timeout_s)
    return workflow_file, workflow_dispatch


def _name_and_branch(repository: Any) -> tuple[str, str]:
    """The repository's full name and default branch (the ref a workflow_dispatch names), never ``str(None)``."""
    full_name, branch = str(repository.full_name), repository.default_branch
    if not isinstance(branch, str) or not branch:
        # Never str(None): a workflow_dispatch to ref "None" would be refused by GitHub, or worse, name a branch.
        raise CheckFailed(f"GitHub answered repository {full_name} without a default branch ({branch!r}); "
                          "workflow_dispatch needs the ref its workflow runs at")
    return full_name, branch


def _send(gh: github.Github, full_name: str, branch: str, wf: Any, payload: DispatchPayload, *,
          workflow_dispatch: bool, event_type: str, clock: Clock,
          poll: PollConfig) -> tuple[str, int | None, datetime, str | None]:
    """The one dispatch POST: (mode, the run id GitHub returned if any, since, ambiguity)."""
    mode = "workflow_dispatch" if workflow_dispatch else "repository_dispatch"
    run_id: int | None = None
    try:
        if not workflow_dispatch:
            body: dict[str, Any] = {"event_type": event_type, "client_payload": client_payload(payload)}
            _, _, since, ambiguous = _post(gh, f"/repos/{full_name}/dispatches", body, clock, poll)
        else:
            url = f"/repos/{full_name}/actions/workflows/{wf.id}/dispatches"
            body = {"ref": branch, "inputs": workflow_inputs(payload), "return_run_details": True}
            try:
                _, data, since, ambiguous = _post(gh, url, body, clock, poll)
            except GithubException as exc:
                if exc.status not in (400, 422):
                    raise
                # Rejected before anything ran (older GHES does not know the
                # field): safe to send once more without it.
                body.pop("return_run_details")
                mode = "workflow_dispatch+run-name"
                _, data, since, ambiguous = _post(gh, url, body, clock, poll)
            if data and "workflow_run_id" in data:
                returned = data["workflow_run_id"]
                if not isinstance(returned, int) or isinstance(returned, bool):
                    raise CheckFailed(f"dispatch to {full_name} returned workflow_run_id {returned!r}, not a run id")
                run_id = returned
    except GithubException as exc:
        raise CheckFailed(f"dispatch to {full_name} rejected: {describe_failure(exc)}") from None
    return mode, run_id, since, ambiguous


def dispatch_and_wait(
    gh: github.Github,
    repo: str,
    payload: DispatchPayload,
    *,
    workflow: str | None = None,
    workflow_file: str = DEFAULT_WORKFLOW_FILE,
    workflow_dispatch: bool = False,
    event_type: str = DEFAULT_EVENT_TYPE,
    timeout_s: float = 3600.0,
    poll: PollConfig | None = None,
    clock: Clock | None = None,
    progress: WaitReporter | None = None,
) -> DispatchResult:
    """Dispatch once, find exactly one run of ``workflow_file``, wait for it; CheckFailed unless it
    concludes ``success``.

    ``workflow_dispatch=True`` dispatches the workflow directly; otherwise a repository_dispatch
    is sent and only ``workflow_file``'s runs count. ``workflow=FILE`` is the older spelling of
    ``workflow_file=FILE, workflow_dispatch=True``. ``progress`` (default: ``current_reporter()``) hears
    what the wait waits for: the run's discovery, then the run until it completes.
    """

    poll = poll or PollConfig()
    clock = clock or SystemClock()
    workflow_file, workflow_dispatch = _check_arguments(repo, workflow, workflow_file, workflow_dispatch,
                                                        event_type, timeout_s)
    correlation = payload.correlation_id  # the model checked it
    deadline = clock.now() + timedelta(seconds=timeout_s)
    repository, wf = _lookup(gh, repo, workflow_file)
    full_name, branch = _name_and_branch(repository)

    mode, run_id, since, ambiguous = _send(gh, full_name, branch, wf, payload, workflow_dispatch=workflow_dispatch,
                                           event_type=event_type, clock=clock, poll=poll)
    target = Target(full_name, wf.id, WORKFLOWS_DIR + workflow_file, mode.partition("+")[0], branch, correlation)
    correlator = Correlator(gh, target, since=since, poll=poll, clock=clock,
                            progress=progress if progress is not None else current_reporter())
    if run_id is not None:
        correlator.verify_returned(run_id)
    try:
        state = correlator.wait(deadline, expected_id=run_id)
    except CheckFailed as exc:
        if ambiguous:
            raise CheckFailed(f"{exc} (the dispatch itself answered {ambiguous}; it was not re-sent, "
                              "to avoid a duplicate benchmark)") from None
        raise
    return _conclude(state, correlation, mode, target.workflow_path)


class RunConcluded(CheckFailed):
    """The correlated infra run ended, but not in success: the caller still learns which run it was
    (``dispatch --json`` names it, so the release workflow can say why it holds the release back)."""

    def __init__(self, state: WorkflowRunState) -> None:
        super().__init__(f"workflow run {state.run_id} ({state.html_url}) concluded {state.conclusion!r}, not 'success'")
        self.run_id, self.html_url, self.conclusion = state.run_id, state.html_url, state.conclusion


def _conclude(state: WorkflowRunState, correlation: str, mode: str, workflow_path: str) -> DispatchResult:
    if state.conclusion != "success":
        raise RunConcluded(state)
    return DispatchResult(state.run_id, state.html_url, state.conclusion, correlation, mode, workflow_path)
