"""``benchseal build``: build, push and record the runner and api images by digest.

Exit codes: 0 built and confirmed; 1 a check failed (registry digest mismatch,
infrastructure); 2 bad arguments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.core.fsutil import canonical_json

PREFIX_HELP = ("Registry and repository prefix of every image: PREFIX + runner|api|base|runner-base, e.g. "
               "ghcr.io/OWNER/benchseal- (default $BENCHSEAL_IMAGE_PREFIX, else --registry / $BENCHSEAL_REGISTRY "
               "as HOST:PORT/benchseal/, else 127.0.0.1:5055/benchseal/).")
REGISTRY_HELP = "host:port: shorthand for --image-prefix HOST:PORT/benchseal/ (default $BENCHSEAL_REGISTRY)."


def build(
    image: Annotated[list[str] | None, typer.Option("--image", help="runner or api; repeatable (default: both).")] = None,
    image_prefix: Annotated[str | None, typer.Option("--image-prefix", help=PREFIX_HELP)] = None,
    registry: Annotated[str | None, typer.Option("--registry", help=REGISTRY_HELP)] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write the digests file (benchseal.digests/v1) here, atomically.")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Extra tag to push (metadata only: the digest is what counts).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every layer (the result must be identical).")] = False,
    project: Annotated[Path | None, typer.Option("--project", help="The project file (benchseal.toml) whose agent the runner carries, resolved and checked at the release's version.")] = None,
    release_tag: Annotated[str | None, typer.Option("--release-tag", help="The release tag the agent's version comes from (default: the checkout's tag).")] = None,
) -> None:
    """Build the images, push them, and print/write the digests file."""
    # lazy: pipeline.imaging.build (docker, installer) costs 96 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.imaging.build import build_images, resolve_image_names

    names = resolve_image_names(image_prefix, registry)
    result = build_images(image or [], names, out, tag or [], use_cache=not no_cache, project=project,
                          release_tag=release_tag)
    typer.echo(canonical_json(result.to_json_dict()), nl=False)


def register(app: typer.Typer) -> None:
    app.command(name="build")(build)
