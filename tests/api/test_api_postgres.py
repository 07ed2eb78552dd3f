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
