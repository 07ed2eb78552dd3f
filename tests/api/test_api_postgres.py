"""The API on a PostgreSQL queue (a real, throwaway cluster): it connects as a role granted SELECT
only (``benchseal api grant-reader``), serves the history through it, and neither that role nor the
API's sessions can write; a role that may write is refused."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from fastapi.testclient import TestClient

from pipeline.api.app import QueueSource, create_app
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.queue.postgres import PostgresQueue
from pipeline.infra.queue.reader import READER_TABLES, grant_reader, open_reader, reader_grants, writable_tables
from tests.api.history import REPOSITORY, assert_refuses_queue_writes, seed
from tests.doubles.postgres import PgCluster
from tests.registry.helpers import free_port

ROLE = "benchseal_api"


def _as(url: str, user: str) -> str:
    """``url`` with another user (the cluster trusts local connections: no password)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname or ''}"))


@pytest.fixture
def owner_url(pg_cluster: PgCluster) -> str:
    url = pg_cluster.new_database()
    with PostgresQueue(url) as queue:
        seed(queue)
    return url


@pytest.fixture
def reader_url(owner_url: str) -> str:
    with PostgresQueue(owner_url) as queue:
        statements = grant_reader(queue, ROLE)
    assert any(s.startswith("GRANT SELECT ON TABLE") for s in statements)
    return _as(owner_url, ROLE)


