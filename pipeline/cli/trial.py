"""``benchseal trial run``: run a suite's Harbor trials (inside the runner image)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

trial_app = typer.Typer(help="Harbor trials (runs inside the runner image).", no_args_is_help=True)


@trial_app.command("run")
def run(
    suite_dir: Annotated[Path, typer.Option("--suite-dir", help="Suite directory (task dirs with task.toml).")],
    out: Annotated[Path, typer.Option("--out", help="Run directory: gets harbor/<trial>/ and trials.json.")],
    run_id: Annotated[str, typer.Option("--run-id")],
    agent: Annotated[str, typer.Option("--agent")] = "oracle",
    secret_env: Annotated[list[str] | None, typer.Option("--secret-env", help="NAME of an env var to hand to the agent (value stays in the environment).")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, max=16)] = 3,
) -> None:
    """Run every task once; grade later from the trials' result.json files."""
    from pipeline.infra.trial import run_suite

    specs = run_suite(suite_dir, out, run_id=run_id, agent=agent, secret_env=tuple(secret_env or ()), concurrency=concurrency)
    typer.echo(f"ran {len(specs)} trials into {out / 'harbor'}")


def register(app: typer.Typer) -> None:
    app.add_typer(trial_app, name="trial")
