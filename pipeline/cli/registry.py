"""``benchseal local registry start|stop|status``: the local OCI registry.

Exit codes: 0 ok; 1 the registry did not start / does not answer.
"""

from __future__ import annotations

import json

import typer

from pipeline.local import registry as reg

registry_app = typer.Typer(help="Run the local OCI registry on 127.0.0.1 (pid-recorded).", no_args_is_help=True)


@registry_app.command()
def start() -> None:
    """Start the registry unless one already answers on the address."""
    r = reg.default_registry()
    typer.echo(f"registry {reg.start(r)} at {r.address}")


@registry_app.command()
def stop() -> None:
    """Stop the registry benchseal started (only that process)."""
    r = reg.default_registry()
    typer.echo(f"registry {reg.stop(r)}")


@registry_app.command()
def status(
    address: bool = typer.Option(False, "--address", help="Print only the address."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Show whether the registry answers; exit 1 if it does not."""
    r = reg.default_registry()
    info = reg.status(r)
    if address:
        typer.echo(r.address)
    elif as_json:
        typer.echo(json.dumps(info))
    else:
        typer.echo(" ".join(f"{k}={v}" for k, v in info.items()))
    if not info["answers"]:
        raise typer.Exit(1)
