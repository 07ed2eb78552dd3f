"""FastAPI app: run status and each source repository's results, read from the queue database.

The only state is the queue's (``pipeline.infra.queue``), opened read-only
(``pipeline.infra.queue.reader.open_reader``: the SQLite file ``mode=ro``, or PostgreSQL as a role
granted SELECT only); the API writes nothing anywhere and reads no run directory.

JSON: ``/healthz``; ``/runs`` (every run: id, state, source, suite, score); ``/runs/{id}`` (its status,
``RunStatus``); ``/runs/{id}/grading``; ``/runs/{id}/comparison`` (the comparison recorded with a
scored run); ``/repos/{owner}/{name}/history`` (the repository's scored releases, oldest first, each
with its comparison). HTML (``pipeline.api.pages``): ``/`` and ``/repos`` (the repositories with a
scored release), ``/repos/{owner}/{name}`` (the results page).

Hardening: run ids and repository names are checked against their one rule before they reach the
queue (an invalid one is a 400 that does not echo it); an error's text is escaped (``escape_text``,
and in a page ``html.escape``); a row the queue cannot read is a 422 naming the run, an unreachable
or unreadable queue a 503, nothing a 500 page or traceback; no ``/docs``, ``/redoc`` or
``/openapi.json``. Every answer carries a Content-Security-Policy that forbids every external
fetch, ``nosniff`` and ``no-referrer``.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse

from pipeline import __version__
from pipeline.api import pages
from pipeline.core.contracts import RunStatus, canonical_repository, run_id_problem
from pipeline.core.errors import CheckFailed, Error, InfrastructureError, ValidationError, escape_text
from pipeline.infra.queue.sql import Queue, RunRecord

HEADERS = {"Content-Security-Policy": pages.CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-store"}


class ApiError(Exception):
    """An answer other than 200: its status, a one-line message, and whether it is a page or JSON."""

    def __init__(self, status: int, message: str, *, page: bool = False, title: str = "", run_id: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.page, self.title, self.run_id = status, message, page, title, run_id


class QueueSource:
    """The read-only queue, opened on first use and then kept (a failed open is tried again next time)."""

    def __init__(self, opener: Callable[[], Queue]) -> None:
        self._opener = opener
        self._queue: Queue | None = None
        self._lock = threading.Lock()

    def get(self) -> Queue:
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


def create_app(source: QueueSource, *, release_url_base: str = pages.GITHUB) -> FastAPI:
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

    def read(work: Callable[[Queue], Any], *, page: bool = False, run_id: str | None = None) -> Any:
        """``work`` on the queue; the queue's failures as answers (503 unreachable, 422 an unreadable row)."""
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
            raise ApiError(422, _one_line(exc), page=page, title="Unreadable row", run_id=run_id) from None
        except (InfrastructureError, CheckFailed) as exc:
            raise ApiError(503, f"queue unavailable: {_one_line(exc)}", page=page, title="Queue unavailable") from None
        except (pydantic.ValidationError, ValueError, TypeError, Error) as exc:
            where = f"run {run_id}" if run_id else "a row of the queue"
            raise ApiError(422, f"{where} cannot be read: {_one_line(exc)}", page=page, title="Unreadable row",
                           run_id=run_id) from None

    def releases(queue: Queue, repository: str) -> list[pages.Release]:
        return [pages.Release(entry=entry, comparison=queue.comparison(entry.run_id))
                for entry in queue.history(repository)]

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get("/runs")
    def list_runs() -> dict[str, list[dict[str, Any]]]:
        records: list[RunRecord] = read(lambda q: q.list_runs())
        return {"runs": [{"run_id": r.run_id, "state": r.state, "repository": r.payload.source.repository,
                          "tag": r.payload.source.tag, "suite": r.payload.suite, "updated_at": r.updated_at,
                          "score": r.grading.score if r.grading else None} for r in records]}

    @app.get("/runs/{run_id}")
    def get_run(run_id: str) -> dict[str, Any]:
        _checked_run_id(run_id)
        status: RunStatus = read(lambda q: q.get_run(run_id).status(), run_id=run_id)
        return status.model_dump(mode="json")

    @app.get("/runs/{run_id}/grading")
    def get_grading(run_id: str) -> dict[str, Any]:
        _checked_run_id(run_id)
        record: RunRecord = read(lambda q: q.get_run(run_id), run_id=run_id)
        if record.grading is None:
            raise ApiError(404, f"run {run_id} is not graded yet")
        return record.grading.model_dump(mode="json")

    @app.get("/runs/{run_id}/comparison")
    def get_comparison(run_id: str) -> dict[str, Any]:
        _checked_run_id(run_id)

        def work(queue: Queue) -> Any:
            queue.get_run(run_id)  # 404 for an unknown run
            return queue.comparison(run_id)

        comparison = read(work, run_id=run_id)
        if comparison is None:
            raise ApiError(404, f"run {run_id} has no scored release in the history")
        return dict(comparison.model_dump(mode="json", by_alias=True))

    def index() -> HTMLResponse:
        def work(queue: Queue) -> list[pages.RepositorySummary]:
            found = []
            for repository in queue.history_repositories():
                entries = queue.history(repository)
                found.append(pages.RepositorySummary(repository, len(entries), entries[-1] if entries else None))
            return found

        return HTMLResponse(pages.index_page(read(work, page=True)))

    app.get("/", response_class=HTMLResponse)(index)
    app.get("/repos", response_class=HTMLResponse)(index)

    @app.get("/repos/{owner}/{name}", response_class=HTMLResponse)
    def results(owner: str, name: str) -> HTMLResponse:
        repository = _checked_repository(owner, name, page=True)
        found: list[pages.Release] = read(lambda q: releases(q, repository), page=True)
        if not found:
            raise ApiError(404, f"No scored release of {repository} is recorded here.", page=True,
                           title="No results")
        return HTMLResponse(pages.results_page(repository, found, release_url_base))

    @app.get("/repos/{owner}/{name}/history")
    def history(owner: str, name: str) -> dict[str, Any]:
        repository = _checked_repository(owner, name, page=False)
        found: list[pages.Release] = read(lambda q: releases(q, repository))
        if not found:
            raise ApiError(404, f"no scored release of {repository} is recorded here")
        return {"repository": repository, "releases": [
            {**r.entry.model_dump(mode="json"), "evidence": pages.release_url(release_url_base, repository, r.entry.tag),
             "comparison": None if r.comparison is None else r.comparison.model_dump(mode="json", by_alias=True)}
            for r in found]}

    return app
