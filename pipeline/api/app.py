"""FastAPI app: run status and each source repository's results, read from the queue database.

The only state is the queue's (``pipeline.infra.queue``), opened read-only
(``pipeline.infra.queue.reader.open_reader``: the SQLite file ``mode=ro``, or PostgreSQL as a role
granted SELECT only); the API writes nothing anywhere and reads no run directory.

JSON: ``/healthz``; ``/runs`` (every run: id, state, source, suite, score); ``/runs/{id}`` (its status,
``RunStatus``); ``/runs/{id}/grading``; ``/runs/{id}/comparison`` (the comparison recorded with a
scored run); ``/repos/{owner}/{name}/history`` (the repository's scored releases, oldest first, each
with its comparison). HTML (``pipeline.api.pages``): ``/`` and ``/repos`` (the repositories with a
run), ``/repos/{owner}/{name}`` (the results page: every run, whatever its end; ``?a=RUN&b=RUN``
sets two of them side by side) and ``/repos/{owner}/{name}/runs/{id}`` (one run, per task and per
trial). ``verify_pins`` (``api serve --infra-repo --builder``) lets the pages print a verify command
that works when pasted.

Hardening: run ids and repository names are checked against their one rule before they reach the
queue (an invalid one is a 400 that does not echo it); an error's text is escaped (``escape_text``,
and in a page ``html.escape``); a row the queue cannot decode (``pipeline.infra.queue.reader``:
payload, grading, state, history entry, comparison) never takes the others with it: a list shows it
as ``{"run_id", "unreadable": "<column>: <reason>"}`` (a page in its own "Unreadable rows" list) and
serves every other row, and the one run asked for by id is a 500 naming the run and the reason
(a server-side data problem, never a 422, which is for the client's input); an unreachable queue is
a 503; never a traceback; no ``/docs``, ``/redoc`` or
``/openapi.json``. Every answer carries a Content-Security-Policy that forbids every external
fetch, ``nosniff`` and ``no-referrer``.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse

from pipeline import __version__
from pipeline.api import pages
from pipeline.core.contracts import canonical_repository, run_id_problem
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError, escape_text
from pipeline.infra.queue import reader
from pipeline.infra.queue.reader import ReleaseRow, Unreadable
from pipeline.infra.queue.sql import RunRecord, SqlQueue

HEADERS = {"Content-Security-Policy": pages.CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-store"}


class ApiError(Exception):
    """An answer other than 200: its status, a one-line message, and whether it is a page or JSON."""

    def __init__(self, status: int, message: str, *, page: bool = False, title: str = "", run_id: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.page, self.title, self.run_id = status, message, page, title, run_id


class QueueSource:
    """The read-only queue, opened on first use and then kept (a failed open is tried again next time)."""

    def __init__(self, opener: Callable[[], SqlQueue]) -> None:
        self._opener = opener
        self._queue: SqlQueue | None = None
        self._lock = threading.Lock()

    def get(self) -> SqlQueue:
        with self._lock:
            if self._queue is None:
                self._queue = self._opener()
            return self._queue

    def close(self) -> None:
        with self._lock:
            if self._queue is not None:
                self._queue.close()
                self._queue = None


def _one_line(exc: BaseException) -> str:
    return escape_text(" ".join(str(exc).split()))[:600]


def _checked_run_id(run_id: str) -> str:
    problem = run_id_problem(run_id)
    if problem:
        raise ApiError(400, f"run_id: {problem}")
    return run_id


def _checked_repository(owner: str, name: str, *, page: bool) -> str:
    try:
        return canonical_repository(f"{owner}/{name}")
    except ValueError as exc:
        raise ApiError(400, f"repository: {exc}", page=page, title="Not a repository name") from None


def _canonical(repository: str) -> str | None:
    try:
        return canonical_repository(repository)
    except ValueError:
        return None


def _same_repository(named: str, repository: str) -> bool:
    return _canonical(named) == repository


def create_app(source: QueueSource, *, release_url_base: str = pages.GITHUB,
               verify_pins: pages.VerifyPins | None = None) -> FastAPI:
    pages.validate_url_base(release_url_base)
    # No /docs, /redoc or /openapi.json: the service answers its routes and nothing else.
    app = FastAPI(title="benchseal api", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def _headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        response.headers.update(HEADERS)
        return response

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> Response:
        headers = {**HEADERS, **({"X-Benchseal-Bad-Run": exc.run_id} if exc.run_id else {})}
        if exc.page:
            return HTMLResponse(pages.message_page(exc.title or "Error", exc.message), status_code=exc.status,
                                headers=headers)
        return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=headers)

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        # Still JSON when something unforeseen breaks (never a text/plain traceback page).
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}"}, status_code=500, headers=HEADERS)

    def read(work: Callable[[SqlQueue], Any], *, page: bool = False, run_id: str | None = None) -> Any:
        """``work`` on the queue; the queue's failures as answers (503 unreachable, 404 an unknown run).
        Rows that cannot be decoded come back from ``reader`` as ``Unreadable`` values, not as errors."""
        try:
            queue = source.get()
        except (InfrastructureError, CheckFailed) as exc:
            raise ApiError(503, f"queue unavailable: {_one_line(exc)}", page=page, title="Queue unavailable") from None
        try:
            return work(queue)
        except ApiError:
            raise
        except ValidationError as exc:
            if run_id is not None and exc.field == "run_id":
                raise ApiError(404, f"run {run_id} not found", page=page, title="Not found") from None
            raise ApiError(400, _one_line(exc), page=page, title="Bad request") from None
        except (InfrastructureError, CheckFailed) as exc:
            raise ApiError(503, f"queue unavailable: {_one_line(exc)}", page=page, title="Queue unavailable") from None

    def one_run(queue: SqlQueue, run_id: str) -> RunRecord:
        found = reader.run(queue, run_id)
        if isinstance(found, Unreadable):
            # The client's request was fine; the row is not: a server-side problem, named, never a 422.
            raise ApiError(500, f"run {run_id} is unreadable: {found.reason}", run_id=run_id)
        return found

    def releases(queue: SqlQueue, repository: str) -> list[pages.Release | Unreadable]:
        return [row if isinstance(row, Unreadable) else pages.Release(entry=row.entry, comparison=row.comparison)
                for row in reader.releases(queue, repository)]

    def repository_runs(queue: SqlQueue, repository: str) -> tuple[list[pages.RunView], list[Unreadable]]:
        """Every run of ``repository`` (its queue rows joined with its history), and its unreadable history
        rows. A run row that cannot be decoded names no repository: /runs lists it, a page cannot."""
        found = releases(queue, repository)
        records = [r for r in reader.runs(queue) if isinstance(r, RunRecord)
                   and _same_repository(r.payload.source.repository, repository)]
        return (pages.run_views(records, [r for r in found if isinstance(r, pages.Release)]),
                [r for r in found if isinstance(r, Unreadable)])

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    def run_item(r: RunRecord | Unreadable) -> dict[str, Any]:
        if isinstance(r, Unreadable):
            return {"run_id": r.run_id, "state": None, "repository": None, "tag": None, "suite": None,
                    "updated_at": None, "score": None, "unreadable": r.reason}
        return {"run_id": r.run_id, "state": r.state, "repository": r.payload.source.repository,
                "tag": r.payload.source.tag, "suite": r.payload.suite, "updated_at": r.updated_at,
                "score": r.grading.score if r.grading else None}

    @app.get("/runs")
    def list_runs() -> dict[str, list[dict[str, Any]]]:
        records: list[RunRecord | Unreadable] = read(reader.runs)
        return {"runs": [run_item(r) for r in records]}

    @app.get("/runs/{run_id}")
    def get_run(run_id: str) -> dict[str, Any]:
        _checked_run_id(run_id)
        record: RunRecord = read(lambda q: one_run(q, run_id), run_id=run_id)
        return record.status().model_dump(mode="json")

    @app.get("/runs/{run_id}/grading")
    def get_grading(run_id: str) -> dict[str, Any]:
        _checked_run_id(run_id)
        record: RunRecord = read(lambda q: one_run(q, run_id), run_id=run_id)
        if record.grading is None:
            raise ApiError(404, f"run {run_id} is not graded yet")
        return record.grading.model_dump(mode="json")

    @app.get("/runs/{run_id}/comparison")
    def get_comparison(run_id: str) -> dict[str, Any]:
        _checked_run_id(run_id)

        def work(queue: SqlQueue) -> ReleaseRow | None:
            reader.run(queue, run_id)  # a ValidationError (404) for an unknown run
            found = reader.comparison(queue, run_id)
            if isinstance(found, Unreadable):
                raise ApiError(500, f"run {run_id} is unreadable: {found.reason}", run_id=run_id)
            return found

        found: ReleaseRow | None = read(work, run_id=run_id)
        if found is None or found.comparison is None:
            raise ApiError(404, f"run {run_id} has no scored release in the history")
        return dict(found.comparison.model_dump(mode="json", by_alias=True))

    def index() -> HTMLResponse:
        def work(queue: SqlQueue) -> list[pages.RepositorySummary]:
            found = []
            runs = [r for r in reader.runs(queue) if isinstance(r, RunRecord)]
            named = {_canonical(r.payload.source.repository) for r in runs} - {None}
            for repository in sorted(set(queue.history_repositories()) | {n for n in named if n is not None}):
                rows = releases(queue, repository)
                readable = [r.entry for r in rows if isinstance(r, pages.Release)]
                count = sum(1 for r in runs if _same_repository(r.payload.source.repository, repository))
                found.append(pages.RepositorySummary(repository, len(readable), readable[-1] if readable else None,
                                                     unreadable=len(rows) - len(readable), runs=count))
            return found

        return HTMLResponse(pages.index_page(read(work, page=True)))

    app.get("/", response_class=HTMLResponse)(index)
    app.get("/repos", response_class=HTMLResponse)(index)

    @app.get("/repos/{owner}/{name}", response_class=HTMLResponse)
    def results(owner: str, name: str, a: str | None = None, b: str | None = None) -> HTMLResponse:
        repository = _checked_repository(owner, name, page=True)
        for field, value in (("a", a), ("b", b)):
            if value is not None and run_id_problem(value):
                raise ApiError(400, f"{field}: {run_id_problem(value)}", page=True, title="Not a run id")
        if (a is None) != (b is None):
            raise ApiError(400, "a and b: give both runs to compare, or neither", page=True, title="Bad request")
        views, unreadable = read(lambda q: repository_runs(q, repository), page=True)
        if not views and not unreadable:
            raise ApiError(404, f"No scored release of {repository} is recorded here.", page=True,
                           title="No results")
        compared = None
        if a is not None and b is not None:
            by_run = {v.run_id: v for v in views}
            if a not in by_run or b not in by_run:
                raise ApiError(404, f"a and b must be runs of {repository}", page=True, title="Not found")
            compared = (by_run[a], by_run[b])
        return HTMLResponse(pages.results_page(repository, views, release_url_base, unreadable=unreadable,
                                               pins=verify_pins, compared=compared))

    @app.get("/repos/{owner}/{name}/runs/{run_id}", response_class=HTMLResponse)
    def run_page(owner: str, name: str, run_id: str) -> HTMLResponse:
        repository = _checked_repository(owner, name, page=True)
        if run_id_problem(run_id):
            raise ApiError(400, f"run_id: {run_id_problem(run_id)}", page=True, title="Not a run id")
        views, _ = read(lambda q: repository_runs(q, repository), page=True)
        index = next((i for i, v in enumerate(views) if v.run_id == run_id), None)
        if index is None:
            raise ApiError(404, f"run {run_id} is not a readable run of {repository}", page=True, title="Not found")
        view = views[index]
        previous = next((v for v in reversed(views[:index]) if v.suite == view.suite), None)
        return HTMLResponse(pages.run_page(repository, view, release_url_base, pins=verify_pins, previous=previous))

    @app.get("/repos/{owner}/{name}/history")
    def history(owner: str, name: str) -> dict[str, Any]:
        repository = _checked_repository(owner, name, page=False)
        found: list[pages.Release | Unreadable] = read(lambda q: releases(q, repository))
        if not found:
            raise ApiError(404, f"no scored release of {repository} is recorded here")
        return {"repository": repository, "releases": [
            {"run_id": r.run_id, "unreadable": r.reason} if isinstance(r, Unreadable) else
            {**r.entry.model_dump(mode="json"), "evidence": pages.release_url(release_url_base, repository, r.entry.tag),
             "comparison": None if r.comparison is None else r.comparison.model_dump(mode="json", by_alias=True)}
            for r in found]}

    return app
