"""``benchseal local sigstore start|stop|status``: the private Sigstore instance on 127.0.0.1.

Exit codes: 0 ok; 1 the instance did not start / does not answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from pipeline.local import sigstore as sigstore_local

sigstore_app = typer.Typer(help="Run the private Sigstore instance (Fulcio, Rekor v1/v2, TSA, OIDC) on 127.0.0.1.",
                           no_args_is_help=True)
_STATE = typer.Option(None, "--state", help="State directory (default: .benchseal/sigstore).")


@sigstore_app.command()
def start(state: Path | None = _STATE, port: int = typer.Option(0, help="Port (0: ephemeral).")) -> None:
    """Start the instance unless one already serves the state directory."""
    instance = sigstore_local.ensure_running(state, port=port)
    typer.echo(f"sigstore running at {instance.url} (pid {instance.pid}); trusted root {instance.trusted_root}")


@sigstore_app.command()
def stop(state: Path | None = _STATE) -> None:
    """Stop the instance benchseal started (only that process)."""
    typer.echo(f"sigstore {sigstore_local.stop(state)}")


@sigstore_app.command()
def status(state: Path | None = _STATE, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show whether the instance answers; exit 1 if it does not."""
    info = sigstore_local.status(state)
    typer.echo(json.dumps(info) if as_json else " ".join(f"{k}={v}" for k, v in info.items()))
    if not info["answers"]:
        raise typer.Exit(1)
