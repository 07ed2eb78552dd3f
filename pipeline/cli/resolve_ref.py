"""``benchseal resolve-ref --repo OWNER/NAME --tag vX.Y.Z [--json]``

Prints the 40-hex commit the tag points at, peeling annotated tags (and tags
of tags). Token from GITHUB_TOKEN / GH_TOKEN, API root from GITHUB_API_URL.

Exit codes: 0 resolved; 1 tag missing, not a commit, or GitHub failed;
2 bad arguments or no token.
"""

from __future__ import annotations

import json

import typer

from pipeline.core.contracts import validate_repository


def register(app: typer.Typer) -> None:
    app.command("resolve-ref")(resolve_ref)


def resolve_ref(
    repo: str = typer.Option(..., "--repo", help="OWNER/NAME of the source repository."),
    tag: str = typer.Option(..., "--tag", help="Tag to resolve, e.g. v1.2.3."),
    as_json: bool = typer.Option(False, "--json", help="Print {repository, tag, commit} as JSON."),
) -> None:
    """Resolve a tag to its commit via the GitHub API."""
    # lazy: pipeline.dispatch (PyGithub) costs 120 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.dispatch.client import make_client
    from pipeline.dispatch.resolve import resolve_tag, tag_of_ref

    validate_repository(repo)
    tag = tag_of_ref(tag)
    commit = resolve_tag(make_client(), repo, tag)
    if as_json:
        typer.echo(json.dumps({"repository": repo, "tag": tag, "commit": commit}, sort_keys=True))
    else:
        typer.echo(commit)
