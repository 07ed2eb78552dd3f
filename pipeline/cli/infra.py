"""``benchseal infra``: accept dispatches and inspect the queue."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from pipeline.core.contracts import validate_run_id
from pipeline.core.errors import UsageError, ValidationError
from pipeline.infra.queue.sql import QueueStats, open_queue
from pipeline.infra.worker.export import export_run, packs_not_here

infra_app = typer.Typer(help="Benchmark infra: accept dispatch payloads, inspect runs.", no_args_is_help=True)


def _read_payload(source: str, limit: int) -> bytes:
    # Read at most limit + 1 bytes: the size bound holds before anything is parsed.
    try:
        if source == "-":
            return sys.stdin.buffer.read(limit + 1)
        path = Path(source)
        if not path.is_file():
            raise ValidationError("--payload", "must be an existing file or '-'", source)
        with path.open("rb") as handle:
            return handle.read(limit + 1)
    except OSError as exc:
        raise ValidationError("--payload", f"cannot be read: {exc.strerror or type(exc).__name__}", source) from None


@infra_app.command("accept")
def accept(
    payload: Annotated[str, typer.Option("--payload", help="Payload JSON file, or '-' for stdin.")],
    db: Annotated[Path | None, typer.Option("--db", help="Queue database (default: state dir infra/queue.sqlite3).")] = None,
    policy_path: Annotated[Path | None, typer.Option("--policy", help="Infra policy (default: policies/infra.yaml).")] = None,
    policy_digest: Annotated[str | None, typer.Option(
        "--policy-digest", help="sha256:HEX of the infra repository's policies/infra.yaml at the dispatching commit: "
                                "the policy read must have it (required under sudo).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {run_id, created} as JSON.")] = False,
) -> None:
    """Validate a dispatch payload and enqueue it exactly once; print the run id.

    Meant to be callable through a narrow sudo rule: under sudo (SUDO_UID set)
    the caller may not choose another database or policy, and must name the
    dispatching commit's policy digest (the host's policy is that file, or nothing runs).
    """
    if os.environ.get("SUDO_UID") and (db is not None or policy_path is not None):
        raise UsageError("--db and --policy are not accepted under sudo")
    if os.environ.get("SUDO_UID") and not policy_digest:
        raise ValidationError("--policy-digest", "is required under sudo (the dispatching commit's "
                              "policies/infra.yaml, as benchmark.yml's accept step sends it)", policy_digest or "")
    # lazy: pipeline.infra.intake.accept (jsonschema, yaml) costs 62 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.infra.intake.accept import accept_payload
    from pipeline.infra.intake.policy import load_policy
    from pipeline.infra.intake.policy_home import check_loaded_policy, check_policy_home

    if policy_digest is not None:
        policy_path = check_policy_home(policy_path, policy_digest)
    policy = load_policy(policy_path)
    if policy_digest is not None and policy_path is not None:
        check_loaded_policy(policy, policy_path, policy_digest)  # the bytes parsed are the bytes checked
    # The checked digest goes with the run: the worker runs and grades it only under that policy.
    result = accept_payload(_read_payload(payload, policy.max_payload_bytes), db=db, policy=policy,
                            policy_digest=policy_digest)
    if as_json:
        typer.echo(json.dumps({"run_id": result.run_id, "created": result.created}, sort_keys=True))
    else:
        typer.echo(result.run_id)


@infra_app.command("validate")
def validate(
    payload: Annotated[str, typer.Option("--payload", help="Payload JSON file, or '-' for stdin.")],
    policy_path: Annotated[Path | None, typer.Option("--policy", help="Infra policy (default: policies/infra.yaml).")] = None,
) -> None:
    """Check a dispatch payload against the schema and policy without enqueueing it.

    Prints the correlation id; exit 2 naming the field when the payload is refused.
    """

    # lazy: pipeline.infra.intake.accept (jsonschema, yaml) costs 62 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.infra.intake.accept import validate_payload
    from pipeline.infra.intake.policy import load_policy

    policy = load_policy(policy_path)
    typer.echo(validate_payload(_read_payload(payload, policy.max_payload_bytes), policy).correlation_id)


_DB_HELP = "SQLite queue database (default: state dir infra/queue.sqlite3; not with a PostgreSQL queue URL)."
_URL_FILE_HELP = ("File holding the PostgreSQL queue URL (postgresql://...); also BENCHSEAL_QUEUE_URL_FILE or "
                  "BENCHSEAL_QUEUE_URL. Never pass the URL itself as an argument.")


def _stats_json(stats: object) -> dict[str, object]:


    if not isinstance(stats, QueueStats):  # pragma: no cover - typing aid
        raise TypeError("stats")
    now = datetime.now(UTC)
    return {
        "backend": stats.backend, "location": stats.location, "schema_version": stats.schema_version,
        "depth": stats.depth, "finalize_pending": stats.finalize_pending, "in_flight": stats.in_flight,
        "expired_leases": stats.expired_leases, "outbox_pending": stats.outbox_pending,
        "trials_queued": stats.trials_queued, "trials_in_flight": stats.trials_in_flight,
        "by_state": dict(sorted(stats.by_state.items())),
        "workers": [{"worker": w.worker, "run_id": w.run_id,
                     "last_heartbeat": w.last_seen.isoformat().replace("+00:00", "Z"),
                     "age_seconds": round((now - w.last_seen).total_seconds(), 1),
                     **({"problem": w.problem} if w.problem else {})} for w in stats.workers],
    }


@infra_app.command("status")
def status(
    run_id: Annotated[str | None, typer.Argument(help="Show one run (with its events); default: the queue, then every run.")] = None,
    db: Annotated[Path | None, typer.Option("--db", help=_DB_HELP)] = None,
    queue_url_file: Annotated[Path | None, typer.Option("--queue-url-file", help=_URL_FILE_HELP)] = None,
    summary: Annotated[bool, typer.Option("--summary", help="Only the queue: depth, claims in flight, worker heartbeats.")] = False,
) -> None:
    """Show the queue (depth, claims in flight, per-worker heartbeats) and its runs as JSON lines, or one run."""

    if run_id is not None:
        validate_run_id(run_id)  # a usage error before the database is looked at
    with open_queue(db, url_file=queue_url_file, create=False) as queue:
        if run_id is None:
            typer.echo(json.dumps({"queue": _stats_json(queue.stats())}, sort_keys=True, indent=2 if summary else None))
            if summary:
                return
            for record in queue.list_runs():
                typer.echo(json.dumps({"run_id": record.run_id, "state": record.state, "attempts": record.attempts,
                                       "phase": record.phase, "worker": record.worker,
                                       "correlation_id": record.correlation_id, "reason": record.reason}, sort_keys=True))
            return
        record = queue.get_run(run_id)
        events = [{"at": e.at, "event": e.event, "from": e.from_state, "to": e.to_state, "detail": e.detail} for e in queue.events(run_id)]
        typer.echo(json.dumps({"run_id": record.run_id, "state": record.state, "attempts": record.attempts,
                               "phase": record.phase, "reason": record.reason,
                               "score": record.grading.score if record.grading else None,
                               "events": events}, indent=2, sort_keys=True))


@infra_app.command("export")
def export(
    run_id: Annotated[str, typer.Argument(help="The graded run to export (run-<20 hex>).")],
    db: Annotated[Path | None, typer.Option("--db", help=_DB_HELP)] = None,
    queue_url_file: Annotated[Path | None, typer.Option("--queue-url-file", help=_URL_FILE_HELP)] = None,
) -> None:
    """Write a graded terminal run (run.json, grading.json, artifacts/evidence/) to stdout as a tar.

    What benchmark.yml's seal job reads through the benchseal-export sudo wrapper; it seals the
    run with `benchseal evidence --from-export`. A run that is not terminal is refused (exit 1).
    Under sudo (SUDO_UID set) the caller may not choose another database.
    """


    if os.environ.get("SUDO_UID") and (db is not None or queue_url_file is not None):
        raise UsageError("--db and --queue-url-file are not accepted under sudo")
    validate_run_id(run_id)
    if sys.stdout.isatty():
        raise UsageError("the export is a tar stream: redirect stdout to a file or a pipe")
    with open_queue(db, url_file=queue_url_file, create=False) as queue:
        record = queue.get_run(run_id)
        run_dir = queue.run_dir(run_id)
        export_run(record, run_dir, sys.stdout.buffer, packs_not_here(queue, run_id, run_dir),
                   comparison=queue.comparison(run_id))
    sys.stdout.buffer.flush()


@infra_app.command("record-summary")
def record_summary(
    run_id: Annotated[str, typer.Argument(help="The sealed run (run-<20 hex>).")],
    digest: Annotated[str, typer.Argument(help="sha256:<hex> of the run's sealed summary.json.")],
    db: Annotated[Path | None, typer.Option("--db", help=_DB_HELP)] = None,
    queue_url_file: Annotated[Path | None, typer.Option("--queue-url-file", help=_URL_FILE_HELP)] = None,
) -> None:
    """Record the digest of a scored run's sealed summary.json in the repository's history.

    What benchmark.yml's seal job does through the benchseal-record sudo wrapper once the evidence is
    signed: from then on the release is one a later release of the repository is compared with.
    Idempotent; a different digest for the same run is refused (exit 1).
    """

    if os.environ.get("SUDO_UID") and (db is not None or queue_url_file is not None):
        raise UsageError("--db and --queue-url-file are not accepted under sudo")
    validate_run_id(run_id)
    with open_queue(db, url_file=queue_url_file, create=False) as queue:
        queue.record_summary(run_id, digest)
    typer.echo(json.dumps({"run_id": run_id, "summary_digest": digest}, sort_keys=True))


@infra_app.command("migrate")
def migrate(
    db: Annotated[Path | None, typer.Option("--db", help=_DB_HELP)] = None,
    queue_url_file: Annotated[Path | None, typer.Option("--queue-url-file", help=_URL_FILE_HELP)] = None,
) -> None:
    """Apply the queue database's pending schema migrations (one transaction); print the versions."""

    with open_queue(db, url_file=queue_url_file, check_schema=False) as queue:
        before, after = queue.migrate()
        typer.echo(json.dumps({"backend": queue.backend, "location": queue.location, "from": before, "to": after},
                              sort_keys=True))


def register(app: typer.Typer) -> None:
    app.add_typer(infra_app, name="infra")
