"""``benchseal host install``: set up an infra host (service user, directories, units, sudo rule; with
``--api-image``, the API's unit).

Exit codes: 0 installed (or nothing to change); 1 a failed check (not root, visudo rejected
the rule, unsafe ownership, a tool failed); 2 bad input (user names, prefix).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pipeline.host.install import InstallOptions
from pipeline.host.install import install as run_install

host_app = typer.Typer(help="Set up the infra host from deploy/ (see docs/host.md).", no_args_is_help=True)


@host_app.command("install")
def install(
    runner_user: Annotated[str, typer.Option("--runner-user", help="The user the self-hosted Actions runner runs as; the sudo rule names it.")],
    service_user: Annotated[str, typer.Option("--service-user", help="The system user the worker and publisher run as.")] = "benchseal",
    prefix: Annotated[Path, typer.Option("--prefix", help="Root filesystem to install into (a chroot or image root).")] = Path("/"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would change; change nothing.")] = False,
    api_image: Annotated[str | None, typer.Option("--api-image", help="The API image by digest "
                                                  "(REGISTRY/REPOSITORY@sha256:<64 hex>): installs "
                                                  "benchseal-api.service, which runs it read-only on 127.0.0.1.")] = None,
    infra_checkout: Annotated[Path | None, typer.Option("--infra-checkout", help="A checkout of the infra "
                                                        "repository: install its policies/infra.yaml and suites/ "
                                                        "(their one home; docs/host.md).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
) -> None:
    """Create the service user and directories, install units, wrappers, sudo rule and policy; idempotent."""

    report = run_install(InstallOptions(runner_user=runner_user, service_user=service_user, prefix=prefix,
                                        dry_run=dry_run, api_image=api_image,
                                        infra_checkout=infra_checkout.resolve() if infra_checkout else None))
    if as_json:
        typer.echo(json.dumps(report.to_json_dict(), indent=2))
        return
    title = "benchseal host install (dry run: nothing changed)" if dry_run else "benchseal host install"
    typer.echo(f"{title}{'' if str(prefix) == '/' else f' into {prefix}'}")
    for action in report.actions:
        detail = f"  ({action.detail})" if action.detail else ""
        typer.echo(f"  {action.action:<16} {action.path}{detail}")
    for warning in report.warnings:
        typer.echo(f"warning: {warning}", err=True)
    typer.echo("\nLeft to do by hand:")
    for number, step in enumerate(report.manual_steps, 1):
        typer.echo(f"  {number}. {step}")


def register(app: typer.Typer) -> None:
    app.add_typer(host_app, name="host")
