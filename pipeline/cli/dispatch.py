"""``benchseal dispatch --repo OWNER/INFRA --digests FILE [--correlation ID] ...``

Sends the digests file's refs (re-validated) with source commit, tag and a
correlation id to the infra repository, then waits fail-closed for exactly
one matching workflow run to conclude ``success``. Prints the run id and URL
(``--json``: one JSON object on stdout, also on failure).

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
from pathlib import Path
from typing import Annotated

import typer

from pipeline.errors import Error


def register(app: typer.Typer) -> None:
    app.command("dispatch")(dispatch)
    app.command("merge-digests")(merge_digests)


def dispatch(
    digests: Annotated[Path, typer.Option("--digests", help="benchseal.digests/v1 file from `benchseal build`.")],
    repo: str = typer.Option(..., "--repo", help="OWNER/NAME of the infra repository."),
    correlation: str | None = typer.Option(
        None, "--correlation", help="Correlation id; generated as <repo>-<run id>-<attempt>-<random> when absent."),
    workflow: str | None = typer.Option(
        None, "--workflow", help="Workflow file (e.g. benchmark.yml): use workflow_dispatch instead of repository_dispatch."),
    event_type: str = typer.Option("benchseal-benchmark", "--event-type", help="repository_dispatch event type."),
    timeout: float = typer.Option(3600.0, "--timeout", help="Seconds to wait for the run to complete."),
    tag: str | None = typer.Option(None, "--tag", help="Release tag (default: from the digests file's source.ref)."),
    source_repo: str | None = typer.Option(
        None, "--source-repo", help="OWNER/NAME of the source (default: the digests file's source.repository)."),
    suite: str = typer.Option("smoke", "--suite", help="Benchmark suite name."),
    agent: str = typer.Option("oracle", "--agent", help="Agent name."),
    poll_attempts: int = typer.Option(30, "--poll-attempts", min=1, help="Polls before giving up finding the run."),
    poll_interval: float = typer.Option(5.0, "--poll-interval", min=0.0, help="Seconds between polls."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable result on stdout."),
) -> None:
    """Dispatch a benchmark to the infra repository and wait for its run."""
    from pipeline.dispatch import PollConfig, build_payload, dispatch_and_wait, load_digests, make_client
    from pipeline.dispatch.dispatch import new_correlation_id, validate_correlation

    cid = correlation
    try:
        cid = validate_correlation(correlation) if correlation else new_correlation_id()
        payload = build_payload(load_digests(digests), correlation_id=cid, tag=tag, repository=source_repo,
                                suite=suite, agent=agent)
        result = dispatch_and_wait(
            make_client(), repo, payload, workflow=workflow, event_type=event_type, timeout_s=timeout,
            poll=PollConfig(attempts=poll_attempts, interval_s=poll_interval),
        )
    except Error as exc:
        if as_json:
            typer.echo(json.dumps({"ok": False, "correlation_id": cid, "error": exc.diagnostics(),
                                   "exit_code": exc.exit_code}, sort_keys=True))
        raise
    if as_json:
        typer.echo(json.dumps({"ok": True, **result.to_json_dict(), "runner": payload.runner, "api": payload.api},
                              sort_keys=True))
    else:
        typer.echo(f"run {result.run_id} {result.html_url} concluded {result.conclusion} "
                   f"(correlation {result.correlation_id})")


def merge_digests(
    files: Annotated[list[Path], typer.Argument(help="Per-image digests files (one per matrix job).")],
    out: Annotated[Path, typer.Option("--out", help="Write the merged benchseal.digests/v1 file here (atomically).")],
    expect_commit: str | None = typer.Option(
        None, "--expect-commit", help="Fail unless the digests were built from this commit."),
    as_json: bool = typer.Option(False, "--json", help="Print the refs as JSON instead of key=value lines."),
) -> None:
    """Merge and re-validate per-image digests files; print runner_ref=/api_ref= lines (for $GITHUB_OUTPUT)."""
    from pipeline.dispatch.merge import merge_digests as merge
    from pipeline.fsutil import atomic_write_json

    merged = merge(files, expect_commit=expect_commit)
    atomic_write_json(out, merged.to_json_dict())
    refs = {f"{role}_ref": entry.ref for role, entry in sorted(merged.images.items())}
    refs["commit"] = merged.source.commit
    if as_json:
        typer.echo(json.dumps(refs, sort_keys=True))
    else:
        for key, value in refs.items():
            typer.echo(f"{key}={value}")
