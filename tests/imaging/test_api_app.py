"""The api service (pipeline.api.app): FastAPI's TestClient, and the real ``benchseal api serve`` over HTTP,
over real run directories, hostile ones included."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import __version__
from pipeline.api.app import create_app
from pipeline.core.paths import REPO_ROOT
from pipeline.evidence.artifacts import build_summary
from tests.fixtures.sigstore import make_inputs
from tests.registry.helpers import free_port, wait_listening

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
        "score": 1.0 if state == "SUCCEEDED" else None,
        "counts": {"total": 3, "completed": 3, "resolved": 3, "unresolved": 0, "infra_errors": 0},
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
    assert r.status_code == 422
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
    assert client.get("/runs/run-a/results").status_code == 422
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
    assert r.status_code == 422
    assert "grading" in r.json()["detail"].lower() or "score" in r.json()["detail"]


# --- the real `benchseal api serve` over HTTP, hostile run directories -------------------------------

SECRET = "bs-api-secret-" + "9" * 16


class _Served:
    def __init__(self, runs: Path, port: int) -> None:
        self.runs = runs
        self.port = port

    def get(self, path: str) -> tuple[int, Any, bytes]:
        """Status, the JSON body (every answer must be JSON) and the raw body."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            raw = response.read()
            assert response.getheader("Content-Type", "").startswith("application/json"), (path, response.status, raw[:200])
            return response.status, json.loads(raw), raw
        finally:
            conn.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Served]:
    runs = tmp_path_factory.mktemp("api-runs")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "api", "serve", "--port", str(port), "--runs", str(runs)],
                            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_listening(port, "api serve", alive=lambda: proc.poll() is None)
        yield _Served(runs, port)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _reset(runs: Path) -> None:
    for child in runs.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    for run_id, state in (("run-a", "SUCCEEDED"), ("run-b", "RUNNING")):
        (runs / run_id).mkdir()
        (runs / run_id / "run.json").write_text(json.dumps(_status(run_id, state)))


def _doc(**changes: Any) -> bytes:
    return json.dumps({**_status("run-x"), **changes}).encode()


def _secret_file(runs: Path) -> Path:
    outside = runs.parent / f"{runs.name}-outside"
    outside.mkdir(exist_ok=True)
    (outside / "run.json").write_bytes(json.dumps({**_status("run-x"), "suite": SECRET}).encode())
    return outside


def _symlinked_file(runs: Path) -> None:
    (runs / "run-x").mkdir()
    (runs / "run-x" / "run.json").symlink_to(_secret_file(runs) / "run.json")


def _symlinked_dir(runs: Path) -> None:
    (runs / "run-x").symlink_to(_secret_file(runs))


def _fifo(runs: Path) -> None:
    (runs / "run-x").mkdir()
    os.mkfifo(runs / "run-x" / "run.json")


def _directory(runs: Path) -> None:
    (runs / "run-x" / "run.json").mkdir(parents=True)


def _writes(data: bytes) -> Any:
    def make(runs: Path) -> None:
        (runs / "run-x").mkdir()
        (runs / "run-x" / "run.json").write_bytes(data)
    return make


_NAN_COUNTS = {"total": 1, "completed": 1, "resolved": 1, "unresolved": 0, "infra_errors": 0}

