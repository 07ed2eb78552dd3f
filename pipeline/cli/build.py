"""``benchseal build``: build, push and record the runner and api images by digest.

With ``--project``, the project file's own images (``[images.<name>]``: Dockerfiles) are built
too, with BuildKit (pipeline.imaging.buildkit), pushed as PREFIX + name and recorded under
``project_images`` in the digests file; one line per image on stderr says how it was made
reproducible. The project file's paths are checked before anything is built. While the build waits
for the agent's npm release to appear on the registry, stderr says what it waits for and how long of
how long (``pipeline.core.waiting``: an updating line on a terminal, a plain line every 10 s in a log).

Exit codes: 0 built and confirmed; 1 a check failed (registry digest mismatch, a failing
Dockerfile build, infrastructure); 2 bad arguments.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from pipeline.core.fsutil import atomic_write_json, canonical_json

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
    from pipeline.core.waiting import WaitLines
    from pipeline.imaging.build import build_images, resolve_image_names

    names = resolve_image_names(image_prefix, registry)
    plan = builder = None
    # The project's own images are built once, in the build that makes the api (the matrix's
    # runner leg, which resolves the agent, does not build them again).
    if project is not None and (not image or "api" in image):
        # lazy: pipeline.imaging.buildkit costs 117 ms at CLI start (measured 2026-12-04, after pipeline.cli.main)
        from pipeline.imaging import buildkit

        plan = buildkit.plan(project)  # the [images] table's paths: exit 2 before anything is built
        if plan.images:
            buildkit.validate_names(plan, names)
            builder = buildkit.probe()  # no BuildKit here: exit 1 before anything is built
    with_images = plan is not None and bool(plan.images)
    result = build_images(image or [], names, None if with_images else out, tag or [], use_cache=not no_cache,
                          project=project, release_tag=release_tag, progress=WaitLines(sys.stderr))
    if plan is not None and with_images:
        built = buildkit.build_project_images(plan, names, result.source, tag or [], no_cache=no_cache, builder=builder)
        result = buildkit.with_project_images(result, built)
        for item in built:
            typer.echo(f"benchseal: {item.report()}", err=True)
        if out is not None:
            atomic_write_json(out, result.to_json_dict())
    typer.echo(canonical_json(result.to_json_dict()), nl=False)


def register(app: typer.Typer) -> None:
    app.command(name="build")(build)
