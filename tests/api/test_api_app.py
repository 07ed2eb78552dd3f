"""The API service (pipeline.api.app) over a real queue database, read-only: run status from the runs
table, each repository's history and results page from the releases table; hostile rows, an
unreachable queue, bad names; the real ``benchseal api serve`` over HTTP. No run directory is read."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import __version__
from pipeline.api import pages
from pipeline.api.app import QueueSource, create_app
from pipeline.core.contracts import DispatchPayload
from pipeline.core.errors import InfrastructureError, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.queue.reader import open_reader
from pipeline.infra.queue.sql import SCHEMA_VERSION, SqliteQueue
from tests.api.dom import parse
from tests.api.history import (
    API,
    HOSTILE_TASK,
    RELEASES,
    REPOSITORY,
    RUNNER,
    assert_refuses_queue_writes,
    http_get,
    seed,
)
from tests.registry.helpers import free_port, wait_listening


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "infra" / "queue.sqlite3"


@pytest.fixture
def seeded(db: Path) -> dict[str, str]:
    with SqliteQueue(db) as queue:
        run_ids = seed(queue).run_ids
        # A release whose tag needs quoting in a URL, in another repository; and a run still queued.
        run_ids["other"] = seed(queue, "Acme/Other-Repo", {"release/2.0": {"hello": (1, 1, 1)}}).run_ids["release/2.0"]
        payload = DispatchPayload.model_validate({
            "schema": "benchseal.dispatch/v1", "correlation_id": "api-queued-0001",
            "source": {"repository": REPOSITORY, "commit": "f" * 40, "tag": "v2.0.0"},
            "runner": RUNNER, "api": API, "suite": "smoke", "agent": "oracle"})
        run_ids["queued"], _ = queue.enqueue(payload, max_attempts=2)
    return run_ids


def _client(db: Path, **kw: Any) -> TestClient:
    return TestClient(create_app(QueueSource(lambda: open_reader(db)), **kw))


@pytest.fixture
def client(db: Path, seeded: dict[str, str]) -> TestClient:
    return _client(db)


def test_healthz(client: TestClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok", "version": __version__}


def test_runs_come_from_the_queue(client: TestClient, seeded: dict[str, str]) -> None:
    runs = {r["run_id"]: r for r in client.get("/runs").json()["runs"]}
    assert set(runs) == set(seeded.values())
    assert runs[seeded["queued"]]["state"] == "QUEUED" and runs[seeded["queued"]]["score"] is None
    assert runs[seeded["v1.2.0"]] | {"updated_at": "x"} == {
        "run_id": seeded["v1.2.0"], "state": "SUCCEEDED", "repository": REPOSITORY, "tag": "v1.2.0",
        "suite": "smoke", "updated_at": "x", "score": 0.5}


def test_run_status_grading_and_comparison(client: TestClient, seeded: dict[str, str]) -> None:
    status = client.get(f"/runs/{seeded['v1.2.0']}").json()
    assert status["state"] == "SUCCEEDED" and status["score"] == 0.5 and status["runner"] == RUNNER
    assert status["source"] == {"repository": REPOSITORY, "commit": status["source"]["commit"], "tag": "v1.2.0"}
    assert status["counts"] == {"total": 4, "completed": 4, "resolved": 2, "unresolved": 2, "infra_errors": 0}
    assert client.get(f"/runs/{seeded['queued']}").json()["state"] == "QUEUED"
    assert client.get(f"/runs/{seeded['v1.2.0']}/grading").json()["score"] == 0.5
    assert client.get(f"/runs/{seeded['queued']}/grading").status_code == 404
    comparison = client.get(f"/runs/{seeded['v1.2.0']}/comparison").json()
    assert comparison["schema"] == "benchseal.comparison/v1" and comparison["gated"] is True
    assert comparison["previous"]["tag"] == "v1.1.0" and HOSTILE_TASK in comparison["reasons"][1]
    assert client.get(f"/runs/{seeded['queued']}/comparison").status_code == 404


def test_unknown_and_invalid_run_ids(client: TestClient) -> None:
    r = client.get("/runs/run-" + "0" * 20)
    assert r.status_code == 404 and r.json() == {"detail": "run run-00000000000000000000 not found"}
    for path in ("/runs/run-" + "0" * 20 + "/grading", "/runs/run-" + "0" * 20 + "/comparison"):
        assert client.get(path).status_code == 404


@pytest.mark.parametrize("run_id", [".hidden", "run-a", "RUN-" + "a" * 20, "run-" + "A" * 20, "a%2F..%2Fx",
                                    "run-" + "a" * 21, "x" * 200, "run-%00" + "a" * 16, "%3Cscript%3E"])
def test_an_invalid_run_id_is_a_400_that_does_not_echo_it(client: TestClient, run_id: str) -> None:
    for suffix in ("", "/grading", "/comparison"):
        r = client.get(f"/runs/{run_id}{suffix}")
        assert r.status_code in (400, 404), (run_id, r.status_code)
        assert "<script" not in r.text and ("must be run-<20 lowercase hex>" in r.text or r.status_code == 404)


def test_history_json(client: TestClient, seeded: dict[str, str]) -> None:
    body = client.get("/repos/acme/widget/history").json()
    assert body["repository"] == REPOSITORY
    assert [r["tag"] for r in body["releases"]] == list(RELEASES)
    assert [r["gated"] for r in body["releases"]] == [False, False, True]
    assert body["releases"][0]["comparison"]["previous"] is None
    assert body["releases"][2]["comparison"]["previous"]["tag"] == "v1.1.0"
    assert body["releases"][2]["evidence"] == "https://github.com/acme/widget/releases/tag/v1.2.0"
    assert body["releases"][2]["summary_digest"] == "sha256:" + hashlib.sha256(b"v1.2.0").hexdigest()
    # Owner and name are case-insensitive (GitHub's rule), shown in their canonical form.
    assert client.get("/repos/ACME/Widget/history").json() == body
    other = client.get("/repos/acme/other-repo/history").json()["releases"][0]
    assert other["evidence"] == "https://github.com/acme/other-repo/releases/tag/release%2F2.0"
    assert client.get("/repos/acme/nothing/history").status_code == 404


@pytest.mark.parametrize("path", ["/repos/a..b/x", "/repos/-x/y", "/repos/x/%2E%2E", "/repos/%3Cb%3E/x", "/repos/o/" + "n" * 101,
                                  "/repos/o%20x/y", "/repos/o/n%0A"])
def test_an_invalid_repository_is_a_400(client: TestClient, path: str) -> None:
    page = client.get(path)
    assert page.status_code in (400, 404) and "<b>" not in page.text
    if page.status_code == 400:
        assert page.headers["content-type"].startswith("text/html") and "OWNER/NAME" in page.text
        assert client.get(path + "/history").status_code == 400


def test_results_page_is_html_with_no_external_asset_and_every_value_escaped(client: TestClient) -> None:
    r = client.get("/repos/acme/widget")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == pages.CSP
    assert "default-src 'none'" in pages.CSP and r.headers["x-content-type-options"] == "nosniff"
    text = r.text
    assert "<script" not in text and "<img" not in text and "onerror=alert(1)>" not in text.replace("&gt;", "")
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert 'a&amp;b &quot;q&quot; &lt;/td&gt;' in text
    # Nothing is fetched from elsewhere: the only URLs are links (a navigation) and the data: icon.
    dom = parse(text)
    for element in dom.iter():
        for name in ("src", "srcset", "data", "poster", "background", "action", "formaction"):
            assert name not in element.attrs, (element.tag, name)
        if element.tag == "link":
            assert element.attrs["href"].startswith("data:"), element.attrs
    # Every run, newest first (the queued v2.0.0 too), links to its tag's evidence.
    assert [a.attrs["href"] for a in dom.find("table", "releases").find_all("a", "evidence")] == [
        f"https://github.com/acme/widget/releases/tag/{tag}" for tag in ["v2.0.0", *reversed(RELEASES)]]


def test_release_links_follow_the_configured_base(db: Path, seeded: dict[str, str]) -> None:
    client = _client(db, release_url_base="https://ghe.example.com:8443/git")
    dom = parse(client.get("/repos/acme/other-repo").text)
    assert [a.attrs["href"] for a in dom.find("table", "releases").find_all("a", "evidence")] == [
        "https://ghe.example.com:8443/git/acme/other-repo/releases/tag/release%2F2.0"]
    for bad in ("ftp://x", "https://x/", "https://x?y=1", "https://x#f", "javascript:alert(1)", "https://x y"):
        with pytest.raises(ValidationError, match="--release-url-base"):
            create_app(QueueSource(lambda: open_reader(db)), release_url_base=bad)


def test_index_lists_the_repositories(client: TestClient) -> None:
    for path in ("/", "/repos"):
        dom = parse(client.get(path).text)
        links = {a.text: a.attrs["href"] for a in dom.find("ul", "repos").find_all("a")}
        assert links == {"acme/other-repo": "/repos/acme/other-repo", "acme/widget": "/repos/acme/widget"}


def test_a_repository_without_history_is_a_404_page(client: TestClient) -> None:
    r = client.get("/repos/acme/nothing")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert "No scored release of acme/nothing" in r.text and r.headers["content-security-policy"] == pages.CSP


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_no_interactive_docs_or_schema(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404 and r.json() == {"detail": "Not Found"}


def test_an_unreachable_queue_is_a_503_until_it_can_be_read(db: Path) -> None:
    client = _client(db)  # nothing there yet
    r = client.get("/runs")
    assert r.status_code == 503 and "does not exist" in r.json()["detail"]
    page = client.get("/repos/acme/widget")
    assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")
    assert client.get("/healthz").status_code == 200
    with SqliteQueue(db) as queue:
        seed(queue)
    before = _tree(db.parent)
    assert client.get("/runs").status_code == 200 and client.get("/repos/acme/widget").status_code == 200
    assert _tree(db.parent) == before, "the API changed something beside the queue"


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` but the wal-index files a reader creates: (size, mtime)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if not p.name.endswith(("-wal", "-shm"))}


def _tamper(db: Path, sql: str, *params: object) -> None:
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA ignore_check_constraints = ON")  # a corrupt file obeys no CHECK (a bad state)
        conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


# One corrupt row of each kind: (table, column, value). The API's answer must never be a 422 (that is for
# the client's input): the row is marked with its run id and why, and every other row is served.
_CORRUPT_RUNS = {
    "payload not JSON": ("payload", "{not json <script>"),
    "payload of the wrong shape": ("payload", '{"schema": "x", "runner": "<script>"}'),
    "payload a JSON list": ("payload", "[1, 2]"),
    "bad state": ("state", "<script>BOGUS"),
    "grading not JSON": ("grading", "\x00\x1b[31m"),
    "grading of the wrong shape": ("grading", '{"gated": "<script>"}'),
    "bad attempts": ("attempts", "many"),
    "bad correlation id": ("correlation_id", "<script>x"),
}
_CORRUPT_RELEASES = {
    "history entry not JSON": ("entry", "{"),
    "history entry of the wrong shape": ("entry", '{"tag": "<script>"}'),
    "comparison of the wrong shape": ("comparison", '{"gated": "<script>"}'),
}


@pytest.mark.parametrize("case", sorted(_CORRUPT_RUNS))
def test_a_corrupt_run_row_is_marked_and_every_other_run_is_served(db: Path, seeded: dict[str, str],
                                                                    case: str) -> None:
    column, value = _CORRUPT_RUNS[case]
    bad = seeded["v1.1.0"]
    _tamper(db, f"UPDATE runs SET {column} = ? WHERE run_id = ?", value, bad)
    client = _client(db)
    listed = client.get("/runs")
    assert listed.status_code == 200, listed.text
    runs = {r["run_id"]: r for r in listed.json()["runs"]}
    assert set(runs) == set(seeded.values())
    marked = runs[bad]
    assert marked["unreadable"].startswith(f"{'row' if column in ('attempts', 'correlation_id') else column}: ")
    assert "\n" not in marked["unreadable"] and "\x1b" not in marked["unreadable"]
    assert marked["state"] is None and marked["score"] is None
    for name, run_id in seeded.items():
        if run_id != bad:
            assert "unreadable" not in runs[run_id] and runs[run_id]["state"] in ("SUCCEEDED", "QUEUED"), name
    assert runs[seeded["v1.2.0"]]["score"] is not None
    for path in (f"/runs/{bad}", f"/runs/{bad}/grading"):
        one = client.get(path)
        assert one.status_code == 500 and one.headers["x-benchseal-bad-run"] == bad, (path, one.text)
        assert one.json()["detail"] == f"run {bad} is unreadable: {marked['unreadable']}"
    assert client.get(f"/runs/{seeded['v1.2.0']}").status_code == 200
    # The history is another table: the repository's page and history are whole.
    assert client.get("/repos/acme/widget").status_code == 200
    assert len(client.get("/repos/acme/widget/history").json()["releases"]) == 3
    for path in ("/runs", f"/runs/{bad}", "/repos/acme/widget", "/"):
        assert "<script" not in client.get(path).text


@pytest.mark.parametrize("case", sorted(_CORRUPT_RELEASES))
def test_a_corrupt_history_row_is_marked_and_every_other_release_is_served(db: Path, seeded: dict[str, str],
                                                                            case: str) -> None:
    column, value = _CORRUPT_RELEASES[case]
    bad = seeded["v1.1.0"]
    _tamper(db, f"UPDATE releases SET {column} = ? WHERE run_id = ?", value, bad)
    client = _client(db)
    history = client.get("/repos/acme/widget/history")
    assert history.status_code == 200, history.text
    releases = history.json()["releases"]
    assert [r.get("tag") for r in releases] == ["v1.0.0", None, "v1.2.0"]
    assert releases[1]["run_id"] == bad and releases[1]["unreadable"].startswith(f"history: {column}: ")
    page = client.get("/repos/acme/widget")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    dom = parse(page.text)
    assert "<script" not in page.text
    unreadable = dom.find("section", "unreadable")
    assert bad in unreadable.text and "unreadable: history: " in unreadable.text
    assert "v1.0.0" in page.text and "v1.2.0" in page.text
    index = client.get("/")
    assert index.status_code == 200 and "2 scored releases; newest v1.2.0" in index.text
    assert "1 unreadable row" in index.text
    comparison = client.get(f"/runs/{bad}/comparison")
    assert comparison.status_code == 500 and bad in comparison.json()["detail"]
    assert client.get(f"/runs/{bad}").status_code == 200  # its run row is sound
    assert client.get("/repos/acme/other-repo").status_code == 200


_COLUMNS = [("runs", "payload"), ("runs", "grading"), ("runs", "state"), ("runs", "created_at"),
            ("releases", "entry"), ("releases", "comparison"), ("releases", "summary_digest")]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(_COLUMNS), text=st.one_of(st.text(max_size=300), st.from_regex(r'\{"[a-z_]{1,12}": .{0,40}\}')))
def test_random_row_contents_never_make_a_422_or_an_anonymous_500(db: Path, seeded: dict[str, str],
                                                                  where: tuple[str, str], text: str) -> None:
    table, column = where
    run_id = seeded["v1.1.0"]
    _tamper(db, f"UPDATE {table} SET {column} = ? WHERE run_id = ?", text, run_id)
    client = _client(db)
    for path in ("/runs", "/", "/repos/acme/widget", "/repos/acme/widget/history"):
        r = client.get(path)
        assert r.status_code == 200, (table, column, text, path, r.status_code, r.text[:300])
        assert "<script" not in r.text
    for path in (f"/runs/{run_id}", f"/runs/{run_id}/grading", f"/runs/{run_id}/comparison"):
        r = client.get(path)
        assert r.status_code in (200, 404, 500), (table, column, text, path, r.status_code, r.text[:300])
        if r.status_code == 500:
            assert r.json()["detail"].startswith(f"run {run_id} is unreadable: "), (table, column, text, path, r.text)
        assert "<script" not in r.text


# --- read-only, for real ----------------------------------------------------------------------

def test_the_api_connection_cannot_write_the_queue(db: Path, seeded: dict[str, str]) -> None:
    source = QueueSource(lambda: open_reader(db))
    client = TestClient(create_app(source))
    assert client.get("/repos/acme/widget").status_code == 200
    queue = source.get()  # the very queue object the app reads through
    assert isinstance(queue, SqliteQueue) and queue.read_only
    before = {p.name: p.read_bytes() for p in db.parent.glob("queue.sqlite3*")}
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        queue._conn.execute("INSERT INTO events (run_id, at, event) VALUES ('run-x', 'now', 'written')")
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        queue._conn.execute("UPDATE runs SET state = 'FAILED'")
    assert_refuses_queue_writes(queue, "api-write-0001")
    with pytest.raises(InfrastructureError, match="read-only"):
        queue.record_summary(seeded["v1.0.0"], "sha256:" + "0" * 64)
    source.close()
    with SqliteQueue(db) as writer:
        assert writer.events(seeded["v1.0.0"])[-1].event != "written"
        assert [r.run_id for r in writer.list_runs()] == list(seeded.values())
    assert db.read_bytes() == before["queue.sqlite3"]


def _in_readonly_mount(directory: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by this interpreter in a mount namespace where ``directory`` is a read-only bind mount."""
    script = (f'mount --bind "{directory}" "{directory}" && mount -o remount,bind,ro "{directory}" && '
              f'exec "{sys.executable}" -c "$0"')
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, code],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)


