"""Sealing a graded run: the one path from a graded run directory to signed evidence.

Used by benchmark.yml's seal job (``benchseal evidence RUN_DIR --from-export ... --signer
ambient``) and by ``benchseal release --local`` (the local signer, as that job's identity): both
read the run exactly as ``benchseal infra export`` wrote it (run.json and grading.json from the
queue, the trial evidence) and write ``RUN_DIR/artifacts/`` with ``write_evidence``.

Before anything is signed (``check_sealable``): the run's source, images, suite and agent must pass
the infra policy as ``infra accept`` checks them (a run for a repository the policy does not list is
not sealed); grading.json must be what the trial evidence says (``evidence.trials``: every trial
graded again with the worker's rule), run.json must say the same counts and score, a SUCCEEDED
grading must be one the policy's infrastructure-error threshold allows, and its comparison.json (the
queue's record of the comparison with the repository's previous release) must be what
``pipeline.core.history`` gives from the graded trials under the policy's gate for the suite (a
scored run of a gated suite without one is refused: the gate is never skipped). Each refusal is one
line naming the field (exit 1).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pipeline.core.contracts import DispatchPayload, Grading, RunStatus, load_model, validate_run_id
from pipeline.core.documents import Comparison, load_document
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.fsutil import sha256_file, staged_dir
from pipeline.core.history import check_graded_comparison
from pipeline.core.layout import ARTIFACTS_DIR
from pipeline.core.scoring import Claim, check_counts
from pipeline.evidence.scrub import secret_values
from pipeline.evidence.signing import Signer
from pipeline.evidence.trials import check_grading
from pipeline.evidence.writer import EvidenceResult, write_evidence
from pipeline.infra.intake.accept import validate_payload
from pipeline.infra.intake.policy import InfraPolicy, load_policy
from pipeline.infra.worker.export import COMPARISON, import_run


@dataclass(frozen=True)
class Sealed:
    status: RunStatus
    grading: Grading
    evidence: EvidenceResult
    comparison: Comparison | None = None

    def to_json_dict(self) -> dict[str, object]:
        return {"artifacts": str(self.evidence.artifacts), "run_id": self.status.run_id, "state": self.status.state,
                "repository": self.status.source.repository, "tag": self.status.source.tag,
                "commit": self.status.source.commit, "identity": self.evidence.identity,
                "issuer": self.evidence.issuer, "bundles": len(self.evidence.bundles),
                "summary_digest": f"sha256:{sha256_file(self.evidence.summary)}",
                "gated": self.comparison.gated if self.comparison is not None else False,
                "gate_reasons": list(self.comparison.reasons) if self.comparison is not None else []}


def _load(path: Path) -> object:
    try:
        return json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ValidationError(str(path), "file does not exist") from None
    except ValueError as exc:
        raise ValidationError(str(path), f"is not JSON: {exc}") from None


def check_sealable(run_dir: Path, policy: InfraPolicy | None = None
                   ) -> tuple[RunStatus, Grading, DispatchPayload, Comparison | None]:
    """The graded run in ``run_dir`` (run.json + grading.json + trial evidence), checked as the module
    says; CheckFailed (one line, naming the field) before anything is written or signed."""
    status = load_model(RunStatus, _load(run_dir / "run.json"), "run.json")
    grading = load_model(Grading, _load(run_dir / "grading.json"), "grading.json")
    if grading.run_id != status.run_id:
        raise ValidationError("grading.json run_id", f"must be run.json's {status.run_id}", grading.run_id)
    payload = load_model(DispatchPayload, {
        "schema": "benchseal.dispatch/v1", "correlation_id": status.correlation_id,
        "source": status.source.model_dump(mode="json"), "runner": status.runner, "api": status.api,
        "suite": status.suite, "agent": status.agent,
        **({"agent_artifact": status.agent_artifact.model_dump(mode="json")} if status.agent_artifact else {}),
    }, "run.json")
    policy = policy if policy is not None else load_policy()
    try:
        # The checks `infra accept` made when the run was admitted, made again by the job that signs.
        validate_payload(payload.to_json_dict(), policy)
    except ValidationError as exc:
        field = exc.field.replace("payload.", "run.", 1)
        raise CheckFailed(f"{field}: {exc.rule} (got {exc.value!r}); the infra policy does not admit this run, "
                          "so it is not sealed") from None
    if status.state != grading.status:
        raise CheckFailed(f"run.state: {str(status.state)!r} in run.json, but grading.json says {grading.status!r}")
    _, _, counts = check_grading(run_dir / ARTIFACTS_DIR, grading)
    check_counts(Claim(document="run.json", label="run", run_id=status.run_id, status=status.state,
                       counts=status.counts, score=status.score), counts)
    if grading.status == "SUCCEEDED" and policy.infra_errors_exceed_threshold(counts.infra_errors, counts.total):
        raise CheckFailed(f"grading.status: 'SUCCEEDED' in grading.json, but {counts.infra_errors} of {counts.total} "
                          f"trials are infrastructure errors in the trial evidence, more than the policy's "
                          f"{policy.infra_error_threshold_percent:g}% allows")
    return status, grading, payload, _check_comparison(run_dir, grading, policy)


def _check_comparison(run_dir: Path, grading: Grading, policy: InfraPolicy) -> Comparison | None:
    """comparison.json, recomputed from the graded trials, under the policy's gate for the suite."""
    suite = policy.suites.get(grading.suite)
    gate = suite.gate if suite is not None else None
    path = run_dir / COMPARISON
    if not path.exists():
        if grading.status == "SUCCEEDED" and gate is not None:
            raise CheckFailed(f"{COMPARISON}: missing, but suite {grading.suite!r} has a regression gate: the run was "
                              "not compared with the repository's previous release, so it is not sealed")
        return None
    comparison = load_document(Comparison, path)
    if grading.status != "SUCCEEDED":
        raise CheckFailed(f"{COMPARISON}: present for a {grading.status} run; only a scored run is compared")
    if comparison.gate != gate:
        raise CheckFailed(f"{COMPARISON}.gate: {comparison.gate!r} is not the policy's gate for suite "
                          f"{grading.suite!r} ({gate!r})")
    check_graded_comparison(comparison, grading, COMPARISON)
    return comparison


