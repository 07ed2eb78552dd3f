"""``benchseal doctor adopter|infra|host``: check a production setup, one line per check with its fix.

Exit codes: 0 every check passed (or could not be made: ``UNKNOWN``, or ``--offline``: ``SKIPPED``),
1 a check failed (``MISSING``), 2 bad input (a repository name, no token).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from pipeline.core.contracts import validate_repository
from pipeline.core.doctor import Finding, Side, exit_code
from pipeline.core.errors import ValidationError
from pipeline.host.doctor import (
    PUBLIC_GOOD_REKOR,
    HostOptions,
    check_host,
    checkout_place,
    policy_findings,
    suites_findings,
)
from pipeline.host.install import SUITES_DIR, validate_user_name

doctor_app = typer.Typer(help="Check a production setup against what the chain needs (docs/github.md, docs/host.md).",
                         no_args_is_help=True)

_DIR = typer.Option("--dir", help="The repository's checkout, where its caller workflow is read (default: here).")
_JSON = typer.Option("--json", help="One JSON object: {ok, findings: [{side, check, status, detail, fix}]}.")


def _report(findings: Sequence[Finding], as_json: bool) -> None:
    code = exit_code(findings)
    if as_json:
        typer.echo(json.dumps({"ok": code == 0, "findings": [f.model_dump() for f in findings]}, indent=2))
    else:
        for finding in findings:
            typer.echo(finding.line())
        failed = sum(1 for f in findings if f.status == "missing")
        unknown = sum(1 for f in findings if f.status == "unknown")
        summary = f"{failed} of {len(findings)} checks failed" if failed else f"all {len(findings)} checks passed"
        typer.echo(summary + (f"; {unknown} could not be made (UNKNOWN: check by hand)" if unknown else ""))
    raise typer.Exit(code)


_SOURCE = typer.Option("--source", help="An adopter repository (OWNER/NAME) the policy must list, with an agent for it.")


def _repository(side: Side, repository: str, checkout: Path, as_json: bool, source: str | None = None) -> None:
    validate_repository(repository, "repository")
    if source is not None:
        validate_repository(source, "--source")
    # lazy: pipeline.dispatch (PyGithub) costs 120 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.dispatch.client import make_client
    from pipeline.dispatch.doctor import check_repository

    found = check_repository(side, repository, checkout, make_client())
    if side == "infra":  # the policy and suites the infra repository holds, checked as the host's are
        place = checkout_place(checkout)
        policy_found, policy = policy_findings(place, source)
        found += policy_found + (suites_findings(place, policy) if policy is not None else [])
    _report(found, as_json)


@doctor_app.command("adopter")
def adopter(
    repository: Annotated[str, typer.Argument(help="Your repository, OWNER/NAME.")],
    checkout: Annotated[Path, _DIR] = Path("."),
    as_json: Annotated[bool, _JSON] = False,
) -> None:
    """The caller of benchseal's release.yml (pinned), the variables and secret of step 6, the token's scopes."""
    _repository("adopter", repository, checkout, as_json)


@doctor_app.command("infra")
def infra(
    repository: Annotated[str, typer.Argument(help="The infra repository, OWNER/NAME.")],
    checkout: Annotated[Path, _DIR] = Path("."),
    source: Annotated[str | None, _SOURCE] = None,
    as_json: Annotated[bool, _JSON] = False,
) -> None:
    """The caller of benchseal's benchmark.yml (pinned), the publish secret, a runner with the label its jobs need,
    policies/infra.yaml and suites/ (each dataset by its pinned digest)."""
    _repository("infra", repository, checkout, as_json, source)


@doctor_app.command("host")
def host(
    prefix: Annotated[Path, typer.Option("--prefix", help="The host's root filesystem (default /).")] = Path("/"),
    service_user: Annotated[str, typer.Option("--service-user", help="The worker's user.")] = "benchseal",
    suites_dir: Annotated[str, typer.Option("--suites-dir", help="Where the worker reads suites.")] = SUITES_DIR,
    sigstore_url: Annotated[str, typer.Option("--sigstore-url", help="The Sigstore service to reach.")] = PUBLIC_GOOD_REKOR,
    offline: Annotated[bool, typer.Option("--offline", help="Skip the network check (reported SKIPPED).")] = False,
    source: Annotated[str | None, _SOURCE] = None,
    as_json: Annotated[bool, _JSON] = False,
) -> None:
    """The policy and its agents, each suite's dataset by digest, the units, the queue, Sigstore."""
    if not prefix.is_absolute():
        raise ValidationError("--prefix", "must be an absolute path", str(prefix))
    validate_user_name("--service-user", service_user)
    if source is not None:
        validate_repository(source, "--source")
    if not sigstore_url.startswith(("https://", "http://")):
        raise ValidationError("--sigstore-url", "must be an http(s) URL", sigstore_url)
    _report(check_host(HostOptions(prefix=prefix, service_user=service_user, suites_dir=suites_dir,
                                   sigstore_url=sigstore_url, offline=offline, source=source)), as_json)


def register(app: typer.Typer) -> None:
    app.add_typer(doctor_app, name="doctor")
