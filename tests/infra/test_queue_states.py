"""The queue's states have one home each: ``RunState`` (pipeline.core.contracts), ``TrialState`` and
``PublicationState`` (pipeline.infra.queue.records). The schema's CHECKs, the SQL and the code read
them; these tests tie the three together on both backends and keep stored schemas unchanged."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sqlite3
from enum import StrEnum
from pathlib import Path
from typing import get_args

import psycopg
import pytest

from pipeline.core.contracts import RunOutcome, RunState
from pipeline.infra.queue.records import ACTIVE_STATES, TERMINAL_STATES, PublicationState, TrialState
from pipeline.infra.queue.schema import POSTGRESQL, SCHEMA_VERSION, SQLITE, migration, sql_list, sql_text
from tests.fixtures.infra import QueueSpec

QUEUE_CODE = Path(__file__).resolve().parents[2] / "pipeline" / "infra" / "queue"
STATES: dict[str, type[StrEnum]] = {"runs": RunState, "trials": TrialState, "publications": PublicationState}
EVERY_STATE = {state.value for enum in STATES.values() for state in enum}

# The statements of schema versions 1..6 as existing databases hold them (SQLite keeps each CREATE's
# text in sqlite_master). Generated from the enums now: a state added to an enum changes this and
# needs a NEW migration (with its own CHECK), never an edited old one.
PINNED_MIGRATIONS = {
    "sqlite": (6, "50ec70e8410afe2153560e3a18bcbef5c03b974d2901d01143deae5375505611"),
    "postgresql": (6, "50f38e99b0a63fca4003edf57ebd1a494ff4729f910a3be62c82eb01f637eceb"),
}


def _quoted(text: str) -> set[str]:
    return set(re.findall(r"'([A-Z_]+)'", text))


def test_migrations_are_byte_identical_to_the_stored_schemas() -> None:
    for dialect in (SQLITE, POSTGRESQL):
        versions, digest = PINNED_MIGRATIONS[dialect.name]
        statements = [migration(dialect, v) for v in range(1, versions + 1)]
        assert hashlib.sha256(json.dumps(statements).encode()).hexdigest() == digest, dialect.name
    assert SCHEMA_VERSION >= 6


def test_the_enums_are_consistent() -> None:
    assert TERMINAL_STATES == {RunState(outcome) for outcome in get_args(RunOutcome)}  # the grader's outcomes
    assert ACTIVE_STATES == {RunState.CLAIMED, RunState.RUNNING}
    assert not TERMINAL_STATES & ACTIVE_STATES and RunState.QUEUED not in TERMINAL_STATES | ACTIVE_STATES
    assert sql_list([RunState.RUNNING, RunState.CLAIMED]) == "('CLAIMED','RUNNING')"  # enum order, every process
    assert sql_text(TrialState.DONE) == "'DONE'"


def test_sqlite_checks_are_the_enums(queue_db: Path) -> None:
    QueueSpec("sqlite", str(queue_db), str(queue_db.parent / "runs")).open().close()
    with sqlite3.connect(queue_db) as db:
        for table, enum in STATES.items():
            (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
            check = re.search(r"state TEXT NOT NULL CHECK \(state IN (\([^)]*\))\)", sql)
            assert check is not None, sql
            assert check.group(1) == sql_list(enum), table
            assert _quoted(check.group(1)) == {s.value for s in enum}, table


def test_postgresql_checks_are_the_enums(pg_cluster, tmp_path: Path) -> None:
    spec = QueueSpec("postgresql", pg_cluster.new_database(), str(tmp_path / "runs"))
    spec.open().close()
    with psycopg.connect(spec.target) as db:
        for table, enum in STATES.items():
            rows = db.execute(
                "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid"
                " WHERE t.relname = %s AND c.contype = 'c'", (table,)).fetchall()
            checks = [str(r[0]) for r in rows if re.match(r"CHECK \(\(?state\b", str(r[0]))]
            assert len(checks) == 1, rows
            assert _quoted(checks[0]) == {s.value for s in enum}, (table, checks[0])


def _stray_states(source: str) -> list[tuple[int, str]]:
    """String constants in ``source`` that spell a state (``"QUEUED"``, or ``'QUEUED'`` inside SQL),
    outside the StrEnum classes that define them and outside docstrings."""
    tree = ast.parse(source)
    exempt: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id == "StrEnum" for b in node.bases):
            exempt.update(id(n) for n in ast.walk(node))
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                exempt.add(id(body[0].value))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in exempt:
            if node.value in EVERY_STATE or _quoted(node.value) & EVERY_STATE:
                found.append((node.lineno, node.value))
    return found


def test_no_state_is_spelled_out_in_the_queue_code() -> None:
    files = sorted(QUEUE_CODE.glob("*.py"))
    assert len(files) >= 8
    stray = {f.name: hits for f in files if (hits := _stray_states(f.read_text()))}
    assert stray == {}, "name states through RunState/TrialState/PublicationState (SQL: schema.sql_text / sql_list)"


@pytest.mark.parametrize("line", [
    "cur.execute(\"UPDATE runs SET state = 'QUEUED' WHERE run_id = ?\", (run_id,))",
    "self._event(cur, run_id, 'claimed', 'QUEUED', 'CLAIMED', None, at)",
    "x = frozenset({'SUCCEEDED', 'FAILED'})",
    "cur.execute(\"SELECT 1 FROM publications WHERE state = 'PENDING'\")",
])
def test_the_scan_finds_a_spelled_out_state(line: str) -> None:
    assert _stray_states(line)


def test_the_scan_passes_the_enum_and_generated_sql() -> None:
    source = ('class S(StrEnum):\n    """A QUEUED run."""\n    QUEUED = "QUEUED"\n'
              'def f():\n    """RUNNING first."""\n    return f"WHERE state = {_QUEUED}"\n')
    assert _stray_states(source) == []
