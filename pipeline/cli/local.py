"""``benchseal local registry|sigstore|model-server|npm-registry``: the local world's services under one noun.

They stand in for production services on one machine (pipeline/local/): the OCI registry on
127.0.0.1:5055, the private Sigstore instance, the scripted OpenAI-compatible model, the npm
registry (verdaccio) an npm agent is published to. The old top-level names (``benchseal registry
...``, ``sigstore ...``, ``model-server ...``) still work, hidden from ``--help``.
"""

from __future__ import annotations

import typer

from pipeline.cli.model_server import model_app
from pipeline.cli.npm_registry import npm_registry_app
from pipeline.cli.registry import registry_app
from pipeline.cli.sigstore_local import sigstore_app

local_app = typer.Typer(help="The local world's services: registry, private Sigstore instance, scripted model, "
                             "npm registry.",
                        no_args_is_help=True)
local_app.add_typer(registry_app, name="registry")
local_app.add_typer(sigstore_app, name="sigstore")
local_app.add_typer(model_app, name="model-server")
local_app.add_typer(npm_registry_app, name="npm-registry")


def register(app: typer.Typer) -> None:
    app.add_typer(local_app, name="local")
    # The names before the local group: still accepted, no longer listed.
    app.add_typer(registry_app, name="registry", hidden=True)
    app.add_typer(sigstore_app, name="sigstore", hidden=True)
    app.add_typer(model_app, name="model-server", hidden=True)
