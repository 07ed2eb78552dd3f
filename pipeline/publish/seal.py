"""Sealing a graded run: the one path from a graded run directory to signed evidence.

Used by benchmark.yml's seal job (``benchseal evidence RUN_DIR --from-export ... --signer
ambient``) and by ``benchseal release --local`` (the local signer, as that job's identity): both
read the run exactly as ``benchseal infra export`` wrote it (run.json and grading.json from the
queue, the trial evidence) and write ``RUN_DIR/artifacts/`` with ``write_evidence``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.contracts import DispatchPayload, Grading, RunStatus, load_model
from pipeline.errors import ValidationError
from pipeline.evidence import EvidenceResult, write_evidence
from pipeline.evidence.signing import Signer


@dataclass(frozen=True)
class Sealed:
    status: RunStatus
    grading: Grading
    evidence: EvidenceResult

    def to_json_dict(self) -> dict[str, object]:
        return {"artifacts": str(self.evidence.artifacts), "run_id": self.status.run_id, "state": self.status.state,
                "repository": self.status.source.repository, "tag": self.status.source.tag,
                "commit": self.status.source.commit, "identity": self.evidence.identity,
                "issuer": self.evidence.issuer, "bundles": len(self.evidence.bundles)}


def _load(path: Path) -> object:
    try:
        return json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ValidationError(str(path), "file does not exist") from None
    except ValueError as exc:
        raise ValidationError(str(path), f"is not JSON: {exc}") from None


def seal_run(run_dir: Path, *, signer: Signer) -> Sealed:
    """Write and sign the evidence of the graded run in ``run_dir`` (run.json + grading.json)."""

    status = load_model(RunStatus, _load(run_dir / "run.json"), "run.json")
    grading = load_model(Grading, _load(run_dir / "grading.json"), "grading.json")
    if grading.run_id != status.run_id:
        raise ValidationError("grading.json run_id", f"must be run.json's {status.run_id}", grading.run_id)
    payload = load_model(DispatchPayload, {
        "schema": "benchseal.dispatch/v1", "correlation_id": status.correlation_id,
        "source": status.source.model_dump(mode="json"), "runner": status.runner, "api": status.api,
        "suite": status.suite, "agent": status.agent,
    }, "run.json")
    return Sealed(status, grading, write_evidence(run_dir, grading, payload, signer=signer))
