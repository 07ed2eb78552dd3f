"""FastAPI app: health, run list, run status (run.json), grading (grading.json), results (summary.json).

Reads ``<runs>/<run_id>/run.json`` (pipeline.contracts.RunStatus), ``<runs>/<run_id>/grading.json``
(pipeline.contracts.Grading: what the worker concluded, unsigned; on a production host, where the
worker only grades, this is all there is) and ``<runs>/<run_id>/artifacts/summary.json``
(pipeline.documents.ReleaseSummary: the sealed results, present where the run was sealed on this
host, e.g. ``release --local``); read-only, no state of its own.
Run ids are validated before they touch the filesystem (no traversal).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException

from pipeline import __version__
from pipeline.contracts import Grading, RunStatus, load_model
from pipeline.documents import ReleaseSummary, load_document
from pipeline.errors import ValidationError
from pipeline.layout import ARTIFACTS_DIR, SUMMARY

RUN_ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


def _run_dir(runs: Path, run_id: str) -> Path:
    if not RUN_ID_RE.match(run_id) or ".." in run_id:
        raise HTTPException(status_code=400, detail="run_id: must be 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit")
    path = runs / run_id
    if path.resolve().parent != runs.resolve():
        raise HTTPException(status_code=400, detail="run_id: must name a directory directly under the runs directory")
    return path


def _read_status(path: Path) -> RunStatus:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HTTPException(status_code=500, detail=f"run.json unreadable: {exc.__class__.__name__}") from None
    try:
        return load_model(RunStatus, data, "run.json")
    except ValidationError as exc:
        raise HTTPException(status_code=500, detail=exc.diagnostics()) from None


def create_app(runs: Path) -> FastAPI:
    app = FastAPI(title="benchseal api", version=__version__)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get("/runs")
    def list_runs() -> dict[str, list[dict[str, str]]]:
        found: list[dict[str, str]] = []
        if runs.is_dir():
            for child in sorted(runs.iterdir()):
                status_file = child / "run.json"
                if not (RUN_ID_RE.match(child.name) and status_file.is_file()):
                    continue
                try:
                    state = str(json.loads(status_file.read_text()).get("state", "UNKNOWN"))
                except (OSError, json.JSONDecodeError, AttributeError):
                    state = "UNREADABLE"
                found.append({"run_id": child.name, "state": state})
        return {"runs": found}

    @app.get("/runs/{run_id}")
    def get_run(run_id: str) -> dict[str, Any]:
        path = _run_dir(runs, run_id) / "run.json"
        if not path.is_file():
            raise HTTPException(status_code=404, detail=f"run {run_id} not found")
        return _read_status(path).model_dump(mode="json")

    @app.get("/runs/{run_id}/results")
    def get_results(run_id: str) -> Any:
        path = _run_dir(runs, run_id) / ARTIFACTS_DIR / SUMMARY
        if not path.is_file():
            raise HTTPException(status_code=404, detail=f"no results for run {run_id}")
        try:
            return load_document(ReleaseSummary, path).to_json_dict()
        except (OSError, ValidationError) as exc:
            raise HTTPException(status_code=500, detail=f"{SUMMARY} unreadable: {exc.__class__.__name__}") from None


    @app.get("/runs/{run_id}/grading")
    def get_grading(run_id: str) -> dict[str, Any]:
        path = _run_dir(runs, run_id) / "grading.json"
        if not path.is_file():
            raise HTTPException(status_code=404, detail=f"run {run_id} is not graded yet")
        try:
            grading = load_model(Grading, json.loads(path.read_text()), "grading.json")
        except (OSError, json.JSONDecodeError) as exc:
            raise HTTPException(status_code=500, detail=f"grading.json unreadable: {exc.__class__.__name__}") from None
        except ValidationError as exc:
            raise HTTPException(status_code=500, detail=exc.diagnostics()) from None
        if grading.run_id != run_id:
            raise HTTPException(status_code=500, detail=f"grading.json names run {grading.run_id}, not {run_id}")
        return grading.model_dump(mode="json")

    return app
