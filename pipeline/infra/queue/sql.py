"""The run queue and the durable publication outbox.

``Queue`` is the interface. ``SqlQueue`` holds the one implementation of its
rules, written once in portable SQL (``?`` placeholders) over two backends:

* ``SqliteQueue`` (the default; one host, several processes): WAL mode, every
  write in ``BEGIN IMMEDIATE``;
* ``PostgresQueue`` (``pipeline.infra.queue.postgres``; workers on several hosts):
  claims with ``SELECT ... FOR UPDATE SKIP LOCKED``.

Both guard every transition (``UPDATE ... WHERE state IN (...) AND
lease_token = ? RETURNING ...``: no row back, no transition), so two claimers can never both win and a worker
that lost its lease can change nothing.

States: QUEUED -> CLAIMED -> RUNNING -> SUCCEEDED | FAILED | INFRA_ERROR; trials:
QUEUED -> RUNNING -> DONE.
A claim holds a lease (random token + expiry) renewed by heartbeats; an expired
lease goes back to QUEUED. Once the attempts are used up (lease expiry or
infrastructure errors) the run goes back to QUEUED in the ``finalize`` phase:
the next worker grades whatever trials completed, runs the finalizer (evidence,
signing) and completes it, so EVERY terminal state is written by ``complete``
together with its grading and outbox rows, in one transaction.

Work split below the run (``trials``): a claimed run is planned once into trial rows
(``plan_trials``) and gives up its lease; workers on any host then claim batches of its trials
(``claim_trials``, each batch under its own lease token, attempts bounded per trial) and record
each trial's graded result (``complete_trials``). The transaction that ends a run's LAST trial
(it locks the run row, then counts) hands the run to that worker under a fresh lease; it grades
from the trial rows and ends the run with ``complete``, which refuses while any trial is open. A
run whose last trial ended by lease expiry, or whose grader died, is queued in the ``finalize``
phase and graded by the next claim.

Every change appends to ``events`` (the audit trail), and ``run.json``
(pipeline.core.contracts.RunStatus) in the run directory is rewritten atomically
after each committed change.

``open_queue`` chooses the backend: ``BENCHSEAL_QUEUE_URL`` /
``BENCHSEAL_QUEUE_URL_FILE`` (or ``url_file=``) select PostgreSQL, otherwise the
SQLite file. Schema versions are migrations (``migrate()``, run by
``benchseal infra migrate``); every open checks the version and refuses a

Where it lives: ``schema`` (the SQL schema of both dialects and its versions), ``records`` (what the
queue hands out), ``interface`` (``Queue``), ``sqlbase`` (plumbing, reads, outbox), ``rules``
(``SqlQueue``: runs and trials), ``sqlite`` and ``postgres`` (the backends), ``helpers``; this module
chooses the backend and is where the rest of the pipeline imports the queue from.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.core.documents import PlannedTrial
from pipeline.core.errors import UsageError, ValidationError
from pipeline.core.paths import home
from pipeline.infra.queue.helpers import Cursor, T, log, redact_url
from pipeline.infra.queue.interface import Queue
from pipeline.infra.queue.records import (
    ACTIVE_STATES,
    MAX_TRIAL_EVIDENCE_BYTES,
    TERMINAL_STATES,
    Event,
    Publication,
    PublicationState,
    QueueStats,
    RunPhase,
    RunRecord,
    TrialBatch,
    TrialClaim,
    TrialRow,
    TrialState,
    WorkerBeat,
    batch_label,
    canonical_payload,
)
from pipeline.infra.queue.rules import SqlQueue
from pipeline.infra.queue.schema import SCHEMA_VERSION
from pipeline.infra.queue.sqlite import BUSY_TIMEOUT_ENV, SqliteQueue, default_db_path

__all__ = [
    "ACTIVE_STATES",
    "BUSY_TIMEOUT_ENV",
    "MAX_TRIAL_EVIDENCE_BYTES",
    "QUEUE_URL_ENV",
    "QUEUE_URL_FILE_ENV",
    "SCHEMA_VERSION",
    "TERMINAL_STATES",
    "Cursor",
    "Event",
    "PlannedTrial",
    "Publication",
    "PublicationState",
    "Queue",
    "QueueStats",
    "RunPhase",
    "RunRecord",
    "SqlQueue",
    "SqliteQueue",
    "T",
    "TrialBatch",
    "TrialClaim",
    "TrialRow",
    "TrialState",
    "WorkerBeat",
    "batch_label",
    "canonical_payload",
    "default_db_path",
    "log",
    "open_queue",
    "queue_url",
    "redact_url",
    "state_url_file",
]

QUEUE_URL_ENV = "BENCHSEAL_QUEUE_URL"
QUEUE_URL_FILE_ENV = "BENCHSEAL_QUEUE_URL_FILE"


# --- choosing the backend ------------------------------------------------------------------

def _read_url_file(path: Path, field: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError(field, f"cannot read the queue URL file: {exc.strerror}", str(path)) from None
    except UnicodeDecodeError:
        raise ValidationError(field, "the queue URL file must be UTF-8 text", str(path)) from None
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if len(lines) != 1:
        raise ValidationError(field, "the queue URL file must hold exactly one URL line", str(path))
    return lines[0]


def state_url_file() -> Path:
    """``$BENCHSEAL_HOME/infra/queue-url``: every process sharing the state dir (the sudo accept wrapper,
    the worker and publisher units) selects the same queue from it, with no environment to plumb."""
    return home() / "infra" / "queue-url"


def queue_url(url_file: Path | None = None, *, use_state_file: bool = True) -> tuple[str, str] | None:
    """The configured PostgreSQL URL and where it came from, or None for SQLite."""
    sources: list[tuple[str, str]] = []
    if url_file is not None:
        sources.append((_read_url_file(url_file, "--queue-url-file"), "--queue-url-file"))
    env_file = os.environ.get(QUEUE_URL_FILE_ENV)
    if env_file:
        sources.append((_read_url_file(Path(env_file), QUEUE_URL_FILE_ENV), QUEUE_URL_FILE_ENV))
    env_url = os.environ.get(QUEUE_URL_ENV)
    if env_url:
        sources.append((env_url.strip(), QUEUE_URL_ENV))
    if not sources and use_state_file and state_url_file().is_file():
        sources.append((_read_url_file(state_url_file(), str(state_url_file())), str(state_url_file())))
    if not sources:
        return None
    if len(sources) > 1:
        raise UsageError(f"the queue URL is given twice ({' and '.join(s for _, s in sources)}): give exactly one")
    url, source = sources[0]
    if not url.startswith(("postgresql://", "postgres://")):
        raise ValidationError(source, "must be a postgresql:// URL", redact_url(url))
    return url, source


def open_queue(db: Path | None = None, *, url_file: Path | None = None, runs_dir: Path | None = None,
               check_schema: bool = True, create: bool = True) -> SqlQueue:
    """The configured queue: PostgreSQL when a queue URL is configured, else the SQLite file ``db``.

    ``create=False`` (the read-only verbs): a SQLite file that does not exist, or has no schema, is
    refused instead of created.

    The URL comes from ``url_file``, ``BENCHSEAL_QUEUE_URL_FILE``, ``BENCHSEAL_QUEUE_URL`` or, when
    none of them is set and no ``db`` is given, ``$BENCHSEAL_HOME/infra/queue-url``. A URL and an
    explicit ``db`` together are refused (no silent choice between two queues).
    """
    found = queue_url(url_file, use_state_file=db is None)
    if found is None:
        return SqliteQueue(db, runs_dir=runs_dir, check_schema=check_schema, create=create)
    if db is not None:
        raise UsageError(f"--db names a SQLite queue but {found[1]} names a PostgreSQL one: give exactly one")
    # lazy: psycopg costs 120-150 ms at import (python -X importtime, 2026-12-03)
    from pipeline.infra.queue.postgres import PostgresQueue

    return PostgresQueue(found[0], runs_dir=runs_dir, check_schema=check_schema)
