"""The ``benchseal`` command line: one module per verb under ``pipeline.cli``.

Each verb module exposes ``register(app)``. Verb modules import heavy libraries
(docker, sigstore, PyGithub, harbor) inside their functions, so the CLI starts
fast and also runs inside the runner image, which ships only what trials need.

Exit codes: 0 success, 1 a check failed, 2 usage error (bad input).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import typer

from pipeline import __version__
from pipeline.errors import Error

VERB_MODULES = (
    "registry",
    "base",
    "build",
    "attest",
    "resolve_ref",
    "dispatch",
    "infra",
    "worker",
    "trial",
    "model_server",
    "api",
    "sigstore_local",
    "evidence",
    "verify",
    "publish",
    "release",
    "host",
)

def _apply_project_dir(argv: list[str]) -> None:
    """``benchseal --project-dir DIR VERB ...``: set BENCHSEAL_PROJECT_DIR before any verb module
    (and so pipeline.paths) is imported, because paths are resolved at import."""
    for index, arg in enumerate(argv):
        if not arg.startswith("-"):
            return  # options after the verb belong to the verb
        if arg == "--project-dir" and index + 1 < len(argv):
            os.environ["BENCHSEAL_PROJECT_DIR"] = argv[index + 1]
            return
        if arg.startswith("--project-dir="):
            os.environ["BENCHSEAL_PROJECT_DIR"] = arg.split("=", 1)[1]
            return


if os.path.basename(sys.argv[0]) in ("benchseal", "__main__.py"):
    _apply_project_dir(sys.argv[1:])

app = typer.Typer(
    name="benchseal",
    help="Build, benchmark, sign and publish a release, pinned by digest end to end.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"benchseal {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    project_dir: str | None = typer.Option(
        None, "--project-dir", help="Project directory with images/, policies/, suites/ (default $BENCHSEAL_PROJECT_DIR, "
        "else the data installed with benchseal, else the source checkout)."
    ),
) -> None:
    """benchseal: the release pipeline that scores every release."""
    from pipeline import paths
    from pipeline.errors import ValidationError

    if project_dir is not None and paths.REPO_ROOT != Path(project_dir).resolve():
        # Paths were resolved before this option was seen (it was not the first option).
        raise ValidationError("--project-dir", "must come first, before any other option and the verb", project_dir)
    # An explicit project directory fails closed; the defaults are checked where they are used
    # (the runner image, for one, ships no images/).
    problem = paths.project_problem() if paths.PROJECT_SOURCE == paths.PROJECT_DIR_ENV else None
    if problem is not None:
        raise ValidationError("--project-dir / BENCHSEAL_PROJECT_DIR", f"must contain images/, policies/ and suites/: {problem}")


for _name in VERB_MODULES:
    try:
        _module = importlib.import_module(f"pipeline.cli.{_name}")
    except ModuleNotFoundError as _exc:
        # The runner and api images ship a subset of the package; a verb whose
        # module is absent there is simply not offered.
        if _exc.name != f"pipeline.cli.{_name}":
            raise
        continue
    _module.register(app)


def main() -> None:
    try:
        app()
    except Error as exc:
        typer.echo(f"benchseal: error: {exc.diagnostics()}", err=True)
        sys.exit(exc.exit_code)
