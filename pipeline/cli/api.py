"""``benchseal api serve``: the run status/results service (runs in the api image)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

api_app = typer.Typer(help="The HTTP API over run directories (health, run status, results).", no_args_is_help=True)


@api_app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind (the image binds 0.0.0.0 inside its network namespace)."),
    port: int = typer.Option(8080, min=1, max=65535),
    runs: Annotated[Path, typer.Option(help="Directory holding <run_id>/run.json.")] = Path("/runs"),
) -> None:
    """Serve the API with uvicorn until interrupted."""
    # lazy: pipeline.api.app (fastapi) + uvicorn cost 154 ms at CLI start (bench/cli.py, 2026-12-03)
    import uvicorn

    from pipeline.api.app import create_app

    uvicorn.run(create_app(runs), host=host, port=port, log_level="info")


def register(app: typer.Typer) -> None:
    app.add_typer(api_app, name="api")