# case -> (how the bad run is made, a word of the rule its error must name)
BAD_RUNS: dict[str, tuple[Any, str]] = {
    "invalid UTF-8": (_writes(_doc()[:-2] + b', "x": "\xff\xfe"}'), "UTF-8"),
    "overlong UTF-8 slash": (_writes(_doc(suite="a").replace(b'"a"', b'"\xc0\xaf"')), "UTF-8"),
    "deeply nested (past the recursion limit)": (_writes(b"[" * 100_000 + b"]" * 100_000), "nested deeper"),
    "nested just past the depth bound": (_writes(_doc(suite=json.loads("[" * 40 + "]" * 40))), "nested deeper"),
    "NaN score on a SUCCEEDED run": (_writes(_doc()[:-1] + b', "score": NaN}'), "NaN"),
    "-Infinity score": (_writes(_doc().replace(b'"score": 1.0', b'"score": -Infinity')), "Infinity"),
    "score 1e999 (parses as inf)": (_writes(_doc().replace(b'"score": 1.0', b'"score": 1e999')), "finite"),
    "SUCCEEDED without a score": (_writes(_doc(score=None, counts=_NAN_COUNTS)), "finite number"),
    "SUCCEEDED without counts": (_writes(_doc(counts=None)), "counts"),
    "SUCCEEDED with a score its counts do not give": (_writes(_doc(score=0.5)), "resolved / completed"),
    "duplicate key": (_writes(_doc()[:-1] + b', "state": "FAILED"}'), "duplicate"),
    "lone surrogate escape": (_writes(_doc(suite="a").replace(b'"a"', b'"\\ud800"')), "surrogate"),
    "a 5000-digit integer": (_writes(_doc().replace(b'"attempts": 1', b'"attempts": 1' + b"0" * 5000)), "JSON"),
    "not an object": (_writes(b"[1, 2, 3]"), "run.json"),
    "empty": (_writes(b""), "JSON"),
    "bigger than the bound": (_writes(_doc()[:-1] + b', "pad": "' + b"x" * (1 << 20) + b'"}'), "larger than"),
    "names another run": (_writes(_doc(run_id="run-a")), "directory name"),
    "symlinked run.json": (_symlinked_file, "symbolic link"),
    "symlinked run directory": (_symlinked_dir, "symbolic link"),
    "a FIFO named run.json": (_fifo, "regular file"),
    "a directory named run.json": (_directory, "regular file"),
}


@pytest.mark.parametrize("case", list(BAD_RUNS))
def test_a_bad_run_is_an_error_for_that_run_only(served: _Served, case: str) -> None:
    make, rule = BAD_RUNS[case]
    _reset(served.runs)
    make(served.runs)
    status, listing, raw = served.get("/runs")
    assert status == 200, (case, listing)
    assert SECRET.encode() not in raw
    runs = {entry["run_id"]: entry for entry in listing["runs"]}
    # The other runs are listed normally.
    assert runs["run-a"] == {"run_id": "run-a", "state": "SUCCEEDED"} and runs["run-b"] == {"run_id": "run-b", "state": "RUNNING"}
    bad = runs["run-x"]
    assert bad["state"] == "INVALID" and "run-x" in bad["error"] and rule in bad["error"], (case, bad)
    status, body, raw = served.get("/runs/run-x")
    assert status == 422 and rule in body["detail"] and "run-x" in body["detail"], (case, status, body)
    assert SECRET.encode() not in raw
    assert served.get("/runs/run-a")[0] == 200


def test_a_symlinked_summary_or_grading_is_refused(served: _Served) -> None:
    _reset(served.runs)
    outside = _secret_file(served.runs)
    (served.runs / "run-a" / "artifacts").symlink_to(outside)
    (served.runs / "run-a" / "grading.json").symlink_to(outside / "run.json")
    for path in ("/runs/run-a/results", "/runs/run-a/grading"):
        status, body, raw = served.get(path)
        assert status == 422 and "symbolic link" in body["detail"], (path, body)
        assert SECRET.encode() not in raw


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_no_interactive_docs_or_schema(served: _Served, path: str) -> None:
    status, body, _ = served.get(path)
    assert status == 404 and body == {"detail": "Not Found"}


def _spliced(valid: bytes) -> st.SearchStrategy[bytes]:
    # Random bytes, and a valid run.json with random bytes written over, into or cut from it.
    def splice(data: tuple[int, int, bytes]) -> bytes:
        start, cut, junk = data
        start %= len(valid) + 1
        return valid[:start] + junk + valid[start + cut:]
    return st.one_of(st.binary(max_size=4096),
                     st.tuples(st.integers(0, 4096), st.integers(0, 64), st.binary(max_size=64)).map(splice))


@settings(max_examples=300, deadline=None)
@given(data=_spliced(_doc()))
def test_random_run_json_bytes_never_make_a_500(served: _Served, data: bytes) -> None:
    run_dir = served.runs / "run-x"
    run_dir.mkdir(exist_ok=True)
    (run_dir / "run.json").write_bytes(data)
    status, listing, _ = served.get("/runs")
    assert status == 200
    entry = next(e for e in listing["runs"] if e["run_id"] == "run-x")
    status, body, _ = served.get("/runs/run-x")
    assert status in (200, 422), (status, body)
    assert (status == 200) == ("error" not in entry)
