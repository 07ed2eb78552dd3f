"""``benchseal local npm-registry start|stop|publish``: a local npm registry (verdaccio) on 127.0.0.1.

It stands in for the npm registry an npm agent is published to (tests, the local demo).
Exit codes: 0 ok; 1 it did not start, is not running, or npm publish failed; 2 bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.core import paths
from pipeline.core.errors import CheckFailed
from pipeline.local.npmregistry import publish_to, running, start_background, stop_background

npm_registry_app = typer.Typer(help="A local npm registry (verdaccio) on 127.0.0.1, pid-recorded (tests, demo).",
                               no_args_is_help=True)

StateDir = Annotated[Path | None, typer.Option("--state-dir", help="Storage, config, log, pid and port "
                                                                    "(default: <state>/npm-registry).")]
Port = Annotated[int, typer.Option("--port", min=0, max=65535, help="0 picks a free port.")]


def _state_dir(state_dir: Path | None) -> Path:
    return state_dir if state_dir is not None else paths.state_dir("npm-registry")


@npm_registry_app.command("start")
def start(port: Port = 0, state_dir: StateDir = None) -> None:
    """Start in the background unless this state dir's registry already answers; print its URL."""
    state = start_background(_state_dir(state_dir), port)
    typer.echo(f"npm registry pid {state['pid']} at {state['url']}")


@npm_registry_app.command("stop")
def stop(state_dir: StateDir = None) -> None:
    """Stop the registry recorded in the state dir (by its pid, only that process)."""
    pid = stop_background(_state_dir(state_dir))
    typer.echo("no npm registry recorded" if pid is None else f"stopped npm registry pid {pid}")


@npm_registry_app.command("publish")
def publish(tarball: Annotated[Path, typer.Argument(help="An npm package tarball (npm pack).")],
            state_dir: StateDir = None) -> None:
    """Publish TARBALL to the running local registry; print the dist.integrity it reports."""
    state = running(_state_dir(state_dir))
    if state is None:
        raise CheckFailed("no local npm registry answers for this state dir: run `benchseal local npm-registry start`")
    typer.echo(publish_to(str(state["url"]), tarball))
