"""``benchseal evidence RUN_DIR``: write and sign a terminal run's artifacts.

Reads ``run.json`` (RunStatus) and ``grading.json`` (Grading) from RUN_DIR and
writes RUN_DIR/artifacts/. ``--reseal`` only re-checksums and re-signs SHA256SUMS.

``--from-export FILE --run-id ID`` first unpacks a graded run that ``benchseal infra export``
wrote (benchmark.yml's seal job: the worker grades, the job seals with its ambient identity)
into the new or empty RUN_DIR, checking it is that run's graded terminal state.

Before anything is signed, the run must pass the infra policy (``--policy``, default
$BENCHSEAL_INFRA_POLICY or policies/infra.yaml: its source repository, images, suite and agent, as
``infra accept`` checks them), and grading.json and run.json must be what the trial evidence says
(every trial graded again with the worker's rule). A refusal is one line naming the field, exit 1.

The signer: ``ambient`` (= ``auto``): the GitHub Actions OIDC credential of the job, public-good
Sigstore unless ``--sigstore-url``/``--trusted-root`` name a private instance (tests); ``local``:
the private instance's own identity, only when asked for.
Exit codes: 0 ok; 1 signing or a check failed; 2 bad input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from pipeline.cli.attest import sigstore_endpoints
from pipeline.cli.signers import signer_factory
from pipeline.core.errors import ValidationError

_RUN_DIR = typer.Argument(..., help="Run directory holding run.json and grading.json.")


def evidence(
    run_dir: Path = _RUN_DIR,
    signer_kind: str = typer.Option("auto", "--signer", help="auto | local | ambient"),
    rekor: int = typer.Option(1, "--rekor", help="Rekor API version for the local signer (1 or 2)."),
    reseal: bool = typer.Option(False, "--reseal", help="Only re-checksum and re-sign SHA256SUMS."),
    from_export: str | None = typer.Option(None, "--from-export", help="A `benchseal infra export` tar ('-': stdin) "
                                                                          "to unpack into RUN_DIR first."),
    run_id: str | None = typer.Option(None, "--run-id", help="With --from-export: the run the export must be."),
    sigstore_url: str | None = typer.Option(None, "--sigstore-url", envvar="BENCHSEAL_SIGSTORE_URL",
                                            help="Ambient signing against a private instance (http://127.0.0.1:PORT)."),
    trusted_root: str | None = typer.Option(None, "--trusted-root", envvar="BENCHSEAL_TRUSTED_ROOT",
                                            help="That instance's trusted_root.json (with --sigstore-url)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was sealed as JSON."),
    policy_path: str | None = typer.Option(None, "--policy", help="Infra policy the run must pass (default: "
                                            "$BENCHSEAL_INFRA_POLICY, else policies/infra.yaml)."),
) -> None:
    """Write summary.json, SBOMs, provenance, SHA256SUMS and Sigstore bundles."""
    # lazy: pipeline.evidence.writer (sigstore, cyclonedx) costs 365 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.evidence.writer import reseal as do_reseal

    # lazy: pipeline.infra.intake.policy (yaml) costs 20 ms at CLI start (python -X importtime, 2026-12-03)
    from pipeline.infra.intake.policy import load_policy

    if (from_export is None) != (run_id is None):
        raise ValidationError("--from-export/--run-id", "go together: the export and the run it must be")
    if from_export is not None and reseal:
        raise ValidationError("--reseal", "cannot be combined with --from-export")
    endpoints = sigstore_endpoints(sigstore_url, Path(trusted_root) if trusted_root else None)
    make_signer = signer_factory(signer_kind, endpoints, rekor_version=rekor)
    policy = None if reseal else load_policy(Path(policy_path) if policy_path else None)

    # lazy: pipeline.publish.seal (sigstore, cyclonedx) costs 194 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.publish.seal import seal_export, seal_run

    if from_export is not None and run_id is not None:
        # Staged: RUN_DIR appears with the sealed run, or stays as it was (a refused export leaves nothing).
        if from_export == "-":
            sealed = seal_export(sys.stdin.buffer, run_dir, run_id, make_signer, policy)
        else:
            try:
                handle = Path(from_export).open("rb")
            except FileNotFoundError:
                raise ValidationError("--from-export", "file does not exist", str(from_export)) from None
            except OSError as exc:
                raise ValidationError("--from-export", f"cannot be read ({exc.strerror})", str(from_export)) from None
            with handle:
                sealed = seal_export(handle, run_dir, run_id, make_signer, policy)
    elif reseal:
        typer.echo(f"resealed: {do_reseal(run_dir / 'artifacts', signer=make_signer())}")
        return
    else:
        sealed = seal_run(run_dir, signer=make_signer, policy=policy)
    if as_json:
        typer.echo(json.dumps(sealed.to_json_dict(), sort_keys=True))
        return
    result = sealed.evidence
    typer.echo(f"evidence written: {result.artifacts} ({len(result.bundles)} bundles, signer {result.identity})")


def register(app: typer.Typer) -> None:
    app.command(name="evidence")(evidence)
