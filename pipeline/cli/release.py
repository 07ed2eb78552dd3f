"""``benchseal release vX.Y.Z --local``: build, benchmark, sign, publish and verify on this machine.

This is what ``make demo`` runs. In GitHub Actions the same stages run as the jobs of benchseal's
reusable workflows, called by the source's and the infra's own (see docs/publish.md); there is no
remote mode here. Locally the adopter path is played out (pipeline/local/sources.py): a
``--project`` of benchseal's checkout (``examples/hello-agent``) is released as its own repository,
``benchseal-examples/<directory>``, signed by the local builder ``local/benchseal@refs/heads/main``
and sealed for the local infra repository ``local/bench-infra``.
Exit codes: 0 released, verified and the benchmark SUCCEEDED; 1 a stage or a verification
failed, or the benchmark run did not succeed (it is still published, "not scored"); 2 usage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pipeline.core.contracts import parse_subset
from pipeline.core.errors import CLI_ERROR_PREFIX, UsageError, escape_text
from pipeline.core.project import PROJECT_FILE, load_project
from pipeline.imaging.names import resolve_image_names


def release(
    tag: str = typer.Argument(..., help="The release tag, vX.Y.Z."),
    local: bool = typer.Option(False, "--local", help="Run the whole chain on this machine (required)."),
    image_prefix: str | None = typer.Option(None, "--image-prefix", help="Registry and repository prefix of the "
                                            "images, PREFIX + runner|api|base|runner-base (default "
                                            "$BENCHSEAL_IMAGE_PREFIX; see `benchseal build --help`)."),
    registry: str | None = typer.Option(None, "--registry", help="Registry HOST:PORT: shorthand for --image-prefix "
                                        "HOST:PORT/benchseal/ (default $BENCHSEAL_REGISTRY, else 127.0.0.1:5055)."),
    policy: Annotated[Path | None, typer.Option("--policy", help="Infra policy that admits the images "
                                                "(default policies/infra.yaml).")] = None,
    suite: str = typer.Option("smoke", "--suite"),
    tasks: str = typer.Option("", "--tasks", help="A subset of the suite's tasks, comma-separated (default: every "
                              "task): only these run; summary.json records the subset and the history keeps it apart."),
    agent: str | None = typer.Option(None, "--agent", help="The agent to score (default: the project's agent "
                                     "with --project, else oracle)."),
    project: Annotated[Path | None, typer.Option("--project", help="The source project's benchseal.toml: its agent, "
                                                 "at the tag's version, is baked into the runner (default: "
                                                 "./benchseal.toml when there is one and no --agent). A project of "
                                                 "benchseal's checkout (or of no checkout) is released as its own "
                                                 "repository, benchseal-examples/<directory>, made under the state "
                                                 "dir from the tree HEAD holds; a project in a git checkout of "
                                                 "its own is released from that checkout, whose tag must exist "
                                                 "and name HEAD.")] = None,
    repository: str | None = typer.Option(None, "--repository", help="OWNER/NAME of the --project's own checkout "
                                          "(default: $GITHUB_REPOSITORY, else its git remote origin, else "
                                          "local/<directory name>); stated before anything runs."),
    dist: Annotated[Path | None, typer.Option("--dist", help="Local release root (default dist/releases).")] = None,
    as_json: bool = typer.Option(False, "--json", help="Print a machine-readable report only."),
    scripted_model: str | None = typer.Option(None, "--scripted-model", help="right|wrong: serve the suite's "
                                              "model endpoint (policy, 127.0.0.1) with the scripted model server "
                                              "and a fresh key for this release only."),
) -> None:
    """Release TAG locally: images, benchmark run, evidence, publication, verification."""
    # lazy: pipeline.local.release (every stage) costs 875 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.local.release import release_local
    from pipeline.local.report import render_report

    if not local:
        raise UsageError("only --local is available from the command line; GitHub releases run in the workflows")
    names = resolve_image_names(image_prefix, registry)
    if project is None and agent is None and (Path.cwd() / PROJECT_FILE).is_file():
        project = Path(PROJECT_FILE)  # run in an adopter's repository: its own project file
    if agent is None:
        agent = load_project(project).agent.name if project is not None else "oracle"
    console = Console(stderr=True)
    report = release_local(
        tag,
        names=names,
        policy=policy,
        dist=dist.resolve() if dist else None,
        suite=suite,
        agent=agent,
        console=None if as_json else console,
        scripted_model=scripted_model,
        project=project,
        repository=repository,
        tasks=parse_subset(tasks),
    )
    if as_json:
        typer.echo(json.dumps(report.to_json_dict(), indent=2, sort_keys=True))
    else:
        render_report(report, Console())
    if report.status != "SUCCEEDED":
        # Published and verified, but the benchmark itself failed: not a good release. Say why, where the user looks.
        typer.echo(escape_text(f"{CLI_ERROR_PREFIX}release {tag} is {report.status} (published, not scored): "
                               f"{report.reason or 'no reason recorded'}"), err=True)
        raise typer.Exit(1)
    if report.gated:
        # Published with its result, but the regression gate holds it back: not promoted.
        reasons = "; ".join(str(reason) for reason in (report.comparison or {}).get("reasons", ()))
        typer.echo(escape_text(f"{CLI_ERROR_PREFIX}release {tag} is gated (published, not promoted): {reasons}"),
                   err=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(name="release")(release)
