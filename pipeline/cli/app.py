"""The ``benchseal`` application object shared by every entry point.

``pipeline.cli.main`` registers every verb (the installed ``benchseal``); the runner and api
images register only the verbs they run (``pipeline.cli.runner_main``, ``pipeline.cli.api_main``),
because each image ships only the libraries those verbs need (images/*/image.toml).

Exit codes: 0 success, 1 a check failed, 2 usage error (bad input).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import typer

# Typer 0.29 vendors Click as typer._click (pinned in requirements/): its usage errors are only there.
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

from pipeline import __version__
from pipeline.core import paths
from pipeline.core.errors import CLI_ERROR_PREFIX, Error, ValidationError, escape_text

Register = Callable[[typer.Typer], None]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"benchseal {__version__}")
        raise typer.Exit(0)


def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    project_dir: str | None = typer.Option(
        None, "--project-dir", help="Project directory with images/, policies/, suites/ (default $BENCHSEAL_PROJECT_DIR, "
        "else the data installed with benchseal, else the source checkout)."
    ),
) -> None:
    """benchseal: the release pipeline that scores every release."""
    if project_dir is not None and paths.REPO_ROOT != Path(project_dir).resolve():
        # Paths were resolved before this option was seen (it was not the first option).
        raise ValidationError("--project-dir", "must come first, before any other option and the verb", project_dir)
    # An explicit project directory fails closed; the defaults are checked where they are used
    # (the runner image, for one, ships no images/).
    problem = paths.project_problem() if paths.PROJECT_SOURCE == paths.PROJECT_DIR_ENV else None
    if problem is not None:
        raise ValidationError("--project-dir / BENCHSEAL_PROJECT_DIR", f"must contain images/, policies/ and suites/: {problem}")


def new_app(*verbs: Register) -> typer.Typer:
    """A ``benchseal`` app with the given verbs' ``register`` functions applied, in order."""
    app = typer.Typer(
        name="benchseal",
        help="Build, benchmark, sign and publish a release, pinned by digest end to end.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    app.callback()(_root)
    for register in verbs:
        register(app)
    return app


def run(app: typer.Typer) -> None:
    """Run ``app``; a benchseal error or a usage error becomes one diagnostic line and its exit code."""
    try:
        code = app(prog_name="benchseal", standalone_mode=False)
    except NoArgsIsHelpError as exc:  # a bare group: its help, as before
        text = exc.ctx.get_help() if exc.ctx is not None else exc.format_message()  # rich help prints itself
        if text:
            typer.echo(text)
        sys.exit(2)
    except UsageError as exc:
        # Click's own report is a usage block and a framed message; ours is one line naming the
        # command and the rule, with where to read more (the developers' guide: one line, exit 2).
        command = exc.ctx.command_path if exc.ctx is not None else "benchseal"
        message = " ".join(exc.format_message().split())
        typer.echo(CLI_ERROR_PREFIX + escape_text(f"{command}: {message} (see {command} --help)"), err=True)
        sys.exit(2)
    except typer.Abort:
        typer.echo(CLI_ERROR_PREFIX + "aborted", err=True)
        sys.exit(130)
    except ClickException as exc:
        typer.echo(CLI_ERROR_PREFIX + escape_text(" ".join(exc.format_message().split())), err=True)
        sys.exit(exc.exit_code)
    except Error as exc:
        typer.echo(CLI_ERROR_PREFIX + f"{exc.diagnostics()}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:
        # A defect, not an answer: still one line (BENCHSEAL_TRACEBACK=1 shows where, for a bug report).
        if os.environ.get("BENCHSEAL_TRACEBACK") == "1":
            raise
        first = (str(exc).splitlines() or [""])[0][:300]
        typer.echo(CLI_ERROR_PREFIX + escape_text(f"unexpected {type(exc).__name__}: {first} (a benchseal defect: "
                                                  "rerun with BENCHSEAL_TRACEBACK=1 and report it)"), err=True)
        sys.exit(1)
    # Under standalone_mode=False a typer.Exit(n) comes back as n; verbs return None otherwise. Always
    # SystemExit, as Click's standalone mode ends (callers and tests rely on it).
    sys.exit(code if type(code) is int else 0)
