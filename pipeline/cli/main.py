"""The ``benchseal`` command line: one module per verb under ``pipeline.cli``.

Each verb module exposes ``register(app)``. Verb modules import heavy libraries
(docker, sigstore, PyGithub, harbor) inside their functions, so the CLI starts
fast and also runs inside the runner image, which ships only what trials need.

Exit codes: 0 success, 1 a check failed, 2 usage error (bad input).
"""

from __future__ import annotations

import importlib
import sys

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
)

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
) -> None:
    """benchseal: the release pipeline that scores every release."""


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
