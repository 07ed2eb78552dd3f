"""The api service (pipeline.api.app) with FastAPI's TestClient over real run directories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pipeline import __version__
from pipeline.api.app import create_app
from pipeline.evidence.artifacts import build_summary
from tests.fixtures.sigstore import make_inputs

REF = "127.0.0.1:5055/benchseal/runner@sha256:" + "a" * 64
API = "127.0.0.1:5055/benchseal/api@sha256:" + "b" * 64


def _status(run_id: str, state: str = "SUCCEEDED") -> dict[str, object]:
    return {
        "run_id": run_id,
        "correlation_id": "corr-12345678",
        "state": state,
        "attempts": 1,
        "suite": "smoke",
        "agent": "oracle",
        "source": {"repository": "local/benchseal", "commit": "c" * 40, "tag": "v1.0.0"},
        "runner": REF,
        "api": API,
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:01:00Z",
        "score": 1.0,
    }


def _summary() -> dict[str, Any]:
    grading, payload = make_inputs({"runner": "127.0.0.1:5055/x/runner@sha256:" + "1" * 64,
                                    "api": "127.0.0.1:5055/x/api@sha256:" + "2" * 64})
    return build_summary(grading, payload).to_json_dict()


_SUMMARY = _summary()


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    for run_id, state in (("run-a", "SUCCEEDED"), ("run-b", "RUNNING")):
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "run.json").write_text(json.dumps(_status(run_id, state)))
    (tmp_path / "run-a" / "artifacts").mkdir()
    (tmp_path / "run-a" / "artifacts" / "summary.json").write_text(json.dumps(_SUMMARY))
    (tmp_path / "no-status").mkdir()
    return tmp_path


@pytest.fixture
def client(runs: Path) -> TestClient:
    return TestClient(create_app(runs))


def test_healthz(client: TestClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "version": __version__}


def test_lists_runs_with_state(client: TestClient) -> None:
    assert client.get("/runs").json() == {"runs": [{"run_id": "run-a", "state": "SUCCEEDED"}, {"run_id": "run-b", "state": "RUNNING"}]}


def test_missing_runs_directory_lists_nothing(tmp_path: Path) -> None:
    assert TestClient(create_app(tmp_path / "absent")).get("/runs").json() == {"runs": []}


def test_run_status_is_validated_run_json(client: TestClient) -> None:
    r = client.get("/runs/run-b")
    assert r.status_code == 200
    assert r.json()["state"] == "RUNNING"
    assert r.json()["runner"] == REF


def test_unknown_run_is_404(client: TestClient) -> None:
    assert client.get("/runs/nope").status_code == 404
    assert client.get("/runs/no-status").status_code == 404


def test_invalid_run_json_is_an_error_not_a_pass_through(client: TestClient, runs: Path) -> None:
    bad = _status("run-c")
    bad["runner"] = "127.0.0.1:5055/benchseal/runner:latest"
    (runs / "run-c").mkdir()
    (runs / "run-c" / "run.json").write_text(json.dumps(bad))
    r = client.get("/runs/run-c")
    assert r.status_code == 500
    assert "runner" in r.json()["detail"]


@pytest.mark.parametrize("run_id", ["..", ".hidden", "a%2F..%2F..%2Fetc", "..%2Frun-a", "a b", "x" * 200])
def test_run_id_cannot_escape_the_runs_directory(client: TestClient, run_id: str) -> None:
    r = client.get(f"/runs/{run_id}")
    assert r.status_code in (400, 404)
    assert "SUCCEEDED" not in r.text


def test_results_when_present_and_404_otherwise(client: TestClient) -> None:
    assert client.get("/runs/run-a/results").json() == _SUMMARY
    assert client.get("/runs/run-b/results").status_code == 404


def test_results_are_served_through_the_summary_model(client: TestClient, runs: Path) -> None:
    """A summary.json that is not a benchseal.summary/v1 document is an error, never passed through."""
    (runs / "run-a" / "artifacts" / "summary.json").write_text(json.dumps({"score": 1.0, "run_id": "run-a"}))
    assert client.get("/runs/run-a/results").status_code == 500
    assert client.get("/runs/..%2Frun-a/results").status_code in (400, 404)


def _grading(run_id: str) -> dict[str, Any]:
    grading, _ = make_inputs({"runner": REF, "api": API})
    return {**grading.model_dump(mode="json"), "run_id": run_id}


def test_grading_is_served_where_the_worker_only_grades(client: TestClient, runs: Path) -> None:
    """A production host has grading.json and no summary.json (the seal job signs elsewhere)."""
    (runs / "run-b" / "grading.json").write_text(json.dumps(_grading("run-b")))
    served = client.get("/runs/run-b/grading")
    assert served.status_code == 200
    assert served.json() == _grading("run-b")
    assert client.get("/runs/run-b/results").status_code == 404  # not sealed here
    assert client.get("/runs/run-a/grading").status_code == 404  # not graded


@pytest.mark.parametrize("breakage", ["not-json", "bad-score", "other-run"])
def test_a_broken_grading_is_an_error_not_a_pass_through(client: TestClient, runs: Path, breakage: str) -> None:
    grading = _grading("run-b")
    if breakage == "not-json":
        text = "{"
    elif breakage == "bad-score":
        text = json.dumps({**grading, "score": 2.0})
    else:
        text = json.dumps({**grading, "run_id": "run-a"})
    (runs / "run-b" / "grading.json").write_text(text)
    r = client.get("/runs/run-b/grading")
    assert r.status_code == 500
    assert "grading" in r.json()["detail"].lower() or "score" in r.json()["detail"]
