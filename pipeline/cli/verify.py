"""``benchseal verify DIR [--policy FILE] [--trusted-root FILE] [--offline]``.

Exit codes: 0 verified; 1 a check failed (the message names the first failure);
2 usage error.
"""

from __future__ import annotations

from pathlib import Path

import typer

_DIR = typer.Argument(..., help="Release or artifacts directory.")
_POLICY = typer.Option(None, "--policy", help="Verification policy (default: policies/verify.yaml).")
_ROOT = typer.Option(None, "--trusted-root", help="Sigstore trusted_root.json (selects the local profile).")


def verify(
    directory: Path = _DIR,
    policy: Path | None = _POLICY,
    trusted_root: Path | None = _ROOT,
    offline: bool = typer.Option(False, "--offline", help="Use the embedded public-good root; no network."),
    profile: str | None = typer.Option(None, "--profile", help="Policy profile (default: local with --trusted-root, else production)."),
) -> None:
    """Verify every bundle, every checksum and the digest bindings of a release."""
    from pipeline.verify import verify_release

    verify_release(directory, policy=policy, trusted_root=trusted_root, offline=offline, profile=profile)
    typer.echo(f"verified: {directory}")


def register(app: typer.Typer) -> None:
    app.command(name="verify")(verify)
