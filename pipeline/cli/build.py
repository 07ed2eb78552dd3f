"""``benchseal build``: build, push and record the runner and api images by digest.

Exit codes: 0 built and confirmed; 1 a check failed (registry digest mismatch,
infrastructure); 2 bad arguments.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from pipeline.fsutil import canonical_json


def build(
    image: Annotated[list[str] | None, typer.Option("--image", help="runner or api; repeatable (default: both).")] = None,
    registry: Annotated[str | None, typer.Option("--registry", help="host:port (default $BENCHSEAL_REGISTRY or 127.0.0.1:5055).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write the digests file (benchseal.digests/v1) here, atomically.")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Extra tag to push (metadata only: the digest is what counts).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every layer (the result must be identical).")] = False,
) -> None:
    """Build the images, push them, and print/write the digests file."""
    from pipeline.build import build_images

    result = build_images(
        image or [], registry or os.environ.get("BENCHSEAL_REGISTRY", "127.0.0.1:5055"), out, tag or [], use_cache=not no_cache
    )
    typer.echo(canonical_json(result.to_json_dict()), nl=False)


def register(app: typer.Typer) -> None:
    app.command(name="build")(build)
