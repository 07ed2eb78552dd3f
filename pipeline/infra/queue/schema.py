"""The queue's SQL schema, written once for both backends.

Each migration below is one version of the schema; ``{real}``, ``{blob}``, ``{serial_key}`` and
``{if_not_exists}`` are where SQLite and PostgreSQL differ (``Dialect``: the two side by side).
Both backends apply the statements of a version in one transaction and record it in
``schema_migrations``; every open checks the version (``check_version``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from pipeline.core.contracts import RunState
from pipeline.core.errors import CheckFailed
from pipeline.infra.queue.records import PublicationState, TrialState


# The queue's SQL names every state through these, from its enum (RunState, TrialState,
# PublicationState): no state is written out as an SQL literal by hand.
def sql_text(state: StrEnum) -> str:
    """``state`` as an SQL string literal (a state is an upper-case word: nothing to escape)."""
    if not re.fullmatch(r"[A-Z_]+", state.value):
        raise ValueError(f"state {state.value!r} is not an upper-case word")
    return f"'{state.value}'"


def sql_list(states: Iterable[StrEnum]) -> str:
    """``(...)`` of SQL literals for ``IN``, in the enum's order (so the text is the same in every process)."""
    chosen = list(states)
    if not chosen:
        raise ValueError("no states")
    order = list(type(chosen[0]))
    return "(" + ",".join(sql_text(state) for state in sorted(set(chosen), key=order.index)) + ")"


@dataclass(frozen=True)
class Dialect:
    """What one backend's SQL spells differently."""

    name: str
    real: str  # a float column (epoch seconds)
    blob: str  # a byte-string column
    serial_key: str  # an auto-numbered integer primary key
    # Version 1 tables and indexes: SQLite created them at every open before versions were recorded
    # (an unversioned file with the runs table is at version 1), so its version 1 tolerates them.
    if_not_exists: str
    # A run payload's ``source.{field}`` as text, NULL where the payload is not JSON ({field} is filled in).
    payload_source: str

    def source(self, field: str) -> str:
        return self.payload_source.replace("{field}", field)


#                               SQLite                                PostgreSQL
SQLITE = Dialect(name="sqlite", real="REAL", blob="BLOB", serial_key="INTEGER PRIMARY KEY AUTOINCREMENT",
                 if_not_exists=" IF NOT EXISTS",
                 payload_source="CASE WHEN json_valid(payload) THEN json_extract(payload, '$.source.{field}') END")
# PostgreSQL 15 has no cast that answers NULL for a malformed value: a corrupt payload row stops the
# migration (rolled back whole, naming the database error) rather than leave a tag unbound.
POSTGRESQL = Dialect(name="postgresql", real="DOUBLE PRECISION", blob="BYTEA", serial_key="BIGSERIAL PRIMARY KEY",
                     if_not_exists="", payload_source="(payload::jsonb -> 'source' ->> '{field}')")