_READ = ("from pathlib import Path; from pipeline.infra.queue.reader import open_reader\n"
         "q = open_reader(Path('{db}'))\n"
         "print(len(q.history('acme/widget')))\n"
         "import sqlite3\n"
         "try:\n    q._conn.execute(\"INSERT INTO events (run_id, at, event) VALUES ('x', 'y', 'z')\")\n"
         "except sqlite3.OperationalError as exc:\n    print('refused:', exc)\n")


@pytest.mark.skipif(subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False).returncode != 0,
                    reason="no mount namespaces here (unshare --mount)")
def test_on_a_read_only_mount_the_reader_needs_the_wal_files_the_host_check_leaves(db: Path, seeded: dict[str, str]) -> None:
    """The container's view: the queue's directory read-only. Without -wal/-shm (no writer has it open)
    a read fails in one line; a read-only open on the host (what `api check-image` does) leaves them."""
    assert not db.with_name("queue.sqlite3-wal").exists(), "the seeding writer's close removed them"
    code = _READ.replace("{db}", str(db))
    failed = _in_readonly_mount(db.parent, code)
    assert failed.returncode != 0 and "opened read-only, and reading it needs its -wal and -shm files" in failed.stderr, failed.stderr
    with open_reader(db) as host_side:  # the directory is writable here
        assert len(host_side.history("acme/widget")) == 3
    assert db.with_name("queue.sqlite3-wal").exists() and db.with_name("queue.sqlite3-shm").exists()
    done = _in_readonly_mount(db.parent, code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["3", "refused: attempt to write a readonly database"]
    # A writer that opens and closes meanwhile (the worker) leaves them too while a reader is open.


# --- the real `benchseal api serve` over HTTP ---------------------------------------------------

@pytest.fixture
def served(db: Path, seeded: dict[str, str]) -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "api", "serve", "--port", str(port), "--queue-db", str(db)],
                            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_listening(port, "api serve", alive=lambda: proc.poll() is None)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_over_http(served: int, seeded: dict[str, str]) -> None:
    status, headers, body = http_get(served, "/repos/acme/widget")
    assert status == 200 and headers["content-security-policy"] == pages.CSP
    assert b"&lt;img src=x onerror=alert(1)&gt;" in body
    status, headers, body = http_get(served, f"/runs/{seeded['v1.0.0']}")
    assert status == 200 and json.loads(body)["state"] == "SUCCEEDED"
    status, headers, body = http_get(served, "/runs/..%2F..%2Fetc%2Fpasswd")
    assert status in (400, 404) and headers["content-type"].startswith("application/json")


