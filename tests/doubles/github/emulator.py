"""A stateful GitHub (Enterprise layout) emulator served over real HTTP.

``GitHubEmulator`` listens on 127.0.0.1 (ephemeral port) with the REST API at
``/api/v3`` and uploads at ``/api/uploads``, so PyGithub, unmodified, talks to
it exactly as to GitHub Enterprise. Every request and response is checked
against GitHub's OpenAPI description (``validation.py``); violations are
recorded in ``violations`` and the pytest fixture fails the test.

Tests drive it two ways: through the API (the code under test) and through
direct state methods (``add_repo``, ``add_commit``, ``add_tag``,
``create_run``, ``set_run``, ``inject_fault`` ...). ``on_dispatch`` simulates
Actions: each accepted dispatch creates a run titled from the workflow's
``run-name`` and hands a ``RunHandle`` to the callback in a background thread.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any, Protocol
from urllib.parse import urlencode

from werkzeug.datastructures import Headers
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from tests.doubles.github.actions import WorkflowSpec, render_run_name
from tests.doubles.github.clock import SystemClock
from tests.doubles.github.validation import SpecValidator, Violation

API_PREFIX = "/api/v3"
UPLOADS_PREFIX = "/api/uploads"
DOCS_URL = "https://docs.github.com/rest"
SECONDARY_RATE_LIMIT_MESSAGE = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. "
    "If you reach out to GitHub Support for help, please include the request ID."
)
IMMUTABLE_UPLOAD_MESSAGE = "Cannot upload assets to an immutable release."
# GitHub's exact wording for deletion is not recorded anywhere we could check;
# the status (422) matches the upload refusal. Documented in docs/github.md.
IMMUTABLE_DELETE_MESSAGE = "Cannot delete assets from an immutable release."
GHES_RETURN_RUN_DETAILS_MESSAGE = 'Invalid request.\n\n"return_run_details" is not a permitted key.'


class Clock(Protocol):
    def now(self) -> datetime: ...


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _sha(*parts: object) -> str:
    return hashlib.sha1("\0".join(str(p) for p in parts).encode(), usedforsecurity=False).hexdigest()


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args: Any, **kwargs: Any) -> None:  # tests read emulator.requests instead
        pass


class HttpError(Exception):
    def __init__(self, status: int, message: str, errors: list[dict[str, Any]] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors
        self.headers = dict(headers or {})


# --- state ------------------------------------------------------------------------

@dataclass
class Commit:
    sha: str
    message: str
    parents: list[str]
    date: datetime


@dataclass
class TagObject:
    sha: str
    tag: str
    message: str
    object_sha: str
    object_type: str  # "commit" | "tag"
    date: datetime


@dataclass
class Asset:
    id: int
    name: str
    label: str
    content_type: str
    data: bytes
    created_at: datetime
    updated_at: datetime

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()


@dataclass
class Release:
    id: int
    tag_name: str
    target_commitish: str
    name: str | None
    body: str | None
    draft: bool
    prerelease: bool
    created_at: datetime
    published_at: datetime | None
    updated_at: datetime
    immutable: bool = False
    assets: list[Asset] = field(default_factory=list)


@dataclass
class Workflow:
    id: int
    path: str
    name: str
    spec: WorkflowSpec | None
    created_at: datetime
    render: Callable[[Mapping[str, Any]], str] | None = None


@dataclass
class Run:
    id: int
    workflow_id: int
    run_number: int
    display_title: str
    event: str
    status: str
    conclusion: str | None
    head_sha: str
    head_branch: str | None
    path: str
    created_at: datetime
    updated_at: datetime
    run_attempt: int = 1
    visible_at: datetime | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    head_repository: str | None = None  # another emulated repository (a fork); None: the run's own


@dataclass
class CheckRun:
    id: int
    name: str
    head_sha: str
    status: str
    conclusion: str | None
    external_id: str | None
    details_url: str | None
    started_at: datetime | None
    completed_at: datetime | None
    output: dict[str, Any] = field(default_factory=dict)


@dataclass
class SelfHostedRunner:
    id: int
    name: str
    labels: tuple[str, ...]  # custom labels; self-hosted, Linux, X64 are added as GitHub does
    status: str = "online"  # online | offline


@dataclass
class Repo:
    id: int
    owner: str
    name: str
    default_branch: str
    created_at: datetime
    immutable_releases: bool = False
    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, tuple[str, str]] = field(default_factory=dict)  # "refs/tags/v1" -> (type, sha)
    tags: dict[str, TagObject] = field(default_factory=dict)
    releases: dict[int, Release] = field(default_factory=dict)
    immutable_tags: set[str] = field(default_factory=set)
    workflows: dict[int, Workflow] = field(default_factory=dict)
    runs: dict[int, Run] = field(default_factory=dict)
    check_runs: dict[int, CheckRun] = field(default_factory=dict)
    # Actions settings: variables (name -> value), secret names (GitHub never returns a value),
    # self-hosted runners (set_variable, set_secret, add_runner).
    variables: dict[str, tuple[str, datetime]] = field(default_factory=dict)
    secrets: dict[str, datetime] = field(default_factory=dict)
    runners: list[SelfHostedRunner] = field(default_factory=list)

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


@dataclass(frozen=True)
class DispatchEvent:
    """What a dispatch delivered; passed to ``on_dispatch`` callbacks."""

    kind: str  # "repository_dispatch" | "workflow_dispatch"
    repo: str
    workflow_path: str
    event_type: str | None
    client_payload: Mapping[str, Any] | None
    inputs: Mapping[str, Any] | None
    ref: str | None

    def benchseal_payload(self) -> Mapping[str, Any] | None:
        """The ``benchseal.dispatch/v1`` payload, whichever way it travelled
        (client_payload, or the ``payload`` input of a workflow_dispatch)."""
        if self.client_payload is not None:
            return self.client_payload
        raw = (self.inputs or {}).get("payload")
        if isinstance(raw, str):
            data = json.loads(raw)
            return data if isinstance(data, dict) else None
        return None


@dataclass
class Fault:
    operation: str
    responses: list[tuple[int, dict[str, str], str]]
    delay: float = 0.0
    after: bool = False  # handle the request, then answer with the fault (a lost response)


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    operation: str
    status: int
    at: datetime
    size: int = 0  # bytes of the response body the emulator sent


class RunHandle:
    """Lets a dispatch callback (or a test) move a run through its life."""

    def __init__(self, emulator: GitHubEmulator, repo: str, run_id: int, event: DispatchEvent | None) -> None:
        self._emulator = emulator
        self.repo = repo
        self.run_id = run_id
        self.event = event

    @property
    def payload(self) -> Mapping[str, Any]:
        if self.event is None:
            return {}
        return self.event.client_payload or self.event.inputs or {}

    def start(self) -> None:
        self._emulator.set_run(self.repo, self.run_id, status="in_progress")

    def complete(self, conclusion: str = "success") -> None:
        self._emulator.set_run(self.repo, self.run_id, status="completed", conclusion=conclusion)

    def set(self, **changes: Any) -> None:
        self._emulator.set_run(self.repo, self.run_id, **changes)

    @property
    def run(self) -> Run:
        return self._emulator.get_run(self.repo, self.run_id)


DispatchCallback = Callable[[RunHandle, DispatchEvent], None]


# --- routing ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Route:
    method: str
    regex: re.Pattern[str]
    spec_path: str
    operation: str
    handler: str
    uploads: bool = False


def _route(method: str, spec_path: str, operation: str, handler: str, uploads: bool = False,
           multi: tuple[str, ...] = ()) -> _Route:
    def group(m: re.Match[str]) -> str:
        name = m.group(1)
        return f"(?P<{name}>.+)" if name in multi else f"(?P<{name}>[^/]+)"

    pattern = re.sub(r"\{([a-z_]+)\}", group, spec_path)
    return _Route(method, re.compile(rf"\A{pattern}\Z"), spec_path, operation, handler, uploads)


R = "/repos/{owner}/{repo}"
ROUTES: tuple[_Route, ...] = (
    _route("GET", "/rate_limit", "rate-limit/get", "rate_limit"),
    _route("GET", R, "repos/get", "get_repo"),
    _route("GET", R + "/releases", "repos/list-releases", "list_releases"),
    _route("POST", R + "/releases", "repos/create-release", "create_release"),
    _route("GET", R + "/releases/latest", "repos/get-latest-release", "latest_release"),
    _route("GET", R + "/releases/tags/{tag}", "repos/get-release-by-tag", "release_by_tag", multi=("tag",)),
    _route("GET", R + "/releases/assets/{asset_id}", "repos/get-release-asset", "get_asset"),
    _route("DELETE", R + "/releases/assets/{asset_id}", "repos/delete-release-asset", "delete_asset"),
    _route("GET", R + "/releases/{release_id}", "repos/get-release", "get_release"),
    _route("PATCH", R + "/releases/{release_id}", "repos/update-release", "update_release"),
    _route("DELETE", R + "/releases/{release_id}", "repos/delete-release", "delete_release"),
    _route("GET", R + "/releases/{release_id}/assets", "repos/list-release-assets", "list_assets"),
    _route("POST", R + "/releases/{release_id}/assets", "repos/upload-release-asset", "upload_asset",
           uploads=True),
    _route("POST", R + "/dispatches", "repos/create-dispatch-event", "repository_dispatch"),
    _route("GET", R + "/actions/workflows", "actions/list-repo-workflows", "list_workflows"),
    _route("GET", R + "/actions/workflows/{workflow_id}", "actions/get-workflow", "get_workflow"),
    _route("POST", R + "/actions/workflows/{workflow_id}/dispatches", "actions/create-workflow-dispatch",
           "workflow_dispatch"),
    _route("GET", R + "/actions/workflows/{workflow_id}/runs", "actions/list-workflow-runs", "list_workflow_runs"),
    _route("GET", R + "/actions/runs", "actions/list-workflow-runs-for-repo", "list_repo_runs"),
    _route("GET", R + "/actions/runs/{run_id}", "actions/get-workflow-run", "get_run_api"),
    _route("GET", R + "/git/ref/{ref}", "git/get-ref", "get_ref", multi=("ref",)),
    _route("GET", R + "/git/matching-refs/{ref}", "git/list-matching-refs", "matching_refs", multi=("ref",)),
    _route("GET", R + "/git/tags/{tag_sha}", "git/get-tag", "get_tag"),
    _route("GET", R + "/commits/{ref}", "repos/get-commit", "get_commit", multi=("ref",)),
    _route("POST", R + "/check-runs", "checks/create", "create_check_run"),
    _route("GET", R + "/check-runs/{check_run_id}", "checks/get", "get_check_run"),
    _route("GET", R + "/actions/variables", "actions/list-repo-variables", "list_variables"),
    _route("GET", R + "/actions/secrets", "actions/list-repo-secrets", "list_secrets"),
    _route("GET", R + "/actions/runners", "actions/list-self-hosted-runners-for-repo", "list_runners"),
    _route("PATCH", R + "/check-runs/{check_run_id}", "checks/update", "update_check_run"),
)


# What a fine-grained token (or a job's GITHUB_TOKEN) needs for each operation, as GitHub's
# "Permissions required for fine-grained personal access tokens" lists it. None: no
# repository permission. Metadata: read is always granted (GitHub makes it mandatory).
OPERATION_PERMISSIONS: dict[str, tuple[str, str] | None] = {
    "rate-limit/get": None,
    "repos/get": ("metadata", "read"),
    "repos/list-releases": ("contents", "read"),
    "repos/create-release": ("contents", "write"),
    "repos/get-latest-release": ("contents", "read"),
    "repos/get-release-by-tag": ("contents", "read"),
    "repos/get-release-asset": ("contents", "read"),
    "repos/delete-release-asset": ("contents", "write"),
    "repos/get-release": ("contents", "read"),
    "repos/update-release": ("contents", "write"),
    "repos/delete-release": ("contents", "write"),
    "repos/list-release-assets": ("contents", "read"),
    "repos/upload-release-asset": ("contents", "write"),
    "repos/create-dispatch-event": ("contents", "write"),
    "actions/list-repo-workflows": ("actions", "read"),
    "actions/get-workflow": ("actions", "read"),
    "actions/create-workflow-dispatch": ("actions", "write"),
    "actions/list-workflow-runs": ("actions", "read"),
    "actions/list-workflow-runs-for-repo": ("actions", "read"),
    "actions/get-workflow-run": ("actions", "read"),
    "git/get-ref": ("contents", "read"),
    "git/list-matching-refs": ("contents", "read"),
    "git/get-tag": ("contents", "read"),
    "repos/get-commit": ("contents", "read"),
    "checks/create": ("checks", "write"),
    "checks/get": ("checks", "read"),
    "checks/update": ("checks", "write"),
    "actions/list-repo-variables": ("variables", "read"),
    "actions/list-repo-secrets": ("secrets", "read"),
    "actions/list-self-hosted-runners-for-repo": ("administration", "read"),
}
PERMISSION_NAMES = frozenset({"actions", "checks", "contents", "metadata", "packages", "pull-requests",
                              "statuses", "id-token", "attestations", "deployments", "issues",
                              "variables", "secrets", "administration"})
TOKEN_KINDS = {"fine-grained": "personal access token", "github-token": "integration"}


@dataclass(frozen=True)
class TokenGrant:
    """What one token may do: ``permissions`` (name -> read|write) on ``repositories``."""

    kind: str  # "fine-grained" | "github-token" | "full"
    repositories: frozenset[str]  # lowercased OWNER/NAME; empty for "full"
    permissions: Mapping[str, str]

    def allows(self, repo: str | None, needed: tuple[str, str] | None) -> tuple[int, str] | None:
        """None when allowed; else (status, message) as GitHub answers."""
        if self.kind == "full":
            return None
        if repo is not None and repo.lower() not in self.repositories:
            return 404, "Not Found"  # a token never sees a repository it was not given
        if needed is None:
            return None
        name, level = needed
        have = "read" if name == "metadata" else self.permissions.get(name)
        if have == "write" or (have == "read" and level == "read"):
            return None
        return 403, f"Resource not accessible by {TOKEN_KINDS[self.kind]}"


class _Ctx:
    """Per-request data handed to a handler."""

    def __init__(self, request: Request, params: dict[str, str], origin: str) -> None:
        self.request = request
        self.params = params
        self.origin = origin
        self.status = 200
        self.headers: dict[str, str] = {}

    def json(self) -> dict[str, Any]:
        try:
            data = json.loads(self.request.get_data() or b"{}")
        except ValueError:
            raise HttpError(400, "Problems parsing JSON") from None
        if not isinstance(data, dict):
            raise HttpError(400, "Problems parsing JSON")
        return data

    def arg_int(self, name: str, default: int) -> int:
        raw = self.request.args.get(name)
        if raw is None or raw == "":
            return default
        try:
            return int(raw)
        except ValueError:
            raise HttpError(422, f"Invalid value for {name}") from None


class GitHubEmulator:
    """See the module docstring. Use as a context manager or call start()/stop()."""

    def __init__(self, *, clock: Clock | None = None, token: str | None = None, validate: bool = True,
                 owner_login: str = "benchseal-bot") -> None:
        self.clock: Clock = clock or SystemClock()
        self.token = token or "ghs_" + secrets.token_hex(18)
        # Further tokens with limited permissions (add_token); self.token may do everything.
        self._grants: dict[str, TokenGrant] = {self.token: TokenGrant("full", frozenset(), {})}
        self.login = owner_login
        self.violations: list[Violation] = []
        self.requests: list[RequestRecord] = []
        self.rate_limit = 5000
        self.rate_used = 0
        self.reject_return_run_details = False  # GHES versions that predate the field
        self.dispatch_copies = 1  # >1 simulates GitHub delivering one event several times
        self.run_appearance_delay = timedelta(0)  # runs exist but are not listed until then
        # Per workflow path (".github/workflows/x.yml"), overriding run_appearance_delay.
        self.workflow_appearance_delay: dict[str, timedelta] = {}
        # A hostile or broken GitHub: the run id a workflow_dispatch with
        # return_run_details answers, as a function of the run it really started.
        self.return_run_details_id: Callable[[Run], int] | None = None
        self._validator = SpecValidator() if validate else None
        self._lock = threading.RLock()
        self._ids = itertools.count(1000)
        self._repos: dict[str, Repo] = {}
        self._faults: list[Fault] = []
        self._callbacks: list[DispatchCallback] = []
        self._threads: list[threading.Thread] = []
        self._server: BaseWSGIServer | None = None
        self._serve_thread: threading.Thread | None = None
        self.callback_errors: list[BaseException] = []
        # A classic token's scopes, sent as X-OAuth-Scopes on every answer when set (GitHub sends
        # the header for classic tokens only; fine-grained and job tokens get none).
        self.oauth_scopes: str | None = None

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> GitHubEmulator:
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True, request_handler=_QuietHandler)
        self._server.daemon_threads = True  # type: ignore[attr-defined]
        self._serve_thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                              name="github-emulator", daemon=True)
        self._serve_thread.start()
        return self

    def stop(self) -> None:
        self.wait_callbacks(timeout=5)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> GitHubEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def origin(self) -> str:
        if self._server is None:
            raise RuntimeError("emulator not started")
        return f"http://127.0.0.1:{self._server.server_port}"

    @property
    def base_url(self) -> str:
        return self.origin + API_PREFIX

    def wait_callbacks(self, timeout: float = 10.0) -> None:
        """Join dispatch callback threads (so a test sees their effects)."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))

    # --- direct state manipulation (tests) --------------------------------------------

    def _next_id(self) -> int:
        return next(self._ids)

    def add_token(self, repositories: list[str] | tuple[str, ...], permissions: Mapping[str, str], *,
                  kind: str = "fine-grained") -> str:
        """A new token limited to ``permissions`` (e.g. ``{"actions": "write"}``) on ``repositories``.

        ``kind``: "fine-grained" (a fine-grained personal access token; 403 "Resource not accessible
        by personal access token") or "github-token" (a job's GITHUB_TOKEN; "... by integration").
        Metadata: read is implied. A repository not listed answers 404, as GitHub does.
        """
        if kind not in TOKEN_KINDS:
            raise ValueError(f"token kind must be one of {sorted(TOKEN_KINDS)}, got {kind!r}")
        if not repositories:
            raise ValueError("a limited token names at least one repository")
        for name, level in permissions.items():
            if name not in PERMISSION_NAMES or level not in ("read", "write"):
                raise ValueError(f"permission {name}: {level} is not a repository permission read|write")
        prefix = "github_pat_" if kind == "fine-grained" else "ghs_"
        token = prefix + secrets.token_hex(20)
        with self._lock:
            self._grants[token] = TokenGrant(kind, frozenset(r.lower() for r in repositories), dict(permissions))
        return token

    def add_repo(self, full_name: str, *, default_branch: str = "main", immutable_releases: bool = False) -> Repo:
        owner, _, name = full_name.partition("/")
        with self._lock:
            repo = Repo(self._next_id(), owner, name, default_branch, self.clock.now(),
                        immutable_releases=immutable_releases)
            self._repos[full_name.lower()] = repo
            self.add_commit(full_name, "initial commit", branch=default_branch)
            return repo

    def repo(self, full_name: str) -> Repo:
        try:
            return self._repos[full_name.lower()]
        except KeyError:
            raise KeyError(f"emulator has no repository {full_name}") from None

    def set_immutable_releases(self, full_name: str, enabled: bool = True) -> None:
        with self._lock:
            self.repo(full_name).immutable_releases = enabled

    def add_commit(self, full_name: str, message: str = "commit", *, branch: str | None = None,
                   parents: list[str] | None = None) -> str:
        with self._lock:
            repo = self.repo(full_name)
            branch = branch or repo.default_branch
            head = repo.refs.get(f"refs/heads/{branch}")
            parent_list = parents if parents is not None else ([head[1]] if head else [])
            sha = _sha("commit", repo.full_name, message, parent_list, self._next_id())
            repo.commits[sha] = Commit(sha, message, parent_list, self.clock.now())
            repo.refs[f"refs/heads/{branch}"] = ("commit", sha)
            return sha

    def head(self, full_name: str, branch: str | None = None) -> str:
        repo = self.repo(full_name)
        return repo.refs[f"refs/heads/{branch or repo.default_branch}"][1]

    def add_tag(self, full_name: str, name: str, target: str | None = None, *, annotated: bool = False,
                message: str | None = None, target_type: str = "commit") -> str:
        """Create ``refs/tags/<name>``. Annotated: a tag object pointing at ``target``
        (a commit, or with ``target_type="tag"`` another tag object); returns the ref's sha."""
        with self._lock:
            repo = self.repo(full_name)
            target = target or self.head(full_name)
            if annotated:
                sha = self.add_tag_object(full_name, name, target, target_type=target_type, message=message)
                repo.refs[f"refs/tags/{name}"] = ("tag", sha)
                return sha
            repo.refs[f"refs/tags/{name}"] = ("commit", target)
            return target

    def add_tag_object(self, full_name: str, tag: str, target: str, *, target_type: str = "commit",
                       message: str | None = None) -> str:
        with self._lock:
            repo = self.repo(full_name)
            sha = _sha("tag", repo.full_name, tag, target, self._next_id())
            repo.tags[sha] = TagObject(sha, tag, message or f"release {tag}", target, target_type, self.clock.now())
            return sha

    def set_ref(self, full_name: str, ref: str, sha: str, object_type: str = "commit") -> None:
        with self._lock:
            self.repo(full_name).refs[ref] = (object_type, sha)

    def add_workflow(self, full_name: str, path: str, text: str | None = None, *, name: str | None = None,
                     render: Callable[[Mapping[str, Any]], str] | None = None) -> Workflow:
        """Register a workflow file. ``text`` is its YAML (run-name and triggers are read
        from it); ``render`` overrides run-name rendering with a function of the context."""
        with self._lock:
            repo = self.repo(full_name)
            spec = WorkflowSpec.parse(path, text) if text is not None else None
            wf = Workflow(self._next_id(), path, name or (spec.name if spec else path.rsplit("/", 1)[-1]), spec,
                          self.clock.now(), render)
            repo.workflows[wf.id] = wf
            return wf

    def set_variable(self, full_name: str, name: str, value: str) -> None:
        with self._lock:
            self.repo(full_name).variables[name.upper()] = (value, self.clock.now())

    def set_secret(self, full_name: str, name: str) -> None:
        """A repository secret; only its name is ever listed, so no value is kept."""
        with self._lock:
            self.repo(full_name).secrets[name.upper()] = self.clock.now()

    def add_runner(self, full_name: str, name: str, labels: tuple[str, ...] = (), *,
                   status: str = "online") -> SelfHostedRunner:
        with self._lock:
            runner = SelfHostedRunner(self._next_id(), name, tuple(labels), status)
            self.repo(full_name).runners.append(runner)
            return runner

    def on_dispatch(self, callback: DispatchCallback) -> None:
        self._callbacks.append(callback)

    def create_run(self, full_name: str, *, display_title: str, workflow: str | None = None,
                   event: str = "repository_dispatch", status: str = "queued", conclusion: str | None = None,
                   head_sha: str | None = None, created_at: datetime | None = None, run_attempt: int = 1,
                   visible_at: datetime | None = None, payload: Mapping[str, Any] | None = None) -> Run:
        with self._lock:
            repo = self.repo(full_name)
            wf = self._find_workflow(repo, workflow) if workflow else None
            if wf is None:
                wf = next(iter(repo.workflows.values()), None) or self.add_workflow(
                    full_name, ".github/workflows/ci.yml", name="CI")
            now = created_at or self.clock.now()
            run_id = self._next_id()
            run = Run(
                id=run_id, workflow_id=wf.id,
                run_number=1 + sum(1 for r in repo.runs.values() if r.workflow_id == wf.id),
                display_title=display_title, event=event, status=status, conclusion=conclusion,
                head_sha=head_sha or self.head(full_name), head_branch=repo.default_branch, path=wf.path,
                created_at=now, updated_at=now, run_attempt=run_attempt, visible_at=visible_at,
                payload=dict(payload or {}),
            )
            repo.runs[run_id] = run
            return run

    def set_run(self, full_name: str, run_id: int, **changes: Any) -> Run:
        with self._lock:
            run = self.repo(full_name).runs[run_id]
            for key, value in changes.items():
                if not hasattr(run, key):
                    raise AttributeError(f"runs have no field {key!r}")
                setattr(run, key, value)
            run.updated_at = self.clock.now()
            return run

    def get_run(self, full_name: str, run_id: int) -> Run:
        with self._lock:
            return self.repo(full_name).runs[run_id]

    def runs(self, full_name: str) -> list[Run]:
        with self._lock:
            return sorted(self.repo(full_name).runs.values(), key=lambda r: r.id)

    def release(self, full_name: str, tag: str) -> Release | None:
        with self._lock:
            return next((r for r in self.repo(full_name).releases.values() if r.tag_name == tag), None)

    def inject_fault(self, operation: str, statuses: list[int | tuple[int, Mapping[str, str]]] | None = None, *,
                     delay: float = 0.0, message: str | None = None, after: bool = False) -> None:
        """Answer the next requests to ``operation`` (an operationId such as
        ``actions/list-workflow-runs-for-repo``) with ``statuses`` in order, each
        ``status`` or ``(status, extra headers)``; ``delay`` seconds (real time) first.
        ``after=True``: the request takes effect, only its response is replaced
        (GitHub did the work but the answer was lost)."""
        responses = []
        for item in statuses or []:
            status, headers = (item, {}) if isinstance(item, int) else (item[0], dict(item[1]))
            responses.append((status, headers, message or _default_message(status)))
        with self._lock:
            self._faults.append(Fault(operation, responses, delay, after))

    def secondary_rate_limit(self, operation: str, count: int = 1, *, status: int = 403,
                             retry_after: int = 60) -> None:
        """The next ``count`` requests to ``operation`` hit GitHub's secondary rate limit."""
        headers = {"retry-after": str(retry_after), "x-ratelimit-remaining": str(max(0, self.rate_limit - 1))}
        self.inject_fault(operation, [(status, headers)] * count, message=SECONDARY_RATE_LIMIT_MESSAGE)

    def count(self, operation: str | None = None, method: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.requests
                       if (operation is None or r.operation == operation) and (method is None or r.method == method))

    # --- WSGI -----------------------------------------------------------------------

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        response = self._handle(request)
        return response(environ, start_response)

    def _handle(self, request: Request) -> Response:
        path = request.path
        origin = self.origin
        download = re.match(r"\A/(?P<owner>[^/]+)/(?P<repo>[^/]+)/releases/download/(?P<tag>.+)/(?P<name>[^/]+)\Z",
                            path)
        if download and request.method == "GET":
            return self._download(download.groupdict())
        storage = re.match(r"\A/api/storage/assets/(?P<asset_id>[0-9]+)\Z", path)
        if storage and request.method == "GET":
            return self._download_by_id(storage.group("asset_id"))
        prefix = UPLOADS_PREFIX if path.startswith(UPLOADS_PREFIX + "/") else API_PREFIX
        if not path.startswith(prefix + "/") and path != prefix:
            return self._json_response(404, {"message": "Not Found", "documentation_url": DOCS_URL})
        api_path = path[len(prefix):] or "/"
        for route in ROUTES:
            if route.method != request.method or route.uploads != (prefix == UPLOADS_PREFIX):
                continue
            m = route.regex.match(api_path)
            if m:
                return self._dispatch_route(route, m.groupdict(), request, origin)
        with self._lock:
            self.violations.append(Violation("-", request.method, path, "unrouted",
                                             "no operation of the spec subset matches this request"))
            self.requests.append(RequestRecord(request.method, path, "-", 404, self.clock.now()))
        return self._json_response(404, {"message": "Not Found", "documentation_url": DOCS_URL})

    def _dispatch_route(self, route: _Route, params: dict[str, str], request: Request, origin: str) -> Response:
        ctx = _Ctx(request, params, origin)
        body: object
        with self._lock:
            fault = next((f for f in self._faults if f.operation == route.operation and f.responses), None)
            planned = fault.responses.pop(0) if fault else None
            delay = fault.delay if fault else 0.0
            after = fault.after if fault else False
        if delay:
            time.sleep(delay)
        if planned is not None and after and self._authorized(request) and self._denied(route, params, request) is None:
            try:
                with self._lock:
                    getattr(self, "_h_" + route.handler)(ctx)
            except HttpError:
                pass
            ctx = _Ctx(request, params, origin)
        denied = self._denied(route, params, request)
        if not self._authorized(request):
            status, body = 401, {"message": "Bad credentials", "documentation_url": DOCS_URL}
        elif denied is not None:
            status, body = denied[0], {"message": denied[1], "documentation_url": DOCS_URL, "status": str(denied[0])}
        elif planned is not None:
            status, extra, message = planned
            ctx.headers.update(extra)
            body = {"message": message, "documentation_url": DOCS_URL}
        else:
            try:
                with self._lock:
                    body = getattr(self, "_h_" + route.handler)(ctx)
                status = ctx.status
            except HttpError as exc:
                status = exc.status
                ctx.headers.update(exc.headers)
                err: dict[str, Any] = {"message": exc.message, "documentation_url": DOCS_URL}
                if exc.errors is not None:
                    err["errors"] = exc.errors
                body = err
        response = self._make_response(status, body, ctx.headers)
        with self._lock:
            self.rate_used += 1
            self.requests.append(RequestRecord(request.method, request.path, route.operation, status,
                                               self.clock.now(), len(response.get_data())))
        self._validate(route, params, request, response)
        return response

    def _grant(self, request: Request) -> TokenGrant | None:
        auth = request.headers.get("Authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() not in ("token", "bearer"):
            return None
        presented = value.strip().encode()
        with self._lock:
            grants = list(self._grants.items())
        found = None
        for token, grant in grants:  # compare with every token, in constant time each
            if secrets.compare_digest(presented, token.encode()):
                found = grant
        return found

    def _authorized(self, request: Request) -> bool:
        return self._grant(request) is not None

    def _denied(self, route: _Route, params: Mapping[str, str], request: Request) -> tuple[int, str] | None:
        """(status, message) when the token's permissions do not cover the operation, else None."""
        grant = self._grant(request)
        if grant is None:
            return None  # 401, decided by the caller
        if route.operation not in OPERATION_PERMISSIONS:
            raise RuntimeError(f"operation {route.operation} has no entry in OPERATION_PERMISSIONS")
        repo = f"{params['owner']}/{params['repo']}" if "owner" in params and "repo" in params else None
        return grant.allows(repo, OPERATION_PERMISSIONS[route.operation])

    def _rate_headers(self) -> dict[str, str]:
        now = self.clock.now()
        reset = int((now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)).timestamp())
        return {
            "x-ratelimit-limit": str(self.rate_limit),
            "x-ratelimit-remaining": str(max(0, self.rate_limit - self.rate_used - 1)),
            "x-ratelimit-used": str(self.rate_used + 1),
            "x-ratelimit-reset": str(reset),
            "x-ratelimit-resource": "core",
            "x-github-api-version-selected": "2022-11-28",
            "date": format_datetime(now.astimezone(UTC), usegmt=True),
        } | ({"x-oauth-scopes": self.oauth_scopes} if self.oauth_scopes is not None else {})

    def _make_response(self, status: int, body: object, extra: Mapping[str, str]) -> Response:
        headers = Headers(self._rate_headers())
        for key, value in extra.items():
            headers[key] = value
        if isinstance(body, Response):
            for key, value in headers.items():
                body.headers.setdefault(key, value)
            body.status_code = status
            return body
        if status in (204, 302) or body is None:
            return Response(b"", status=status, headers=headers)
        return Response(json.dumps(body).encode(), status=status, headers=headers, content_type="application/json; charset=utf-8")

    def _json_response(self, status: int, body: object) -> Response:
        return self._make_response(status, body, {})

    def _validate(self, route: _Route, params: dict[str, str], request: Request, response: Response) -> None:
        if self._validator is None:
            return
        ctype = response.headers.get("Content-Type", "")
        mimetype = ctype.split(";")[0].strip() if response.get_data() else ""
        found = self._validator.validate(
            operation=route.operation, method=request.method, path_pattern=route.spec_path, path_params=params,
            query=request.args, request_headers=request.headers,
            request_body=request.get_data() if request.method in ("POST", "PATCH", "PUT") else None,
            request_content_type=request.headers.get("Content-Type", "").lower(),
            status=response.status_code, response_headers=response.headers, response_body=response.get_data(),
            response_content_type=mimetype,
        )
        if found:
            with self._lock:
                self.violations.extend(found)

    # --- URL and object builders ---------------------------------------------------

    def _api(self, ctx: _Ctx) -> str:
        return ctx.origin + API_PREFIX

    def _user(self, ctx: _Ctx) -> dict[str, Any]:
        api = self._api(ctx)
        login = self.login
        base = f"{api}/users/{login}"
        return {
            "login": login, "id": 1, "node_id": "U_1", "avatar_url": f"{ctx.origin}/avatars/{login}",
            "gravatar_id": "", "url": base, "html_url": f"{ctx.origin}/{login}",
            "followers_url": f"{base}/followers", "following_url": f"{base}/following{{/other_user}}",
            "gists_url": f"{base}/gists{{/gist_id}}", "starred_url": f"{base}/starred{{/owner}}{{/repo}}",
            "subscriptions_url": f"{base}/subscriptions", "organizations_url": f"{base}/orgs",
            "repos_url": f"{base}/repos", "events_url": f"{base}/events{{/privacy}}",
            "received_events_url": f"{base}/received_events", "type": "User", "site_admin": False,
        }

    _REPO_URLS = (
        "archive_url:/{archive_format}{/ref}", "assignees_url:/assignees{/user}", "blobs_url:/git/blobs{/sha}",
        "branches_url:/branches{/branch}", "collaborators_url:/collaborators{/collaborator}",
        "comments_url:/comments{/number}", "commits_url:/commits{/sha}", "compare_url:/compare/{base}...{head}",
        "contents_url:/contents/{+path}", "contributors_url:/contributors", "deployments_url:/deployments",
        "downloads_url:/downloads", "events_url:/events", "forks_url:/forks", "git_commits_url:/git/commits{/sha}",
        "git_refs_url:/git/refs{/sha}", "git_tags_url:/git/tags{/sha}", "hooks_url:/hooks",
        "issue_comment_url:/issues/comments{/number}", "issue_events_url:/issues/events{/number}",
        "issues_url:/issues{/number}", "keys_url:/keys{/key_id}", "labels_url:/labels{/name}",
        "languages_url:/languages", "merges_url:/merges", "milestones_url:/milestones{/number}",
        "notifications_url:/notifications{?since,all,participating}", "pulls_url:/pulls{/number}",
        "releases_url:/releases{/id}", "stargazers_url:/stargazers", "statuses_url:/statuses/{sha}",
        "subscribers_url:/subscribers", "subscription_url:/subscription", "tags_url:/tags",
        "teams_url:/teams", "trees_url:/git/trees{/sha}",
    )

    def _repo_json(self, ctx: _Ctx, repo: Repo, full: bool) -> dict[str, Any]:
        url = f"{self._api(ctx)}/repos/{repo.full_name}"
        data: dict[str, Any] = {
            "id": repo.id, "node_id": f"R_{repo.id}", "name": repo.name, "full_name": repo.full_name,
            "owner": self._user(ctx), "private": True, "html_url": f"{ctx.origin}/{repo.full_name}",
            "description": None, "fork": False, "url": url,
        }
        for item in self._REPO_URLS:
            key, _, suffix = item.partition(":")
            data[key] = url + suffix
        if full:
            created = _iso(repo.created_at)
            data.update({
                "clone_url": f"{ctx.origin}/{repo.full_name}.git", "git_url": f"{ctx.origin}/{repo.full_name}.git",
                "ssh_url": f"git@127.0.0.1:{repo.full_name}.git", "svn_url": f"{ctx.origin}/{repo.full_name}",
                "mirror_url": None, "homepage": None, "language": "Python", "default_branch": repo.default_branch,
                "forks": 0, "forks_count": 0, "has_issues": True, "has_projects": False, "has_wiki": False,
                "has_pages": False, "has_discussions": False, "has_downloads": True, "archived": False,
                "disabled": False, "open_issues": 0, "open_issues_count": 0, "license": None,
                "pushed_at": created, "created_at": created, "updated_at": created, "size": 1,
                "stargazers_count": 0, "watchers": 0, "watchers_count": 0, "network_count": 0,
                "subscribers_count": 0, "visibility": "private",
            })
        return data

    def _commit_json(self, ctx: _Ctx, repo: Repo, commit: Commit) -> dict[str, Any]:
        url = f"{self._api(ctx)}/repos/{repo.full_name}/commits/{commit.sha}"
        person = {"name": "benchseal", "email": "bot@example.invalid", "date": _iso(commit.date)}
        return {
            "url": url, "sha": commit.sha, "node_id": f"C_{commit.sha[:12]}",
            "html_url": f"{ctx.origin}/{repo.full_name}/commit/{commit.sha}", "comments_url": url + "/comments",
            "commit": {
                "url": f"{self._api(ctx)}/repos/{repo.full_name}/git/commits/{commit.sha}",
                "author": person, "committer": person, "message": commit.message, "comment_count": 0,
                "tree": {"sha": _sha("tree", commit.sha),
                         "url": f"{self._api(ctx)}/repos/{repo.full_name}/git/trees/{_sha('tree', commit.sha)}"},
            },
            "author": self._user(ctx), "committer": self._user(ctx),
            "parents": [{"sha": p, "url": f"{self._api(ctx)}/repos/{repo.full_name}/commits/{p}"}
                        for p in commit.parents],
            "files": [],
        }

    def _asset_json(self, ctx: _Ctx, repo: Repo, release: Release, asset: Asset) -> dict[str, Any]:
        return {
            "url": f"{self._api(ctx)}/repos/{repo.full_name}/releases/assets/{asset.id}",
            "browser_download_url": f"{ctx.origin}/{repo.full_name}/releases/download/{release.tag_name}/{asset.name}",
            "id": asset.id, "node_id": f"RA_{asset.id}", "name": asset.name, "label": asset.label,
            "state": "uploaded", "content_type": asset.content_type, "size": len(asset.data),
            "digest": asset.digest, "download_count": 0, "created_at": _iso(asset.created_at),
            "updated_at": _iso(asset.updated_at), "uploader": self._user(ctx),
        }

    def _release_json(self, ctx: _Ctx, repo: Repo, release: Release) -> dict[str, Any]:
        url = f"{self._api(ctx)}/repos/{repo.full_name}/releases/{release.id}"
        html_tag = f"untagged-{release.id}" if release.draft else release.tag_name
        return {
            "url": url, "html_url": f"{ctx.origin}/{repo.full_name}/releases/tag/{html_tag}",
            "assets_url": url + "/assets",
            "upload_url": f"{ctx.origin}{UPLOADS_PREFIX}/repos/{repo.full_name}/releases/{release.id}/assets{{?name,label}}",
            "tarball_url": f"{self._api(ctx)}/repos/{repo.full_name}/tarball/{release.tag_name}",
            "zipball_url": f"{self._api(ctx)}/repos/{repo.full_name}/zipball/{release.tag_name}",
            "id": release.id, "node_id": f"RE_{release.id}", "tag_name": release.tag_name,
            "target_commitish": release.target_commitish, "name": release.name, "body": release.body,
            "draft": release.draft, "prerelease": release.prerelease, "immutable": release.immutable,
            "created_at": _iso(release.created_at),
            "published_at": _iso(release.published_at) if release.published_at else None,
            "updated_at": _iso(release.updated_at), "author": self._user(ctx),
            "assets": [self._asset_json(ctx, repo, release, a) for a in release.assets],
        }

    def _workflow_json(self, ctx: _Ctx, repo: Repo, wf: Workflow) -> dict[str, Any]:
        return {
            "id": wf.id, "node_id": f"W_{wf.id}", "name": wf.name, "path": wf.path, "state": "active",
            "created_at": _iso(wf.created_at), "updated_at": _iso(wf.created_at),
            "url": f"{self._api(ctx)}/repos/{repo.full_name}/actions/workflows/{wf.id}",
            "html_url": f"{ctx.origin}/{repo.full_name}/blob/{repo.default_branch}/{wf.path}",
            "badge_url": f"{ctx.origin}/{repo.full_name}/workflows/{wf.name}/badge.svg",
        }

    def _run_json(self, ctx: _Ctx, repo: Repo, run: Run) -> dict[str, Any]:
        url = f"{self._api(ctx)}/repos/{repo.full_name}/actions/runs/{run.id}"
        wf = repo.workflows[run.workflow_id]
        commit = repo.commits.get(run.head_sha)
        head_commit = None
        if commit is not None:
            person = {"name": "benchseal", "email": "bot@example.invalid"}
            head_commit = {"id": commit.sha, "tree_id": _sha("tree", commit.sha), "message": commit.message,
                           "timestamp": _iso(commit.date), "author": person, "committer": person}
        repo_min = self._repo_json(ctx, repo, full=False)
        head_repo = self._repos.get(run.head_repository.lower()) if run.head_repository else None
        head_min = self._repo_json(ctx, head_repo, full=False) if head_repo else repo_min
        return {
            "id": run.id, "name": wf.name, "node_id": f"WFR_{run.id}", "check_suite_id": run.id + 1,
            "check_suite_node_id": f"CS_{run.id + 1}", "head_branch": run.head_branch, "head_sha": run.head_sha,
            "path": run.path, "run_number": run.run_number, "run_attempt": run.run_attempt, "event": run.event,
            "display_title": run.display_title, "status": run.status, "conclusion": run.conclusion,
            "workflow_id": run.workflow_id, "url": url,
            "html_url": f"{ctx.origin}/{repo.full_name}/actions/runs/{run.id}", "pull_requests": [],
            "created_at": _iso(run.created_at), "updated_at": _iso(run.updated_at),
            "run_started_at": _iso(run.created_at), "actor": self._user(ctx), "triggering_actor": self._user(ctx),
            "jobs_url": url + "/jobs", "logs_url": url + "/logs",
            "check_suite_url": f"{self._api(ctx)}/repos/{repo.full_name}/check-suites/{run.id + 1}",
            "artifacts_url": url + "/artifacts", "cancel_url": url + "/cancel", "rerun_url": url + "/rerun",
            "previous_attempt_url": None,
            "workflow_url": f"{self._api(ctx)}/repos/{repo.full_name}/actions/workflows/{run.workflow_id}",
            "head_commit": head_commit, "repository": repo_min, "head_repository": head_min,
        }

    def _check_run_json(self, ctx: _Ctx, repo: Repo, cr: CheckRun) -> dict[str, Any]:
        url = f"{self._api(ctx)}/repos/{repo.full_name}/check-runs/{cr.id}"
        output = {"title": None, "summary": None, "text": None, **cr.output,
                  "annotations_count": 0, "annotations_url": url + "/annotations"}
        return {
            "id": cr.id, "head_sha": cr.head_sha, "node_id": f"CR_{cr.id}", "external_id": cr.external_id,
            "url": url, "html_url": f"{ctx.origin}/{repo.full_name}/runs/{cr.id}", "details_url": cr.details_url,
            "status": cr.status, "conclusion": cr.conclusion,
            "started_at": _iso(cr.started_at) if cr.started_at else None,
            "completed_at": _iso(cr.completed_at) if cr.completed_at else None,
            "output": output, "name": cr.name, "check_suite": {"id": cr.id + 1}, "app": None, "pull_requests": [],
        }

    # --- pagination ---------------------------------------------------------------

    def _paginate(self, ctx: _Ctx, items: list[Any]) -> list[Any]:
        per_page = min(max(ctx.arg_int("per_page", 30), 1), 100)
        page = max(ctx.arg_int("page", 1), 1)
        last = max(1, -(-len(items) // per_page))
        links = []

        def link(n: int, rel: str) -> str:
            args = [(k, v) for k, v in ctx.request.args.items(multi=True) if k != "page"] + [("page", str(n))]
            return f'<{ctx.origin}{ctx.request.path}?{urlencode(args)}>; rel="{rel}"'

        if page < last:
            links += [link(page + 1, "next"), link(last, "last")]
        if page > 1:
            links += [link(1, "first"), link(page - 1, "prev")]
        if links:
            ctx.headers["link"] = ", ".join(links)
        return items[(page - 1) * per_page: page * per_page]

    # --- handlers (called with the lock held) ------------------------------------------

    def _repo_of(self, ctx: _Ctx) -> Repo:
        repo = self._repos.get(f"{ctx.params['owner']}/{ctx.params['repo']}".lower())
        if repo is None:
            raise HttpError(404, "Not Found")
        return repo

    def _h_rate_limit(self, ctx: _Ctx) -> object:
        reset = int(self.clock.now().timestamp()) + 3600
        core = {"limit": self.rate_limit, "remaining": max(0, self.rate_limit - self.rate_used - 1),
                "reset": reset, "used": self.rate_used + 1}
        return {"resources": {"core": core, "search": {"limit": 30, "remaining": 30, "reset": reset, "used": 0}},
                "rate": core}

    def _h_get_repo(self, ctx: _Ctx) -> object:
        return self._repo_json(ctx, self._repo_of(ctx), full=True)

    # releases

    def _release_of(self, ctx: _Ctx, repo: Repo) -> Release:
        try:
            release = repo.releases.get(int(ctx.params["release_id"]))
        except ValueError:
            release = None
        if release is None:
            raise HttpError(404, "Not Found")
        return release

    def _h_list_releases(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        items = sorted(repo.releases.values(), key=lambda r: (r.created_at, r.id), reverse=True)
        return [self._release_json(ctx, repo, r) for r in self._paginate(ctx, items)]

    def _resolve_commitish(self, repo: Repo, commitish: str) -> str | None:
        if commitish in repo.commits:
            return commitish
        ref = repo.refs.get(f"refs/heads/{commitish}") or repo.refs.get(f"refs/tags/{commitish}")
        if ref is None:
            return None
        kind, sha = ref
        for _ in range(10):
            if kind != "tag":
                break
            obj = repo.tags[sha]
            kind, sha = obj.object_type, obj.object_sha
        return sha

    def _h_create_release(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        body = ctx.json()
        tag = str(body.get("tag_name") or "")
        if not tag:
            raise HttpError(422, "Validation Failed", [{"resource": "Release", "code": "missing_field",
                                                        "field": "tag_name"}])
        if any(r.tag_name == tag for r in repo.releases.values()):
            raise HttpError(422, "Validation Failed", [{"resource": "Release", "code": "already_exists",
                                                        "field": "tag_name"}])
        if tag in repo.immutable_tags:
            raise HttpError(422, "Validation Failed", [{"resource": "Release", "code": "custom", "field": "tag_name",
                                                        "message": "tag_name was used by an immutable release"}])
        target = str(body.get("target_commitish") or repo.default_branch)
        draft = bool(body.get("draft", False))
        if f"refs/tags/{tag}" not in repo.refs:
            sha = self._resolve_commitish(repo, target)
            if sha is None:
                raise HttpError(422, "Validation Failed", [{"resource": "Release", "code": "invalid",
                                                            "field": "target_commitish"}])
            if not draft:
                repo.refs[f"refs/tags/{tag}"] = ("commit", sha)
        now = self.clock.now()
        release = Release(self._next_id(), tag, target, body.get("name"), body.get("body"), draft,
                          bool(body.get("prerelease", False)), now, None if draft else now, now)
        self._publish_effects(repo, release)
        repo.releases[release.id] = release
        ctx.status = 201
        return self._release_json(ctx, repo, release)

    def _publish_effects(self, repo: Repo, release: Release) -> None:
        if not release.draft and repo.immutable_releases:
            release.immutable = True
            repo.immutable_tags.add(release.tag_name)

    def _h_latest_release(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        published = [r for r in repo.releases.values() if not r.draft and not r.prerelease]
        if not published:
            raise HttpError(404, "Not Found")
        latest = max(published, key=lambda r: (r.published_at or r.created_at, r.id))
        return self._release_json(ctx, repo, latest)

    def _h_release_by_tag(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        release = next((r for r in repo.releases.values() if r.tag_name == ctx.params["tag"] and not r.draft), None)
        if release is None:
            raise HttpError(404, "Not Found")
        return self._release_json(ctx, repo, release)

    def _h_get_release(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        return self._release_json(ctx, repo, self._release_of(ctx, repo))

    def _h_update_release(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        release = self._release_of(ctx, repo)
        body = ctx.json()
        if release.immutable:
            changed: list[str] = [k for k in ("tag_name", "target_commitish")
                                  if k in body and body[k] != getattr(release, k)]
            if body.get("draft") is True:
                changed.append("draft")
            if changed:
                raise HttpError(422, "Validation Failed", [{"resource": "Release", "code": "custom",
                                                            "field": changed[0],
                                                            "message": "Cannot modify an immutable release."}])
        for key in ("tag_name", "target_commitish", "name", "body"):
            if key in body:
                setattr(release, key, body[key])
        if "prerelease" in body:
            release.prerelease = bool(body["prerelease"])
        if "draft" in body:
            was_draft = release.draft
            release.draft = bool(body["draft"])
            if was_draft and not release.draft:
                release.published_at = self.clock.now()
                if f"refs/tags/{release.tag_name}" not in repo.refs:
                    sha = self._resolve_commitish(repo, release.target_commitish)
                    if sha is None:
                        raise HttpError(422, "Validation Failed", [{"resource": "Release", "code": "invalid",
                                                                    "field": "target_commitish"}])
                    repo.refs[f"refs/tags/{release.tag_name}"] = ("commit", sha)
                self._publish_effects(repo, release)
        release.updated_at = self.clock.now()
        return self._release_json(ctx, repo, release)

    def _h_delete_release(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        release = self._release_of(ctx, repo)
        del repo.releases[release.id]
        ctx.status = 204
        return None

    def _h_list_assets(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        release = self._release_of(ctx, repo)
        return [self._asset_json(ctx, repo, release, a) for a in self._paginate(ctx, list(release.assets))]

    def _h_upload_asset(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        release = self._release_of(ctx, repo)
        name = ctx.request.args.get("name", "")
        if not name:
            raise HttpError(422, "Validation Failed", [{"resource": "ReleaseAsset", "code": "missing_field",
                                                        "field": "name"}])
        if release.immutable:
            raise HttpError(422, IMMUTABLE_UPLOAD_MESSAGE)
        if any(a.name == name for a in release.assets):
            raise HttpError(422, "Validation Failed", [{"resource": "ReleaseAsset", "code": "already_exists",
                                                        "field": "name"}])
        now = self.clock.now()
        asset = Asset(self._next_id(), name, ctx.request.args.get("label", ""),
                      ctx.request.headers.get("Content-Type", "application/octet-stream"),
                      ctx.request.get_data(), now, now)
        release.assets.append(asset)
        ctx.status = 201
        return self._asset_json(ctx, repo, release, asset)

    def _find_asset(self, repo: Repo, asset_id: str) -> tuple[Release, Asset]:
        for release in repo.releases.values():
            for asset in release.assets:
                if str(asset.id) == asset_id:
                    return release, asset
        raise HttpError(404, "Not Found")

    def _h_get_asset(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        release, asset = self._find_asset(repo, ctx.params["asset_id"])
        data = self._asset_json(ctx, repo, release, asset)
        if "application/octet-stream" in ctx.request.headers.get("Accept", ""):
            ctx.status = 302
            # Same host, under /api/ (PyGithub only follows redirects there), like a storage URL.
            ctx.headers["location"] = f"{ctx.origin}/api/storage/assets/{asset.id}"
            return None
        return data

    def _h_delete_asset(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        release, asset = self._find_asset(repo, ctx.params["asset_id"])
        if release.immutable:
            raise HttpError(422, IMMUTABLE_DELETE_MESSAGE)
        release.assets.remove(asset)
        ctx.status = 204
        return None

    def _download(self, params: dict[str, str]) -> Response:
        with self._lock:
            repo = self._repos.get(f"{params['owner']}/{params['repo']}".lower())
            release = next((r for r in (repo.releases.values() if repo else []) if r.tag_name == params["tag"]), None)
            asset = next((a for a in (release.assets if release else []) if a.name == params["name"]), None)
            if asset is None:
                return Response(b"Not Found", status=404)
            return Response(asset.data, status=200, content_type="application/octet-stream")

    def _download_by_id(self, asset_id: str) -> Response:
        with self._lock:
            for repo in self._repos.values():
                for release in repo.releases.values():
                    for asset in release.assets:
                        if str(asset.id) == asset_id:
                            return Response(asset.data, status=200, content_type="application/octet-stream")
        return Response(b"Not Found", status=404)

    # dispatch and runs

    def _find_workflow(self, repo: Repo, key: str) -> Workflow | None:
        """By id or, like GitHub, by file name in .github/workflows (the full path is accepted
        for the test helpers); a file of that name elsewhere is not the workflow."""
        for wf in repo.workflows.values():
            if str(wf.id) == key or wf.path in (key, ".github/workflows/" + key):
                return wf
        return None

    def _workflow_of(self, ctx: _Ctx, repo: Repo) -> Workflow:
        wf = self._find_workflow(repo, ctx.params["workflow_id"])
        if wf is None:
            raise HttpError(404, "Not Found")
        return wf

    def _start_run(self, repo: Repo, wf: Workflow, event: DispatchEvent, context: Mapping[str, Any],
                   head_sha: str, head_branch: str | None) -> list[Run]:
        if wf.render is not None:
            title = wf.render(context)
        elif wf.spec is not None and wf.spec.run_name:
            title = render_run_name(wf.spec.run_name, context)
        else:
            title = wf.name
        now = self.clock.now()
        delay = self.workflow_appearance_delay.get(wf.path, self.run_appearance_delay)
        made = []
        for _ in range(max(1, self.dispatch_copies)):
            run = self.create_run(repo.full_name, display_title=title, workflow=str(wf.id), event=event.kind,
                                  head_sha=head_sha, created_at=now, visible_at=now + delay,
                                  payload=dict(event.client_payload or event.inputs or {}))
            run.head_branch = head_branch
            made.append(run)
        for run in made:
            for callback in self._callbacks:
                handle = RunHandle(self, repo.full_name, run.id, event)
                thread = threading.Thread(target=self._run_callback, args=(callback, handle, event), daemon=True)
                self._threads.append(thread)
                thread.start()
        return made

    def _run_callback(self, callback: DispatchCallback, handle: RunHandle, event: DispatchEvent) -> None:
        try:
            callback(handle, event)
        except BaseException as exc:  # surfaced to the test through callback_errors
            self.callback_errors.append(exc)

    def _h_repository_dispatch(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        body = ctx.json()
        event_type = body.get("event_type")
        payload = body.get("client_payload") or {}
        if not isinstance(event_type, str) or not event_type or len(event_type) > 100:
            raise HttpError(422, "Invalid request.\n\nNo event_type provided.")
        if not isinstance(payload, dict) or len(payload) > 10:
            raise HttpError(422, "Invalid request.\n\nclient_payload can have at most 10 top-level properties.")
        head = self.head(repo.full_name)
        for wf in list(repo.workflows.values()):
            if (wf.spec is not None and wf.spec.accepts_repository_dispatch(event_type)) or (
                    wf.spec is None and wf.render is not None):
                event = DispatchEvent("repository_dispatch", repo.full_name, wf.path, event_type, payload, None, None)
                context = {"github": {"event": {"action": event_type, "client_payload": payload},
                                      "event_name": "repository_dispatch"}}
                self._start_run(repo, wf, event, context, head, repo.default_branch)
        ctx.status = 204
        return None

    def _h_list_workflows(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        items = sorted(repo.workflows.values(), key=lambda w: w.id)
        page = self._paginate(ctx, items)
        return {"total_count": len(items), "workflows": [self._workflow_json(ctx, repo, w) for w in page]}

    # Actions settings

    def _h_list_variables(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        items = sorted(repo.variables.items())
        return {"total_count": len(items), "variables": [
            {"name": name, "value": value, "created_at": _iso(at), "updated_at": _iso(at)}
            for name, (value, at) in self._paginate(ctx, items)]}

    def _h_list_secrets(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        items = sorted(repo.secrets.items())
        return {"total_count": len(items), "secrets": [
            {"name": name, "created_at": _iso(at), "updated_at": _iso(at)} for name, at in self._paginate(ctx, items)]}

    def _h_list_runners(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        wanted = ctx.request.args.get("name")
        items = [r for r in repo.runners if wanted is None or r.name == wanted]
        return {"total_count": len(items), "runners": [
            {"id": r.id, "name": r.name, "os": "linux", "status": r.status, "busy": False, "ephemeral": False,
             "labels": [{"id": i, "name": n, "type": "read-only"} for i, n in enumerate(("self-hosted", "Linux", "X64"))]
             + [{"id": 10 + i, "name": n, "type": "custom"} for i, n in enumerate(r.labels)]}
            for r in self._paginate(ctx, items)]}

    def _h_get_workflow(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        return self._workflow_json(ctx, repo, self._workflow_of(ctx, repo))

    def _h_workflow_dispatch(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        wf = self._workflow_of(ctx, repo)
        body = ctx.json()
        if self.reject_return_run_details and "return_run_details" in body:
            raise HttpError(422, GHES_RETURN_RUN_DETAILS_MESSAGE)
        ref = str(body.get("ref") or "")
        sha = self._resolve_commitish(repo, ref.removeprefix("refs/heads/").removeprefix("refs/tags/"))
        if sha is None:
            raise HttpError(422, f"No ref found for: {ref}")
        declared = wf.spec.workflow_dispatch_inputs if wf.spec else {}
        if declared is None:
            raise HttpError(422, "Workflow does not have 'workflow_dispatch' trigger")
        inputs = dict(body.get("inputs") or {})
        unexpected = sorted(set(inputs) - set(declared or {})) if wf.spec else []
        if unexpected:
            raise HttpError(422, f"Unexpected inputs provided: {json.dumps(unexpected)}")
        for key, cfg in (declared or {}).items():
            if key not in inputs:
                if isinstance(cfg, dict) and cfg.get("required") and cfg.get("default") is None:
                    raise HttpError(422, f"Required input '{key}' not provided")
                if isinstance(cfg, dict) and "default" in cfg:
                    inputs[key] = cfg["default"]
        event = DispatchEvent("workflow_dispatch", repo.full_name, wf.path, None, None, inputs, ref)
        context = {"inputs": inputs, "github": {"event": {"inputs": inputs, "ref": ref},
                                                "event_name": "workflow_dispatch", "ref": ref}}
        runs = self._start_run(repo, wf, event, context, sha, ref.removeprefix("refs/heads/"))
        if body.get("return_run_details"):
            run_id = self.return_run_details_id(runs[0]) if self.return_run_details_id else runs[0].id
            ctx.status = 200
            return {"workflow_run_id": run_id,
                    "run_url": f"{self._api(ctx)}/repos/{repo.full_name}/actions/runs/{run_id}",
                    "html_url": f"{ctx.origin}/{repo.full_name}/actions/runs/{run_id}"}
        ctx.status = 204
        return None

    def _visible_runs(self, repo: Repo) -> Iterator[Run]:
        now = self.clock.now()
        for run in repo.runs.values():
            if run.visible_at is None or run.visible_at <= now:
                yield run

    def _filter_runs(self, ctx: _Ctx, runs: Iterator[Run]) -> list[Run]:
        args = ctx.request.args
        items = list(runs)
        if args.get("event"):
            items = [r for r in items if r.event == args["event"]]
        if args.get("status"):
            status = args["status"]
            items = [r for r in items if status in (r.status, r.conclusion)]
        if args.get("head_sha"):
            items = [r for r in items if r.head_sha == args["head_sha"]]
        if args.get("branch"):
            items = [r for r in items if r.head_branch == args["branch"]]
        if args.get("created"):
            test = _created_predicate(args["created"])
            items = [r for r in items if test(r.created_at)]
        items.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        return items

    def _runs_page(self, ctx: _Ctx, repo: Repo, items: list[Run]) -> object:
        page = self._paginate(ctx, items)
        return {"total_count": len(items), "workflow_runs": [self._run_json(ctx, repo, r) for r in page]}

    def _h_list_workflow_runs(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        wf = self._workflow_of(ctx, repo)
        runs = (r for r in self._visible_runs(repo) if r.workflow_id == wf.id)
        return self._runs_page(ctx, repo, self._filter_runs(ctx, runs))

    def _h_list_repo_runs(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        return self._runs_page(ctx, repo, self._filter_runs(ctx, self._visible_runs(repo)))

    def _h_get_run_api(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        run = next((r for r in self._visible_runs(repo) if str(r.id) == ctx.params["run_id"]), None)
        if run is None:
            raise HttpError(404, "Not Found")
        return self._run_json(ctx, repo, run)

    # git data

    def _ref_json(self, ctx: _Ctx, repo: Repo, ref: str) -> dict[str, Any]:
        kind, sha = repo.refs[ref]
        api = f"{self._api(ctx)}/repos/{repo.full_name}"
        obj_url = f"{api}/git/tags/{sha}" if kind == "tag" else f"{api}/git/commits/{sha}"
        return {"ref": ref, "node_id": f"REF_{_sha(ref)[:12]}", "url": f"{api}/git/{ref}",
                "object": {"type": kind, "sha": sha, "url": obj_url}}

    def _h_get_ref(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        ref = "refs/" + ctx.params["ref"]
        if ref not in repo.refs:
            raise HttpError(404, "Not Found")
        return self._ref_json(ctx, repo, ref)

    def _h_matching_refs(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        prefix = "refs/" + ctx.params["ref"]
        return [self._ref_json(ctx, repo, r) for r in sorted(repo.refs) if r.startswith(prefix)]

    def _h_get_tag(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        tag = repo.tags.get(ctx.params["tag_sha"])
        if tag is None:
            raise HttpError(404, "Not Found")
        api = f"{self._api(ctx)}/repos/{repo.full_name}"
        obj_url = f"{api}/git/tags/{tag.object_sha}" if tag.object_type == "tag" else f"{api}/git/commits/{tag.object_sha}"
        return {
            "node_id": f"TAG_{tag.sha[:12]}", "tag": tag.tag, "sha": tag.sha, "url": f"{api}/git/tags/{tag.sha}",
            "message": tag.message,
            "tagger": {"date": _iso(tag.date), "email": "bot@example.invalid", "name": "benchseal"},
            "object": {"type": tag.object_type, "sha": tag.object_sha, "url": obj_url},
            "verification": {"verified": False, "reason": "unsigned", "payload": None, "signature": None,
                             "verified_at": None},
        }

    def _h_get_commit(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        sha = self._resolve_commitish(repo, ctx.params["ref"])
        if sha is None or sha not in repo.commits:
            raise HttpError(422, f"No commit found for SHA: {ctx.params['ref']}")
        return self._commit_json(ctx, repo, repo.commits[sha])

    # check runs

    def _h_create_check_run(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        body = ctx.json()
        now = self.clock.now()
        status = body.get("status", "queued")
        conclusion = body.get("conclusion")
        if conclusion is not None:
            status = "completed"
        cr = CheckRun(self._next_id(), str(body.get("name", "")), str(body.get("head_sha", "")), status, conclusion,
                      body.get("external_id"), body.get("details_url"), now,
                      now if status == "completed" else None, dict(body.get("output") or {}))
        repo.check_runs[cr.id] = cr
        ctx.status = 201
        return self._check_run_json(ctx, repo, cr)

    def _check_run_of(self, ctx: _Ctx, repo: Repo) -> CheckRun:
        cr = repo.check_runs.get(int(ctx.params["check_run_id"])) if ctx.params["check_run_id"].isdigit() else None
        if cr is None:
            raise HttpError(404, "Not Found")
        return cr

    def _h_get_check_run(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        return self._check_run_json(ctx, repo, self._check_run_of(ctx, repo))

    def _h_update_check_run(self, ctx: _Ctx) -> object:
        repo = self._repo_of(ctx)
        cr = self._check_run_of(ctx, repo)
        body = ctx.json()
        for key in ("name", "status", "conclusion", "external_id", "details_url"):
            if key in body:
                setattr(cr, key, body[key])
        if "output" in body:
            cr.output.update(body["output"] or {})
        if cr.conclusion is not None:
            cr.status = "completed"
            cr.completed_at = cr.completed_at or self.clock.now()
        return self._check_run_json(ctx, repo, cr)


def _default_message(status: int) -> str:
    return {
        403: "Forbidden", 404: "Not Found", 422: "Validation Failed", 429: "Too Many Requests",
        500: "Server Error", 502: "Server Error", 503: "Service Unavailable",
    }.get(status, "Error")


def _parse_time(text: str) -> datetime:
    text = text.strip()
    if len(text) == 10:
        text += "T00:00:00Z"
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _created_predicate(query: str) -> Callable[[datetime], bool]:
    """GitHub's date search syntax: >=, >, <=, <, a..b, or a bare date (that day)."""
    q = query.strip()
    comparisons: dict[str, Callable[[datetime, datetime], bool]] = {
        ">=": lambda t, b: t >= b, "<=": lambda t, b: t <= b, ">": lambda t, b: t > b, "<": lambda t, b: t < b,
    }
    for op, compare in comparisons.items():
        if q.startswith(op):
            bound = _parse_time(q[len(op):])
            return lambda t, compare=compare, bound=bound: compare(t, bound)  # type: ignore[misc]
    if ".." in q:
        lo, _, hi = q.partition("..")
        low = _parse_time(lo) if lo and lo != "*" else None
        high = _parse_time(hi) if hi and hi != "*" else None
        return lambda t: (low is None or t >= low) and (high is None or t <= high)
    day = _parse_time(q)
    return lambda t: day <= t < day + timedelta(days=1)
