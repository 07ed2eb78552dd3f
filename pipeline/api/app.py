"""FastAPI app: health, run list, run status (run.json), grading (grading.json), results (summary.json).

Reads ``<runs>/<run_id>/run.json`` (pipeline.core.contracts.RunStatus), ``<runs>/<run_id>/grading.json``
(pipeline.core.contracts.Grading: what the worker concluded, unsigned; on a production host, where the
worker only grades, this is all there is) and ``<runs>/<run_id>/artifacts/summary.json``
(pipeline.core.documents.ReleaseSummary: the sealed results, present where the run was sealed on this
host, e.g. ``release --local``); read-only, no state of its own.
Run ids are validated before they touch the filesystem (no traversal).

A run directory is written by the worker, and what a trial left in it is not trusted: each
document is opened without following a symbolic link at any component under the runs
directory, must be a regular file of bounded size, valid UTF-8, strict JSON (no NaN/Infinity,
no duplicate keys, bounded nesting) and valid for its model. A document that breaks a rule is
answered for THAT run only (422 naming the run and the rule; an error entry in ``/runs``); the
other runs are served normally and no answer is a 500. No interactive docs or schema are served.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from pipeline import __version__
from pipeline.core import strictjson
from pipeline.core.contracts import Grading, RunStatus, load_model, run_id_problem
from pipeline.core.documents import ReleaseSummary, parse_document
from pipeline.core.errors import ValidationError, escape_text
from pipeline.core.layout import ARTIFACTS_DIR, SUMMARY

# run.json is about 1 KB; grading.json and summary.json grow with the trials of a run.
MAX_STATUS_BYTES = 1 << 20
MAX_DOCUMENT_BYTES = 16 << 20
MAX_DEPTH = 32
# A run's document broke a rule: the request was fine, what the run holds cannot be served.
BAD_RUN = 422


class BadRun(Exception):
    """One run's document breaks a rule (the message names the file and the rule)."""


def _run_dir(runs: Path, run_id: str) -> Path:
    problem = run_id_problem(run_id, issued=False)
    if problem:
        raise HTTPException(status_code=400, detail=f"run_id: {problem}")
    return runs / run_id