def test_serve_refuses_two_queues_and_a_bad_url_base(db: Path, seeded: dict[str, str], tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    url_file.write_text("postgresql://reader@/q?host=/nowhere\n")
    both = subprocess.run([sys.executable, "-m", "pipeline", "api", "serve", "--queue-db", str(db), "--queue-url-file",
                           str(url_file)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert both.returncode == 2 and "give exactly one" in both.stderr
    bad = subprocess.run([sys.executable, "-m", "pipeline", "api", "serve", "--queue-db", str(db), "--release-url-base",
                          "javascript:x"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--release-url-base" in bad.stderr


# --- `api serve` refuses what is not a queue before it serves ------------------------------------

def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``api serve`` on a free port; a refusal ends it before uvicorn starts (the timeout would fire otherwise)."""
    return subprocess.run([sys.executable, "-m", "pipeline", "api", "serve", "--port", str(free_port()), *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
                          env={k: v for k, v in os.environ.items() if not k.startswith("BENCHSEAL_QUEUE_URL")}
                          | (env or {}))


def _not_a_queue(kind: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "empty file":
        path.write_bytes(b"")
    elif kind == "random bytes":
        path.write_bytes(os.urandom(8192))
    elif kind == "text":
        path.write_text("SQLite format 2 is not this\n")
    elif kind == "sqlite without the queue's tables":
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, data BLOB)")
            conn.commit()
    elif kind == "sqlite without any table":
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA user_version = 1")  # writes the header page: a real, empty database
            conn.commit()
    elif kind == "a directory":
        path.mkdir()


_NOT_QUEUES = {"empty file": "is empty", "random bytes": "is not an SQLite database",
               "text": "is not an SQLite database", "sqlite without the queue's tables": "without the queue's tables",
               "sqlite without any table": "without the queue's tables", "a directory": "is not a regular file"}
# (An absent file is a new infra host's: nothing accepted yet. The API starts and answers 503 until it appears:
# tests/imaging/test_build_images.py::test_api_pulled_by_digest_answers_healthz.)


@pytest.mark.parametrize("kind", sorted(_NOT_QUEUES))
def test_serve_refuses_a_file_that_is_not_a_queue_before_serving(tmp_path: Path, kind: str) -> None:
    db = tmp_path / "infra" / "queue.sqlite3"
    _not_a_queue(kind, db)
    before = sorted(p.name for p in db.parent.iterdir()) if db.parent.exists() else []
    refused = _serve("--queue-db", str(db))
    assert refused.returncode == 2, (refused.returncode, refused.stderr[-2000:])
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert lines[0].startswith("benchseal: error: invalid --queue-db: must name a benchseal queue database: "), lines[0]
    assert _NOT_QUEUES[kind] in lines[0] and str(db) in lines[0]
    assert "Uvicorn running" not in refused.stderr and "Started server" not in refused.stderr
    assert (sorted(p.name for p in db.parent.iterdir()) if db.parent.exists() else []) == before


def test_serve_refuses_a_queue_whose_schema_is_behind(db: Path, seeded: dict[str, str]) -> None:
    _tamper(db, "DELETE FROM schema_migrations WHERE version > 2")
    refused = _serve("--queue-db", str(db))
    assert refused.returncode == 1, (refused.returncode, refused.stderr[-2000:])
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert lines[0] == (f"benchseal: error: --queue-db: queue database {db.resolve()} is at schema version 2, "
                        f"this benchseal needs {SCHEMA_VERSION}: run `benchseal infra migrate`")


def test_serve_refuses_a_corrupt_queue(db: Path, seeded: dict[str, str]) -> None:
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[100:page] = bytes([0xA5]) * (page - 100)  # the schema page garbled, the header kept
    db.write_bytes(bytes(data))
    refused = _serve("--queue-db", str(db))
    assert refused.returncode == 1, (refused.returncode, refused.stderr[-2000:])
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert lines[0].startswith(f"benchseal: error: --queue-db: queue database {db.resolve()}: corrupt"), lines[0]
