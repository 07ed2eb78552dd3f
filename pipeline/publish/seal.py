"""Sealing a graded run: the one path from a graded run directory to signed evidence.

Used by benchmark.yml's seal job (``benchseal evidence RUN_DIR --from-export ... --signer
ambient``) and by ``benchseal release --local`` (the local signer, as that job's identity): both
read the run exactly as ``benchseal infra export`` wrote it (run.json and grading.json from the
queue, the trial evidence) and write ``RUN_DIR/artifacts/`` with ``write_evidence``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pipeline.contracts import DispatchPayload, Grading, RunStatus, load_model
from pipeline.errors import ValidationError
from pipeline.evidence import EvidenceResult, write_evidence
from pipeline.evidence.signing import Signer
from pipeline.fsutil import staged_dir
from pipeline.infra.export import import_run


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


def seal_export(source: IO[bytes], run_dir: Path, run_id: str, signer: Callable[[], Signer]) -> Sealed:
    """Unpack ``run_id``'s export from ``source`` into the new or empty ``run_dir`` and seal it there.

    Staged: both happen in a directory next to ``run_dir``, renamed to it once the evidence is
    signed, so ``run_dir`` holds the whole sealed run or is left as it was (a refused export, a
    refused name, a failed signature leave nothing half-written). ``signer`` is called only once
    the export is accepted."""
    if run_dir.is_symlink() or (run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir()))):
        raise ValidationError("RUN_DIR", "must be a new or empty directory", str(run_dir))
    with staged_dir(run_dir) as staging:
        import_run(source, staging, run_id)
        sealed = seal_run(staging, signer=signer())
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
