"""``benchseal trial run``: run a suite's Harbor trials (inside the runner image)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.core import strictjson
from pipeline.core.contracts import MAX_TASK_ATTEMPTS, AgentArtifact, load_model
from pipeline.core.errors import UsageError, ValidationError

trial_app = typer.Typer(help="Harbor trials (runs inside the runner image).", no_args_is_help=True)


@trial_app.command("run")
def run(
    suite_dir: Annotated[Path, typer.Option("--suite-dir", help="Suite directory (task dirs with task.toml).")],
    out: Annotated[Path, typer.Option("--out", help="Run directory: gets harbor/<trial>/ and trials.json.")],
    run_id: Annotated[str, typer.Option("--run-id")],
    agent: Annotated[str, typer.Option("--agent")] = "oracle",
    secret_env: Annotated[list[str] | None, typer.Option("--secret-env", help="NAME of an env var to hand to the agent (value stays in the environment).")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, max=16)] = 3,
    secret_dir: Annotated[Path | None, typer.Option("--secret-dir", help="Directory of NAME files (mounted, 0400) read for --secret-env names.")] = None,
    agent_version: Annotated[str | None, typer.Option("--agent-version", help="Harbor version the policy pins the agent to.")] = None,
    model_socket: Annotated[Path | None, typer.Option("--model-socket", help="The worker's model relay socket.")] = None,
    model_path: Annotated[str, typer.Option("--model-path", help="Path of the model endpoint, e.g. /v1.")] = "/v1",
    model_name: Annotated[str | None, typer.Option("--model-name", help="LiteLLM model name.")] = None,
    expect_agent: Annotated[str | None, typer.Option("--expect-agent", help="The payload's agent_artifact (JSON): the release's agent this image must carry.")] = None,
    attempts: Annotated[int, typer.Option("--attempts", min=1, max=MAX_TASK_ATTEMPTS, help="Trials per task (the suite's attempts in the infra policy).")] = 1,
    trial: Annotated[list[str] | None, typer.Option("--trial", help="Run only this planned trial (repeatable): a worker's batch.")] = None,
    agent_image: Annotated[str | None, typer.Option("--agent-image", help="This runner's own image (id): a Python release agent runs in a container of it.")] = None,
    ready_dir: Annotated[Path | None, typer.Option("--ready-dir", help="The worker's readiness dir: a task's trials start once it holds a file named for the task.")] = None,
) -> None:
    """Run every task --attempts times (default once); grade later from the trials' result.json files."""
    # lazy: pipeline.runner.trial (harbor) costs 178 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.runner.trial import ModelAccess, run_suite

    model = None
    if model_socket is not None or model_name is not None:
        if model_socket is None or model_name is None:
            raise UsageError("--model-socket and --model-name go together")
        model = ModelAccess(socket=model_socket, path=model_path, name=model_name)
    expected = None
    if expect_agent is not None:
        try:
            data = strictjson.loads(expect_agent)
        except ValueError as exc:
            raise ValidationError("--expect-agent", f"must be a JSON object: {exc}") from None
        expected = load_model(AgentArtifact, data, "--expect-agent")
    specs = run_suite(suite_dir, out, run_id=run_id, agent=agent, secret_env=tuple(secret_env or ()), concurrency=concurrency,
                      secret_dir=secret_dir, agent_version=agent_version, model=model, expect_agent=expected,
                      attempts=attempts, trials=tuple(trial) if trial is not None else None, agent_image=agent_image, ready_dir=ready_dir)
    typer.echo(f"ran {len(specs)} trials into {out / 'harbor'}")


def register(app: typer.Typer) -> None:
    app.add_typer(trial_app, name="trial")
