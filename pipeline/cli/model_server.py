"""``benchseal model-server``: the scripted OpenAI-compatible model for tests and the demo."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from pipeline.core.errors import ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.local.model_server import serve as _serve
from pipeline.local.model_server import start_background, stop_background

model_app = typer.Typer(help="Scripted OpenAI-compatible model server on 127.0.0.1 (tests, demo).", no_args_is_help=True)
DEFAULT_STATE = REPO_ROOT / ".benchseal" / "model-server"

StateDir = Annotated[Path, typer.Option("--state-dir", help="Where pid, port and the request log are kept.")]
KeyFile = Annotated[Path, typer.Option("--key-file", help="File holding the API key clients must present.")]
Suite = Annotated[str, typer.Option("--suite", help="Suite whose script is replayed.")]
Mode = Annotated[str, typer.Option("--mode", help="right: solves each task; wrong: a plausible wrong change.")]
Port = Annotated[int, typer.Option("--port", min=0, max=65535, help="0 picks a free port.")]


def _mode(value: str) -> Literal["right", "wrong"]:
    if value == "right":
        return "right"
    if value == "wrong":
        return "wrong"

    raise ValidationError("--mode", "must be right or wrong", value)


@model_app.command("serve")
def serve(key_file: KeyFile, state_dir: StateDir = DEFAULT_STATE, suite: Suite = "smoke", mode: Mode = "right",
          port: Port = 0) -> None:
    """Serve in the foreground."""

    _serve(state_dir, key_file=key_file, suite=suite, mode=_mode(mode), port=port)


@model_app.command("start")
def start(key_file: KeyFile, state_dir: StateDir = DEFAULT_STATE, suite: Suite = "smoke", mode: Mode = "right",
          port: Port = 0) -> None:
    """Start in the background (pid recorded in the state dir); print the base URL."""

    state = start_background(state_dir, key_file=key_file, suite=suite, mode=_mode(mode), port=port)
    typer.echo(f"model server pid {state['pid']} at {state['base_url']} ({state['mode']} script)")


@model_app.command("stop")
def stop(state_dir: StateDir = DEFAULT_STATE) -> None:
    """Stop the server recorded in the state dir (by its pid)."""

    pid = stop_background(state_dir)
    typer.echo("no model server recorded" if pid is None else f"stopped model server pid {pid}")
