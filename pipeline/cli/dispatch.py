"""``benchseal dispatch --repo OWNER/INFRA --digests FILE [--correlation ID] ...``

Sends the digests file's refs (re-validated) with source commit, tag and a
correlation id to the infra repository, then waits fail-closed for exactly
one matching run of the infra workflow (``--workflow-file``, default
``benchmark.yml``) to conclude ``success``. Prints the run id and URL
(``--json``: one JSON object on stdout on every outcome, ``ok: false`` with
the error and exit code on failure, including usage errors and an unreachable
API). Error text is escaped (no control characters) and never holds the token.

Token from GITHUB_TOKEN / GH_TOKEN (never argv), API root from GITHUB_API_URL.

Exit codes: 0 the run concluded success; 1 dispatch rejected, no run or more
than one run matched within the bound, the run did not succeed, or GitHub
failed; 2 bad arguments, bad digests file or no token.

``benchseal merge-digests --out FILE [--expect-commit SHA] FILES...`` merges the
per-image digests files of a matrix build (the workflows' resolve_images job):
exit 1 when images are missing/duplicated, sources differ or the commit is not
the expected one; 2 when a file is unreadable or invalid.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand

from pipeline.core.contracts import parse_subset, validate_correlation
from pipeline.core.errors import CLI_ERROR_PREFIX, Error, InfrastructureError, UsageError, escape_text
from pipeline.core.fsutil import atomic_write_json
from pipeline.dispatch.merge import merge_digests as merge


def _secrets() -> list[str]:
    # lazy: pipeline.dispatch (PyGithub) costs 120 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.dispatch.client import TOKEN_VARIABLES

    return [value for name in TOKEN_VARIABLES if len(value := os.environ.get(name, "").strip()) >= 4]


def safe_message(text: str) -> str:
    """Escaped, with any token from the environment replaced by ``***``."""
    for secret in _secrets():
        text = text.replace(secret, "***")
    return escape_text(text)


def _failure_json(error: str, exit_code: int, correlation: str | None, run: dict[str, Any] | None = None) -> str:
    return json.dumps({"ok": False, "correlation_id": correlation, "error": safe_message(error),
                       "exit_code": exit_code, **(run or {})}, sort_keys=True)


class _JsonFailureCommand(TyperCommand):
    """``dispatch --json`` answers a usage error found while parsing the options with the same
    JSON object as every other failure (exit 2), and no message echoes control characters."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        wants_json = "--json" in args  # before parsing: the parser consumes the list
        try:
            return super().parse_args(ctx, args)
        except typer.TyperException as exc:  # typer's click UsageError family (exit 2)
            exc.message = safe_message(exc.message)
            if wants_json:
                typer.echo(_failure_json(exc.format_message(), exc.exit_code, None))
            raise


def register(app: typer.Typer) -> None:
    app.command("dispatch", cls=_JsonFailureCommand)(dispatch)
    app.command("merge-digests")(merge_digests)