def test_the_reader_role_may_select_and_nothing_else(reader_url: str) -> None:
    with psycopg.connect(reader_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM releases").fetchone() == (3,)
        for table in READER_TABLES:
            conn.execute(f"SELECT * FROM {table} LIMIT 1")
        for sql in ("INSERT INTO events (run_id, at, event) VALUES ('run-x', 'now', 'written')",
                    "UPDATE runs SET state = 'FAILED'", "DELETE FROM releases", "TRUNCATE publications",
                    "SELECT * FROM trials", "SELECT * FROM events", "SELECT * FROM publications",
                    "INSERT INTO releases SELECT * FROM releases"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)


def test_the_api_reads_through_the_reader_and_cannot_write(reader_url: str, owner_url: str) -> None:
    source = QueueSource(lambda: open_reader(url=reader_url))
    client = TestClient(create_app(source))
    page = client.get("/repos/acme/widget")
    assert page.status_code == 200 and "&lt;img src=x onerror=alert(1)&gt;" in page.text
    assert [r["tag"] for r in client.get("/repos/acme/widget/history").json()["releases"]] == ["v1.0.0", "v1.1.0", "v1.2.0"]
    assert len(client.get("/runs").json()["runs"]) == 3
    queue = source.get()
    assert isinstance(queue, PostgresQueue) and queue.read_only
    assert writable_tables(queue) == []
    assert_refuses_queue_writes(queue, "api-pg-write-0001")
    # Its session refuses a write even where the role's grants would not (defence in depth).
    def write(cur: object) -> None:
        cur.execute("INSERT INTO events (run_id, at, event) VALUES ('run-x', 'now', 'written')")  # type: ignore[attr-defined]

    with pytest.raises(InfrastructureError, match=r"read-only transaction|permission denied"):
        queue._run(write, write=True)
    source.close()
    with PostgresQueue(owner_url) as owner, psycopg.connect(owner_url) as conn:
        assert conn.execute("SELECT count(*) FROM events WHERE event = 'written'").fetchone() == (0,)
        assert len(owner.list_runs()) == 3


def test_a_session_of_a_read_only_queue_refuses_writes_even_for_the_owner(owner_url: str) -> None:
    with PostgresQueue(owner_url, read_only=True) as queue:
        def write(cur: object) -> None:
            cur.execute("INSERT INTO events (run_id, at, event) VALUES ('run-x', 'now', 'written')")  # type: ignore[attr-defined]

        with pytest.raises(InfrastructureError, match="read-only transaction"):
            queue._run(write, write=True)


def test_the_api_refuses_a_role_that_may_write(owner_url: str) -> None:
    with pytest.raises(CheckFailed, match=r"its role may write .*runs.*grant-reader"):
        open_reader(url=owner_url)
    client = TestClient(create_app(QueueSource(lambda: open_reader(url=owner_url))))
    r = client.get("/runs")
    assert r.status_code == 503 and "may write" in r.json()["detail"] and "password" not in r.text


def test_grant_is_idempotent_and_narrows_an_existing_role(owner_url: str) -> None:
    role = f"reader_{uuid.uuid4().hex[:8]}"  # roles are the cluster's, shared by every test's database
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT INSERT, SELECT ON events TO {role}")
    with PostgresQueue(owner_url) as queue:
        grant_reader(queue, role)
        grant_reader(queue, role)
    with psycopg.connect(_as(owner_url, role), autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("INSERT INTO events (run_id, at, event) VALUES ('run-x', 'now', 'written')")


def test_grant_sql_and_role_names() -> None:
    statements = reader_grants(ROLE, 'queue "db"', "public")
    assert statements[1] == f'GRANT CONNECT ON DATABASE "queue ""db""" TO "{ROLE}"'
    assert statements[-1] == f'GRANT SELECT ON TABLE "public".schema_migrations, "public".runs, "public".releases TO "{ROLE}"'
    for bad in ("Reader", "x;drop", "pg_read", "a b", "", "x" * 64, "r'1"):
        with pytest.raises(ValidationError, match="role name"):
            reader_grants(bad, "db")


def test_grant_reader_verb(owner_url: str, tmp_path: Path) -> None:
    url_file = tmp_path / "owner-url"
    url_file.write_text(owner_url + "\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BENCHSEAL_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "pipeline", "api", "grant-reader", "api_reader", "--queue-url-file",
                           str(url_file)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["role"] == "api_reader" and owner_url not in done.stdout
    with PostgresQueue(_as(owner_url, "api_reader"), read_only=True) as queue:
        assert writable_tables(queue) == [] and len(queue.history(REPOSITORY)) == 3
    printed = subprocess.run([sys.executable, "-m", "pipeline", "api", "grant-reader", "api_reader", "--sql",
                              "--database", "benchseal"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                             check=False, env=env)
    assert printed.returncode == 0 and 'GRANT SELECT ON TABLE "public".schema_migrations' in printed.stdout


def _serve_url(url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``api serve --queue-url-file`` that must refuse (it would serve until the timeout otherwise)."""
    url_file = tmp_path / "api-url"
    url_file.write_text(url + "\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BENCHSEAL_HOME": str(tmp_path / "home")}
    port = str(free_port())
    return subprocess.run([sys.executable, "-m", "pipeline", "api", "serve", "--port", port, "--queue-url-file",
                           str(url_file)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
                          env=env)


def test_serve_refuses_a_database_that_holds_no_queue(pg_cluster: PgCluster, tmp_path: Path) -> None:
    name = f"empty_{uuid.uuid4().hex[:12]}"  # a database of the cluster without the queue's schema
    with psycopg.connect(pg_cluster.url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    refused = _serve_url(pg_cluster.url(name), tmp_path)
    assert refused.returncode == 2, refused.stderr[-2000:]
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert lines[0].startswith("benchseal: error: invalid --queue-url-file: must name a benchseal queue database: "
                               "queue database ") and "holds no benchseal queue" in lines[0], lines[0]
    assert "password" not in refused.stderr


def test_serve_refuses_a_queue_behind_or_a_role_that_may_write(owner_url: str, reader_url: str,
                                                               tmp_path: Path) -> None:
    writer = _serve_url(owner_url, tmp_path)
    assert writer.returncode == 1 and len(writer.stderr.strip().splitlines()) == 1, writer.stderr[-2000:]
    assert writer.stderr.startswith("benchseal: error: --queue-url-file: queue database ") and "may write" in writer.stderr
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("DELETE FROM schema_migrations WHERE version > 2")
    behind = _serve_url(reader_url, tmp_path)
    assert behind.returncode == 1 and len(behind.stderr.strip().splitlines()) == 1, behind.stderr[-2000:]
    assert "--queue-url-file: queue database " in behind.stderr and "is at schema version 2" in behind.stderr
