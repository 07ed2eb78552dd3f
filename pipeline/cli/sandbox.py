"""``benchseal sandbox start|stop|status``: the rootless sandbox engine (pipeline/infra/sandbox/engine.py).

Exit codes: 0 ok; 1 the engine did not start / does not answer / is not confined / enforces no limits / has no disk
of its own; 2 bad input (not root, a bad ``$BENCHSEAL_SANDBOX_DIR`` or ``$BENCHSEAL_SANDBOX_DISK_GIB``).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from pipeline.infra.sandbox import engine as sbx

sandbox_app = typer.Typer(help="Run the rootless sandbox engine everything under test runs on (pid-recorded).",
                          no_args_is_help=True)


@sandbox_app.command()
def start(
    controllers: Annotated[list[str] | None, typer.Option(
        "--controller", metavar="USER", help="An unprivileged user that may use the engine's socket (the worker's "
                                             "service user under systemd); repeatable.")] = None,
) -> None:
    """Create the service user and its id ranges if needed, then start the engine unless ours answers."""
    s = sbx.default_sandbox()
    typer.echo(f"sandbox engine {sbx.start(s, controllers=controllers or ())} at {s.url}")


@sandbox_app.command()
def stop() -> None:
    """Stop the sandbox engine benchseal started (only that process)."""
    typer.echo(f"sandbox engine {sbx.stop(sbx.default_sandbox())}")


@sandbox_app.command()
def status(
    url: bool = typer.Option(False, "--url", help="Print only the engine's unix:// URL."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Show whether the sandbox engine answers, is confined to a user namespace, enforces limits and has its own
    disk (a file system of a fixed size on its data root); exit 1 if not."""
    s = sbx.default_sandbox()
    info = sbx.status(s)
    if url:
        typer.echo(s.url)
    elif as_json:
        typer.echo(json.dumps(info))
    else:
        typer.echo(" ".join(f"{k}={v}" for k, v in info.items()))
    if not (info["answers"] and info["confined"] and info["limits"] and info["disk_own"]):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")
