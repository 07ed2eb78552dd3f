"""``benchseal`` inside the api image: ``benchseal api serve`` (images/api/image.toml).

The api image ships fastapi, uvicorn and typer only, so it registers only the api verb.
"""

from __future__ import annotations

from pipeline.cli import api
from pipeline.cli.app import new_app, run

app = new_app(api.register)


def main() -> None:
    run(app)