def dispatch(
    digests: Annotated[Path, typer.Option("--digests", help="benchseal.digests/v1 file from `benchseal build`.")],
    repo: str = typer.Option(..., "--repo", help="OWNER/NAME of the infra repository."),
    correlation: str | None = typer.Option(
        None, "--correlation", help="Correlation id; generated as <repo>-<run id>-<attempt>-<random> when absent."),
    workflow_file: str = typer.Option(
        "benchmark.yml", "--workflow-file",
        help="The infra workflow's file name in .github/workflows (NAME.yml or NAME.yaml); only its runs count."),
    workflow_dispatch: bool = typer.Option(
        False, "--workflow-dispatch", help="Trigger --workflow-file by workflow_dispatch instead of repository_dispatch."),
    workflow: str | None = typer.Option(
        None, "--workflow", help="Older spelling of --workflow-file FILE --workflow-dispatch."),
    event_type: str = typer.Option("benchseal-benchmark", "--event-type", help="repository_dispatch event type."),
    timeout: float = typer.Option(3600.0, "--timeout", help="Seconds to wait for the run to complete."),
    tag: str | None = typer.Option(None, "--tag", help="Release tag (default: from the digests file's source.ref)."),
    source_repo: str | None = typer.Option(
        None, "--source-repo", help="OWNER/NAME of the source (default: the digests file's source.repository)."),
    suite: str = typer.Option("smoke", "--suite", help="Benchmark suite name."),
    tasks: str = typer.Option("", "--tasks", help="A subset of the suite's tasks, comma-separated (default: every "
                              "task); the infra refuses a name its dataset lacks."),
    agent: str | None = typer.Option(
        None, "--agent", help="Agent name (default: the release's own agent the runner carries, else oracle)."),
    poll_attempts: int = typer.Option(30, "--poll-attempts", min=1, help="Polls before giving up finding the run."),
    poll_interval: float = typer.Option(5.0, "--poll-interval", min=0.0, help="Seconds between polls."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable result on stdout (also on failure)."),
) -> None:
    """Dispatch a benchmark to the infra repository and wait for its run."""
    cid = correlation
    try:
        # lazy: pipeline.dispatch (PyGithub) costs 120 ms at CLI start (bench/cli.py, 2026-12-03)
        from pipeline.core.waiting import WaitLines
        from pipeline.dispatch.client import make_client
        from pipeline.dispatch.correlate import PollConfig, validate_workflow_file
        from pipeline.dispatch.dispatch import build_payload, dispatch_and_wait, load_digests, new_correlation_id

        if workflow is not None:
            validate_workflow_file(workflow, "--workflow")
            if workflow_file not in ("benchmark.yml", workflow):
                raise UsageError(f"--workflow {workflow} and --workflow-file {workflow_file} disagree; give one")
            workflow_file, workflow_dispatch = workflow, True
        validate_workflow_file(workflow_file, "--workflow-file")
        cid = validate_correlation(correlation) if correlation else new_correlation_id()
        loaded = load_digests(digests)
        if agent is None:
            agent = loaded.agent.name if loaded.agent is not None else "oracle"
        payload = build_payload(loaded, correlation_id=cid, tag=tag, repository=source_repo, suite=suite, agent=agent,
                                tasks=parse_subset(tasks))
        result = dispatch_and_wait(
            make_client(), repo, payload, workflow_file=workflow_file, workflow_dispatch=workflow_dispatch,
            event_type=event_type, timeout_s=timeout, poll=PollConfig(attempts=poll_attempts, interval_s=poll_interval),
            progress=WaitLines(sys.stderr),  # what it waits for, on stderr: stdout stays the result (--json)
        )
    except Error as exc:
        _fail(exc, cid, as_json)
    except Exception as exc:  # every failure path answers, never a traceback
        _fail(InfrastructureError(f"dispatch failed unexpectedly: {type(exc).__name__}: {exc}"), cid, as_json)
    if as_json:
        # runner_ref/api_ref: the refs actually dispatched (the workflows read these);
        # runner/api: the same values under their older names.
        data: dict[str, Any] = {"ok": True, **result.to_json_dict(), "runner_ref": payload.runner,
                                "api_ref": payload.api, "runner": payload.runner, "api": payload.api}
        typer.echo(json.dumps(data, sort_keys=True))
    else:
        typer.echo(safe_message(f"run {result.run_id} {result.html_url} concluded {result.conclusion} "
                                f"(correlation {result.correlation_id})"))


def _fail(exc: Error, correlation: str | None, as_json: bool) -> NoReturn:
    message = exc.diagnostics()
    if as_json:
        # A run that concluded in failure is still named (run_id, html_url, conclusion).
        run = {key: getattr(exc, key) for key in ("run_id", "html_url", "conclusion") if hasattr(exc, key)}
        typer.echo(_failure_json(message, exc.exit_code, correlation, run))
    typer.echo(CLI_ERROR_PREFIX + f"{safe_message(message)}", err=True)
    raise typer.Exit(exc.exit_code)


def merge_digests(
    files: Annotated[list[Path], typer.Argument(help="Per-image digests files (one per matrix job).")],
    out: Annotated[Path, typer.Option("--out", help="Write the merged benchseal.digests/v1 file here (atomically).")],
    expect_commit: str | None = typer.Option(
        None, "--expect-commit", help="Fail unless the digests were built from this commit."),
    as_json: bool = typer.Option(False, "--json", help="Print the refs as JSON instead of key=value lines."),
) -> None:
    """Merge and re-validate per-image digests files; print runner_ref=/api_ref= lines (for $GITHUB_OUTPUT)."""
    merged = merge(files, expect_commit=expect_commit)
    atomic_write_json(out, merged.to_json_dict())
    refs = {f"{role}_ref": entry.ref for role, entry in sorted(merged.images.items())}
    refs["commit"] = merged.source.commit
    if as_json:
        typer.echo(json.dumps(refs, sort_keys=True))
    else:
        for key, value in refs.items():
            typer.echo(f"{key}={value}")
