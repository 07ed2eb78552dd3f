"""``benchseal`` inside the api image: ``benchseal api serve`` (images/api/image.toml).

The api image ships fastapi, uvicorn, typer and psycopg (the queue's PostgreSQL backend) only, so it
registers only the api verb's ``serve`` (``pipeline.cli.api.register_image``).
"""

from __future__ import annotations

from pipeline.cli import api
from pipeline.cli.app import new_app, run

app = new_app(api.register_image)


def main() -> None:
    run(app)
