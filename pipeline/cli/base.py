"""``benchseal base build|show``: the mmdebstrap base images and their lock."""

from __future__ import annotations

import json

import typer

from pipeline.core.documents import base_lock_path, read_base_lock
from pipeline.core.fsutil import canonical_json

base_app = typer.Typer(help="Debian base images (mmdebstrap, fixed SOURCE_DATE_EPOCH) pushed by digest.", no_args_is_help=True)


@base_app.command()
def build(
    image_prefix: str = typer.Option(None, "--image-prefix", help="Registry and repository prefix: the bases are "
                                     "PREFIX + base|runner-base (see `benchseal build --help`)."),
    registry: str = typer.Option(None, "--registry", help="host:port: shorthand for --image-prefix HOST:PORT/benchseal/ "
                                 "(default $BENCHSEAL_IMAGE_PREFIX, $BENCHSEAL_REGISTRY, else 127.0.0.1:5055)."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Assemble and push even when the lock and registry agree."),
    local: bool = typer.Option(False, "--local", help="Also pull each base by digest into the local engine."),
) -> None:
    """Build (if needed) and push the base images; write images/base.lock.json. Idempotent."""
    # lazy: pipeline.imaging.build (docker, installer) costs 96 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.imaging.build import ensure_base, ensure_local, resolve_image_names

    refs = ensure_base(resolve_image_names(image_prefix, registry), rebuild=rebuild)
    if local:
        for ref in refs.values():
            ensure_local(ref)
    typer.echo(canonical_json({name: ref.ref for name, ref in refs.items()}), nl=False)


@base_app.command()
def show() -> None:
    """Print the lock (name, ref, epoch, package count) without building."""

    lock = read_base_lock().images
    if not lock:
        typer.echo(f"no lock at {base_lock_path()}; run `benchseal base build`", err=True)
        raise typer.Exit(1)
    summary = {name: {"ref": e.ref, "epoch": e.epoch, "packages": len(e.packages)} for name, e in lock.items()}
    typer.echo(json.dumps(summary, indent=2, sort_keys=True))


def register(app: typer.Typer) -> None:
    app.add_typer(base_app, name="base")
