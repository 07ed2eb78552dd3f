"""``benchseal release vX.Y.Z --local``: build, benchmark, sign, publish and verify on this machine.

This is what ``make demo`` runs. In GitHub Actions the same stages run as the tag
workflow's jobs (see docs/publish.md); there is no remote mode here.
Exit codes: 0 released, verified and the benchmark SUCCEEDED; 1 a stage or a verification
failed, or the benchmark run did not succeed (it is still published, "not scored"); 2 usage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pipeline.errors import UsageError


def release(
    tag: str = typer.Argument(..., help="The release tag, vX.Y.Z."),
    local: bool = typer.Option(False, "--local", help="Run the whole chain on this machine (required)."),
    registry: str | None = typer.Option(None, "--registry", help="Registry HOST:PORT (default $BENCHSEAL_REGISTRY "
                                        "or 127.0.0.1:5055)."),
    suite: str = typer.Option("smoke", "--suite"),
    agent: str = typer.Option("oracle", "--agent"),
    dist: Annotated[Path | None, typer.Option("--dist", help="Local release root (default dist/releases).")] = None,
    as_json: bool = typer.Option(False, "--json", help="Print a machine-readable report only."),
    scripted_model: str | None = typer.Option(None, "--scripted-model", help="right|wrong: serve the suite's "
                                              "model endpoint (policy, 127.0.0.1) with the scripted model server "
                                              "and a fresh key for this release only."),
) -> None:
    """Release TAG locally: images, benchmark run, evidence, publication, verification."""
    import os

    from rich.console import Console

    from pipeline.release.local import DEFAULT_REGISTRY, release_local
    from pipeline.release.report import render_report

    if not local:
        raise UsageError("only --local is available from the command line; GitHub releases run in the workflows")
    console = Console(stderr=True)
    report = release_local(
        tag,
        registry=registry or os.environ.get("BENCHSEAL_REGISTRY") or DEFAULT_REGISTRY,
        dist=dist.resolve() if dist else None,
        suite=suite,
        agent=agent,
        console=None if as_json else console,
        scripted_model=scripted_model,
    )
    if as_json:
        typer.echo(json.dumps(report.to_json_dict(), indent=2, sort_keys=True))
    else:
        render_report(report, Console())
    if report.status != "SUCCEEDED":
        # Published and verified, but the benchmark itself failed: not a good release.
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(name="release")(release)