def seal_run(run_dir: Path, *, signer: Signer | Callable[[], Signer], policy: InfraPolicy | None = None) -> Sealed:
    """Check (``check_sealable``), then write and sign the evidence of the graded run in ``run_dir``.
    ``signer`` may be a factory, called only once the run is accepted (no credential is asked for a
    run that is refused)."""
    policy = policy if policy is not None else load_policy()
    status, grading, payload, comparison = check_sealable(run_dir, policy)
    chosen = signer if isinstance(signer, Signer) else signer()
    # The policy's secret values this process holds never reach a published byte (evidence.scrub).
    secrets = secret_values(policy.secret_env)
    return Sealed(status, grading, write_evidence(run_dir, grading, payload, signer=chosen, comparison=comparison,
                                                  secrets=secrets), comparison)


def seal_export(source: IO[bytes], run_dir: Path, run_id: str, signer: Callable[[], Signer],
                policy: InfraPolicy | None = None) -> Sealed:
    """Unpack ``run_id``'s export from ``source`` into the new or empty ``run_dir`` and seal it there.

    Staged: both happen in a directory next to ``run_dir``, renamed to it once the evidence is
    signed, so ``run_dir`` holds the whole sealed run or is left as it was (a refused export, a
    refused name, a failed check or signature leave nothing half-written). ``signer`` is called only
    once the export and its run are accepted."""
    if run_dir.is_symlink() or (run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir()))):
        raise ValidationError("RUN_DIR", "must be a new or empty directory", str(run_dir))
    validate_run_id(run_id, "--run-id")
    with staged_dir(run_dir) as staging:
        try:
            import_run(source, staging, run_id)
        except ValidationError as exc:
            # What the export holds is not the caller's input: a document in it that breaks its model (a
            # FAILED run with a score, a count that is not an integer) is a refused export, exit 1.
            raise CheckFailed(f"export: {exc.diagnostics()}") from None
        sealed = seal_run(staging, signer=signer, policy=policy)
    return dataclasses.replace(sealed, evidence=_moved(sealed.evidence, staging, run_dir))


def _moved(value: Any, old: Path, new: Path) -> Any:
    """``value`` with every path under ``old`` (a dataclass's fields, tuples, dicts) now under ``new``."""
    if isinstance(value, Path):
        return new / value.relative_to(old) if value.is_relative_to(old) else value
    if isinstance(value, tuple):
        return tuple(_moved(item, old, new) for item in value)
    if isinstance(value, dict):
        return {key: _moved(item, old, new) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _moved(getattr(value, f.name), old, new)
                                             for f in dataclasses.fields(value) if f.init})
    return value