# Version 1 is the schema before versions were recorded (an unversioned database
# that has the runs table is at version 1).
_MIGRATIONS: tuple[str, ...] = (
    """
CREATE TABLE{if_not_exists} runs (
    run_id TEXT PRIMARY KEY,
    correlation_id TEXT NOT NULL UNIQUE,
    payload TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN {run_states}),
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    lease_token TEXT,
    lease_expires_at {real},
    worker TEXT,
    reason TEXT,
    grading TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX{if_not_exists} runs_state ON runs (state, created_at);
CREATE TABLE{if_not_exists} events (
    id {serial_key},
    run_id TEXT NOT NULL,
    at TEXT NOT NULL,
    event TEXT NOT NULL,
    from_state TEXT,
    to_state TEXT,
    detail TEXT
);
CREATE INDEX{if_not_exists} events_run ON events (run_id, id);
CREATE TABLE{if_not_exists} publications (
    id {serial_key},
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    target TEXT NOT NULL,
    tag TEXT NOT NULL,
    request TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN {publication_states}),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at {real} NOT NULL,
    lease_expires_at {real},
    last_error TEXT,
    result TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (run_id, target, tag)
);
""",
    """
ALTER TABLE runs ADD COLUMN phase TEXT NOT NULL DEFAULT 'run' CHECK (phase IN ('run','finalize'));
ALTER TABLE runs ADD COLUMN finalize_attempts INTEGER NOT NULL DEFAULT 0;
CREATE TABLE workers (
    worker TEXT PRIMARY KEY,
    last_seen {real} NOT NULL,
    run_id TEXT
);
-- The claim order (finalize before run, then oldest) read straight from this index.
CREATE INDEX runs_claim ON runs (state, phase, created_at, run_id);
""",
    # Version 3: work split below the run (see "trials" in pipeline.infra.queue.sql's docstring).
    """
ALTER TABLE runs ADD COLUMN trials_planned INTEGER NOT NULL DEFAULT 0;
CREATE TABLE trials (
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    idx INTEGER NOT NULL,
    task TEXT NOT NULL,
    trial_name TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN {trial_states}),
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    lease_token TEXT,
    lease_expires_at {real},
    worker TEXT,
    reason TEXT,
    result TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE INDEX trials_claim ON trials (state, created_at, run_id, idx);
CREATE INDEX trials_lease ON trials (run_id, lease_token);
""",
    # Version 4: each trial's evidence (its Harbor trial dir, packed by the host that ran it), so the
    # grading host publishes every trial's dir, wherever it ran.
    """
ALTER TABLE trials ADD COLUMN evidence {blob};
""",
    # Version 5: each source repository's history of scored releases (pipeline.core.history): the
    # worker adds a run's entry, with its comparison, in the transaction that completes the run; the
    # seal records the signed summary's digest. The API reads it (a read-only role on PostgreSQL).
    """
CREATE TABLE releases (
    run_id TEXT PRIMARY KEY REFERENCES runs (run_id),
    repository TEXT NOT NULL,
    suite TEXT NOT NULL,
    tag TEXT NOT NULL,
    entry TEXT NOT NULL,
    comparison TEXT NOT NULL,
    gated INTEGER NOT NULL CHECK (gated IN (0, 1)),
    summary_digest TEXT,
    recorded_at TEXT NOT NULL
);
CREATE INDEX releases_history ON releases (repository, suite, recorded_at, run_id);
""",
    # Version 6: a tag is released once (pipeline.core.history.tag_refusal): each repository's tag (by
    # ``tag_key``) is bound to the commit of its first accepted run, in the transaction that enqueues
    # it; a run of the same tag from another commit is refused. Bound here for every run already
    # queued, oldest first (the first one's commit stands).
    """
CREATE TABLE release_tags (
    repository TEXT NOT NULL,
    tag_key TEXT NOT NULL,
    tag TEXT NOT NULL,
    source_commit TEXT NOT NULL,
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    bound_at TEXT NOT NULL,
    PRIMARY KEY (repository, tag_key)
);
INSERT INTO release_tags (repository, tag_key, tag, source_commit, run_id, bound_at)
SELECT lower({src_repository}),
       lower(CASE WHEN lower(substr({src_tag}, 1, 10)) = 'refs/tags/' THEN substr({src_tag}, 11) ELSE {src_tag} END),
       {src_tag}, {src_commit}, run_id, created_at
FROM runs WHERE {src_repository} IS NOT NULL AND {src_tag} IS NOT NULL AND {src_commit} IS NOT NULL
ORDER BY created_at, run_id
ON CONFLICT DO NOTHING
""",
    # Version 7: why a polling worker claims nothing (its installed infra policy does not load), beside its
    # heartbeat: ``benchseal infra status`` and ``doctor host`` show it; its next claim attempt clears it.
    """
ALTER TABLE workers ADD COLUMN problem TEXT;
""",
)
SCHEMA_VERSION = len(_MIGRATIONS)

# Where each backend records the versions it applied (the same in both dialects).
VERSIONS_TABLE = "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"

# The columns the queue reads back from a run row and a publication row, in RunRecord / Publication order.
RUN_COLUMNS = ("run_id, correlation_id, payload, state, attempts, max_attempts, lease_token, lease_expires_at,"
               " worker, reason, grading, created_at, updated_at, phase, finalize_attempts, trials_planned")
PUB_COLUMNS = "id, request, state, attempts, next_attempt_at, last_error, result"


def migration(dialect: Dialect, version: int) -> list[str]:
    """The statements of schema ``version`` (1 .. SCHEMA_VERSION) in ``dialect``, to run one by one in one
    transaction (SQLite's executescript would COMMIT)."""
    if not 1 <= version <= SCHEMA_VERSION:
        raise ValueError(f"no schema version {version} (1 .. {SCHEMA_VERSION})")
    # The CHECKs' state lists come from the enums but are stored in each database's schema as written at
    # its version: a state added to an enum needs a new migration (tests/infra/test_queue_states.py pins the text).
    text = _MIGRATIONS[version - 1].format(real=dialect.real, blob=dialect.blob, serial_key=dialect.serial_key,
                                           if_not_exists=dialect.if_not_exists, src_repository=dialect.source("repository"),
                                           src_tag=dialect.source("tag"), src_commit=dialect.source("commit"),
                                           run_states=sql_list(RunState), trial_states=sql_list(TrialState),
                                           publication_states=sql_list(PublicationState))
    return [statement for statement in text.split(";") if statement.strip()]


def check_version(location: str, version: int) -> None:
    if version < SCHEMA_VERSION:
        raise CheckFailed(f"queue database {location} is at schema version {version}, this benchseal needs "
                          f"{SCHEMA_VERSION}: run `benchseal infra migrate`")
    if version > SCHEMA_VERSION:
        raise CheckFailed(f"queue database {location} is at schema version {version}, newer than this benchseal "
                          f"knows ({SCHEMA_VERSION}): upgrade benchseal")
