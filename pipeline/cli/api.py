"""``benchseal api``: the API image's service, and what the infra host does to run it.

* ``api serve`` (the API image's command): run status and the results pages, read from the queue
  database, read-only (``pipeline.api.app``): ``--queue-db FILE`` (SQLite, opened ``mode=ro``) or a
  PostgreSQL URL from ``--queue-url-file`` / ``$BENCHSEAL_QUEUE_URL_FILE`` / ``$BENCHSEAL_QUEUE_URL``,
  never in argv, for a role granted SELECT only.
* ``api check-image REF`` (benchseal-api.service's ``ExecStartPre``, on the host): the API image
  pulled by digest and signature-checked like the runner (``pipeline.infra.worker.api_image``).
* ``api container REF`` (its ``ExecStart``): runs the image by digest with docker, read-only, on
  127.0.0.1 only, the queue mounted read-only (``pipeline.host.api``).
* ``api grant-reader ROLE`` (PostgreSQL): the read-only role the API connects as.

The API image registers ``serve`` only (``register_image``): it ships fastapi, uvicorn, typer and
psycopg, not the Docker SDK or cosign the host's verbs need.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.api.pages import GITHUB, validate_url_base, verify_pins
from pipeline.cli.attest import sigstore_endpoints
from pipeline.core.digests import parse_ref
from pipeline.core.errors import CheckFailed, InfrastructureError, NotAQueue, UsageError, ValidationError
from pipeline.host.api import CONTAINER_NAME, ApiContainer, docker_argv
from pipeline.infra.queue.reader import grant_reader as grant
from pipeline.infra.queue.reader import open_reader, reader_grants
from pipeline.infra.queue.sql import queue_url
from pipeline.infra.queue.sqlite import default_db_path

if TYPE_CHECKING:
    from pipeline.api.app import QueueSource

api_app = typer.Typer(help="The HTTP API over the queue database (run status, results pages), and running it on "
                      "the infra host.", no_args_is_help=True)
image_app = typer.Typer(help="The HTTP API over the queue database (health, run status, results pages).",
                        no_args_is_help=True)

_INFRA_HELP = ("The infra repository OWNER/NAME whose benchmark.yml seals the releases this queue holds: the pages "
               "print `benchseal verify ... --infra-repo` with it (with --builder; without both, no verify command).")
_BUILDER_HELP = ("The builder OWNER/REPO@REF (benchseal's repository and the exact ref the infra's workflows pin) that "
                 "seals them: the pages print `--builder` with it.")
_URL_FILE_HELP = ("A file holding the PostgreSQL URL of a read-only role (one line; also $BENCHSEAL_QUEUE_URL_FILE "
                  "or $BENCHSEAL_QUEUE_URL); never the URL itself in argv.")


def _queue_url(url_file: Path | None) -> str | None:
    found = _queue_url_source(url_file)
    return None if found is None else found[0]


def _queue_url_source(url_file: Path | None) -> tuple[str, str] | None:
    """(URL, the option or variable it came from), or None for SQLite."""
    return queue_url(url_file, use_state_file=False)  # never the worker's own $BENCHSEAL_HOME/infra/queue-url


def _open_before_serving(source: QueueSource, field: str, *, sqlite: bool) -> None:
    """Open the queue once before serving, refusing in one line naming ``field``: a file or database that
    holds no queue (exit 2), a queue that fails a check (schema version, a role that may write, a corrupt
    file: exit 1). Only a PostgreSQL server that cannot be reached yet is served anyway, as 503 answers
    until it can be (it may be on another host, restarting)."""
    try:
        source.get()
    except NotAQueue as exc:
        raise ValidationError(field, f"must name a benchseal queue database: {exc}") from None
    except CheckFailed as exc:
        raise CheckFailed(f"{field}: {exc}") from None
    except InfrastructureError as exc:
        if sqlite:
            raise InfrastructureError(f"{field}: {exc}") from None
        typer.echo(f"benchseal api: the queue cannot be reached yet (served as 503 until it can): {exc}", err=True)


def serve(
    host: Annotated[str, typer.Option(help="Address to bind (the image binds 0.0.0.0 inside its network namespace; "
                                           "the host publishes it on 127.0.0.1 only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8080,
    queue_db: Annotated[Path | None, typer.Option("--queue-db", help="The SQLite queue database, opened read-only "
                                                  "(default $BENCHSEAL_HOME/infra/queue.sqlite3).")] = None,
    queue_url_file: Annotated[Path | None, typer.Option("--queue-url-file", help=_URL_FILE_HELP)] = None,
    release_url_base: Annotated[str, typer.Option("--release-url-base", envvar="BENCHSEAL_RELEASE_URL_BASE",
                                                  help="Where each release's evidence is: BASE/OWNER/NAME/releases/"
                                                       "tag/TAG (GitHub Enterprise: https://HOST).")] = GITHUB,
    infra_repo: Annotated[str | None, typer.Option("--infra-repo", envvar="BENCHSEAL_INFRA_REPOSITORY",
                                                   help=_INFRA_HELP)] = None,
    builder: Annotated[str | None, typer.Option("--builder", envvar="BENCHSEAL_BUILDER", help=_BUILDER_HELP)] = None,
) -> None:
    """Serve the API with uvicorn until interrupted (reads the queue, writes nothing)."""
    # lazy: pipeline.api.app (fastapi) + uvicorn cost 154 ms at CLI start (bench/cli.py, 2026-12-03)
    import uvicorn

    from pipeline.api.app import QueueSource, create_app

    release_url_base = validate_url_base(release_url_base.rstrip("/"))
    pins = verify_pins(infra_repo, builder)
    found = _queue_url_source(queue_url_file)
    url = None if found is None else found[0]
    if url is not None and queue_db is not None:
        raise UsageError("--queue-db names a SQLite queue and a queue URL names a PostgreSQL one: give exactly one")
    source = QueueSource(lambda: open_reader(queue_db, url))
    sqlite_file = (queue_db or default_db_path()) if found is None else None
    if sqlite_file is not None and not sqlite_file.exists() and not sqlite_file.is_symlink():
        # A new infra host: nothing accepted yet, so no queue file. The API starts (its unit starts with the
        # host) and answers 503 until the first run creates it; a file that is there must be a queue.
        typer.echo(f"benchseal api: {sqlite_file} does not exist yet (served as 503 until it does)", err=True)
    else:
        _open_before_serving(source, "--queue-db" if found is None else found[1], sqlite=found is None)
    try:
        uvicorn.run(create_app(source, release_url_base=release_url_base, verify_pins=pins), host=host, port=port,
                    log_level="info")
    finally:
        source.close()


def check_image(
    ref: Annotated[str, typer.Argument(help="The API image, REGISTRY/REPOSITORY@sha256:<64 hex>.")],
    db: Annotated[Path | None, typer.Option("--db", help="The SQLite queue (default "
                                            "$BENCHSEAL_HOME/infra/queue.sqlite3).")] = None,
    queue_url_file: Annotated[Path | None, typer.Option("--queue-url-file", envvar="BENCHSEAL_API_QUEUE_URL_FILE",
                                                        help="The read-only role's PostgreSQL URL file (instead of "
                                                             "SQLite).")] = None,
    sigstore_url: Annotated[str | None, typer.Option("--sigstore-url", envvar="BENCHSEAL_SIGSTORE_URL",
                                                     help="A private Sigstore instance (tests only).")] = None,
    trusted_root: Annotated[Path | None, typer.Option("--trusted-root", envvar="BENCHSEAL_TRUSTED_ROOT",
                                                      help="Its trusted_root.json.")] = None,
) -> None:
    """Check the API image as the worker checks a runner, then pull it by digest (benchseal-api.service)."""
    # lazy: pipeline.infra.worker.api_image (the Docker SDK, sigstore, the worker) costs 357-388 ms after CLI start (measured 2026-12-05)
    from pipeline.infra.worker.api_image import check_api_image

    url = _queue_url(queue_url_file)
    if url is not None and db is not None:
        raise UsageError("--db names a SQLite queue and a queue URL names a PostgreSQL one: give exactly one")
    with open_reader(db, url) as queue:
        found = check_api_image(ref, queue, sigstore_endpoints(sigstore_url, trusted_root))
    typer.echo(json.dumps({"image": found.ref, "image_id": found.image_id, "release": found.release,
                           "signer": found.signer}, sort_keys=True))


def container(
    ref: Annotated[str, typer.Argument(help="The API image, REGISTRY/REPOSITORY@sha256:<64 hex> (checked and "
                                            "pulled by `api check-image`).")],
    port: Annotated[int, typer.Option("--port", envvar="BENCHSEAL_API_PORT", min=1, max=65535,
                                      help="The port on 127.0.0.1 it is published on.")] = 8080,
    queue_db: Annotated[Path | None, typer.Option("--queue-db", help="The SQLite queue (default "
                                                  "$BENCHSEAL_HOME/infra/queue.sqlite3); its directory is mounted "
                                                  "read-only.")] = None,
    queue_url_file: Annotated[Path | None, typer.Option("--queue-url-file", envvar="BENCHSEAL_API_QUEUE_URL_FILE",
                                                        help="The read-only role's PostgreSQL URL file, mounted "
                                                             "read-only (instead of SQLite).")] = None,
    release_url_base: Annotated[str, typer.Option("--release-url-base", envvar="BENCHSEAL_RELEASE_URL_BASE")] = GITHUB,
    infra_repo: Annotated[str | None, typer.Option("--infra-repo", envvar="BENCHSEAL_INFRA_REPOSITORY",
                                                   help=_INFRA_HELP)] = None,
    builder: Annotated[str | None, typer.Option("--builder", envvar="BENCHSEAL_BUILDER", help=_BUILDER_HELP)] = None,
    dry_run: Annotated[bool, typer.Option("--print", help="Print the docker command instead of running it.")] = False,
) -> None:
    """Run the API image by digest with docker, read-only, on 127.0.0.1 (benchseal-api.service)."""
    release_url_base = validate_url_base(release_url_base.rstrip("/"))
    pins = verify_pins(infra_repo, builder)
    spec = ApiContainer(image=parse_ref(ref, "REF"), uid=os.getuid(), gid=os.getgid(), port=port,
                        queue_db=None if queue_url_file else (queue_db or default_db_path()).resolve(),
                        queue_url_file=queue_url_file.resolve() if queue_url_file else None,
                        release_url_base=release_url_base,
                        infra_repository=pins.infra_repository if pins else None, builder=pins.builder if pins else None)
    argv = docker_argv(spec)
    if dry_run:
        typer.echo(json.dumps(argv))
        return
    # A container of that name left behind by a killed client (``--rm`` never ran) would block ``--name``.
    subprocess.run(["docker", "rm", "--force", CONTAINER_NAME], capture_output=True, check=False, timeout=120)
    os.execvp(argv[0], argv)  # noqa: S606 -- systemd's main process becomes the docker client (signals reach it)


def grant_reader(
    role: Annotated[str, typer.Argument(help="The role the API connects as (created, LOGIN, when absent).")],
    queue_url_file: Annotated[Path | None, typer.Option("--queue-url-file", help="A URL file of a role that owns "
                                                        "the queue's tables (default: the worker's).")] = None,
    sql: Annotated[bool, typer.Option("--sql", help="Print the statements (for the database's owner to run) "
                                      "instead of running them.")] = False,
    database: Annotated[str, typer.Option("--database", help="With --sql: the queue's database.")] = "benchseal",
    schema: Annotated[str, typer.Option("--schema", help="With --sql: the queue's schema.")] = "public",
) -> None:
    """Give a PostgreSQL role SELECT on what the API reads, and no other privilege on the queue's tables."""
    if sql:
        typer.echo(";\n".join(reader_grants(role, database, schema)) + ";")
        return
    # lazy: psycopg costs 120-150 ms at import (python -X importtime, 2026-12-03)
    from pipeline.infra.queue.postgres import PostgresQueue

    found = queue_url(queue_url_file)
    if found is None:
        raise UsageError("the queue is SQLite here (no queue URL): the API reads it through a read-only mount, "
                         "there is no role to grant")
    with PostgresQueue(found[0]) as queue:
        statements = grant(queue, role)
    typer.echo(json.dumps({"role": role, "statements": statements}, indent=2))


def register(app: typer.Typer) -> None:
    api_app.command("serve")(serve)
    api_app.command("check-image")(check_image)
    api_app.command("container")(container)
    api_app.command("grant-reader")(grant_reader)
    app.add_typer(api_app, name="api")


def register_image(app: typer.Typer) -> None:
    """What the API image's ``benchseal`` has: ``api serve`` only."""
    image_app.command("serve")(serve)
    app.add_typer(image_app, name="api")
