"""``benchseal evidence RUN_DIR``: write and sign a terminal run's artifacts.

Reads ``run.json`` (RunStatus) and ``grading.json`` (Grading) from RUN_DIR and
writes RUN_DIR/artifacts/. ``--reseal`` only re-checksums and re-signs SHA256SUMS.
Exit codes: 0 ok; 1 signing or a check failed; 2 bad input.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from pipeline.contracts import DispatchPayload, Grading, RunStatus, load_model
from pipeline.errors import ValidationError


def _load(path: Path) -> object:
    try:
        return json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ValidationError(str(path), "file does not exist") from None
    except ValueError as exc:
        raise ValidationError(str(path), f"is not JSON: {exc}") from None


_RUN_DIR = typer.Argument(..., help="Run directory holding run.json and grading.json.")


def evidence(
    run_dir: Path = _RUN_DIR,
    signer_kind: str = typer.Option("auto", "--signer", help="auto | local | ambient"),
    rekor: int = typer.Option(1, "--rekor", help="Rekor API version for the local signer (1 or 2)."),
    reseal: bool = typer.Option(False, "--reseal", help="Only re-checksum and re-sign SHA256SUMS."),
) -> None:
    """Write summary.json, SBOMs, provenance, SHA256SUMS and Sigstore bundles."""
    from pipeline.evidence import reseal as do_reseal
    from pipeline.evidence import write_evidence
    from pipeline.evidence.signing import ambient_signer, default_signer, local_signer

    if signer_kind not in ("auto", "local", "ambient"):
        raise ValidationError("--signer", "must be auto, local or ambient", signer_kind)
    if signer_kind == "local":
        signer = local_signer(rekor_version=rekor)
    else:
        signer = ambient_signer() if signer_kind == "ambient" else default_signer()
    if reseal:
        typer.echo(f"resealed: {do_reseal(run_dir / 'artifacts', signer=signer)}")
        return
    status = load_model(RunStatus, _load(run_dir / "run.json"), "run.json")
    grading = load_model(Grading, _load(run_dir / "grading.json"), "grading.json")
    payload = load_model(DispatchPayload, {
        "schema": "benchseal.dispatch/v1", "correlation_id": status.correlation_id,
        "source": status.source.model_dump(mode="json"), "runner": status.runner, "api": status.api,
        "suite": status.suite, "agent": status.agent,
    }, "run.json")
    result = write_evidence(run_dir, grading, payload, signer=signer)
    typer.echo(f"evidence written: {result.artifacts} ({len(result.bundles)} bundles, signer {result.identity})")


def register(app: typer.Typer) -> None:
    app.command(name="evidence")(evidence)