def _check_tree(root: object, name: str) -> None:
    """Bounded nesting, and no lone surrogate (a ``\\ud800`` escape) in a string: it cannot be served as UTF-8."""
    stack: list[tuple[object, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                raise BadRun(f"{name}: nested deeper than {MAX_DEPTH} levels")
            children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRun(f"{name}: a string holds a lone surrogate escape (not encodable as UTF-8)") from None


def _open_nofollow(runs: Path, parts: tuple[str, ...]) -> int:
    """fd of ``runs/<parts...>``: no component under ``runs`` may be a symbolic link; the last must be a file."""
    where = "/".join(parts)
    fd = os.open(runs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            try:
                child = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(
                        os.path.join(runs, *parts[: index + 1]))):
                    raise BadRun(f"{where}: {'/'.join(parts[: index + 1])} is a symbolic link (not followed)") from None
                raise
            os.close(fd)
            fd = child
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadRun(f"{where}: not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_strict_json(runs: Path, parts: tuple[str, ...], limit: int) -> Any:
    """Parsed ``runs/<parts...>`` under every rule of the module docstring; FileNotFoundError when absent, else BadRun."""
    name = "/".join(parts)
    try:
        fd = _open_nofollow(runs, parts)
    except FileNotFoundError:
        raise
    except NotADirectoryError:
        raise FileNotFoundError(name) from None
    except OSError as exc:
        raise BadRun(f"{name}: cannot be opened ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise BadRun(f"{name}: cannot be read ({exc.strerror})") from None
    if len(data) > limit:
        raise BadRun(f"{name}: larger than {limit} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRun(f"{name}: not valid UTF-8 (byte {exc.start})") from None
    try:
        parsed = strictjson.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRun(f"{name}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise BadRun(f"{name}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # duplicate keys, NaN/Infinity, a number too long to convert
        raise BadRun(f"{name}: not valid JSON ({exc})") from None
    _check_tree(parsed, name)
    return parsed


def read_status(runs: Path, run_id: str) -> RunStatus:
    """run.json of ``run_id`` as a RunStatus; FileNotFoundError when absent, BadRun naming the rule otherwise."""
    data = read_strict_json(runs, (run_id, "run.json"), MAX_STATUS_BYTES)
    try:
        status = load_model(RunStatus, data, f"{run_id}/run.json")
    except ValidationError as exc:
        raise BadRun(exc.diagnostics()) from None
    if status.state == "SUCCEEDED" and (status.counts is None or status.score is None):
        # Served, a SUCCEEDED run without them reads as "succeeded, score unknown".
        raise BadRun(f"{run_id}/run.json: a SUCCEEDED run must carry counts and a finite score")
    if status.run_id != run_id:
        raise BadRun(f"{run_id}/run.json: run_id {status.run_id!r} is not the run's directory name")
    return status


def _bad_run(run_id: str, exc: BadRun) -> HTTPException:
    return HTTPException(status_code=BAD_RUN, detail=escape_text(str(exc)), headers={"X-Benchseal-Bad-Run": run_id})


def create_app(runs: Path) -> FastAPI:
    # No /docs, /redoc or /openapi.json: the service answers its routes and nothing else.
    app = FastAPI(title="benchseal api", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        # Still JSON when something unforeseen breaks (never a text/plain traceback page).
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}"}, status_code=500)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get("/runs")
    def list_runs() -> dict[str, list[dict[str, str]]]:
        found: list[dict[str, str]] = []
        try:
            names = sorted(entry.name for entry in os.scandir(runs))
        except OSError:
            names = []
        for name in names:
            if run_id_problem(name, issued=False):
                continue  # not a run's name: never echoed
            try:
                state = read_status(runs, name).state
            except FileNotFoundError:
                continue
            except BadRun as exc:
                found.append({"run_id": name, "state": "INVALID", "error": escape_text(str(exc))})
                continue
            found.append({"run_id": name, "state": state})
        return {"runs": found}

    @app.get("/runs/{run_id}")
    def get_run(run_id: str) -> dict[str, Any]:
        _run_dir(runs, run_id)
        try:
            return read_status(runs, run_id).model_dump(mode="json")
        except FileNotFoundError:
            raise HTTPException(status_code=404, detail=f"run {run_id} not found") from None
        except BadRun as exc:
            raise _bad_run(run_id, exc) from None

    @app.get("/runs/{run_id}/results")
    def get_results(run_id: str) -> Any:
        _run_dir(runs, run_id)
        try:
            data = read_strict_json(runs, (run_id, ARTIFACTS_DIR, SUMMARY), MAX_DOCUMENT_BYTES)
            try:
                return parse_document(ReleaseSummary, data, f"{run_id}/{SUMMARY}").to_json_dict()
            except ValidationError as exc:
                raise BadRun(exc.diagnostics()) from None
        except FileNotFoundError:
            raise HTTPException(status_code=404, detail=f"no results for run {run_id}") from None
        except BadRun as exc:
            raise _bad_run(run_id, exc) from None

    @app.get("/runs/{run_id}/grading")
    def get_grading(run_id: str) -> dict[str, Any]:
        _run_dir(runs, run_id)
        try:
            data = read_strict_json(runs, (run_id, "grading.json"), MAX_DOCUMENT_BYTES)
            try:
                grading = load_model(Grading, data, f"{run_id}/grading.json")
            except ValidationError as exc:
                raise BadRun(exc.diagnostics()) from None
            if grading.run_id != run_id:
                raise BadRun(f"{run_id}/grading.json names run {grading.run_id!r}, not {run_id}")
        except FileNotFoundError:
            raise HTTPException(status_code=404, detail=f"run {run_id} is not graded yet") from None
        except BadRun as exc:
            raise _bad_run(run_id, exc) from None
        return grading.model_dump(mode="json")

    return app
