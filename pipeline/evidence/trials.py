"""The trial evidence a score is sealed from, checked before anything is signed, and shipped with it.

A run's ``artifacts/evidence/`` holds the plan (``trials.json``) and the Harbor trial dirs the worker
copied (``harbor/<trial>/result.json``). Before writing or signing anything, sealing grades every
planned trial again from those bytes with the worker's own rule (``pipeline.core.scoring``) and refuses a
grading.json that says anything else, in one line naming the field. What it graded is written to
``trial-results.json`` (the plan and each result.json, byte for byte): a release is flat, so this asset
carries them to ``benchseal verify``, which grades them once more and binds them to
``evidence-SHA256SUMS`` (signed through SHA256SUMS).
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from pipeline.core.contracts import GradeCounts, Grading
from pipeline.core.documents import EmbeddedFile, TrialResults, dump_document
from pipeline.core.errors import CheckFailed
from pipeline.core.fsutil import NotRegularFile, open_regular
from pipeline.core.layout import TRIAL_RESULTS, nested_files
from pipeline.core.scoring import (
    PLAN_NAME,
    Claim,
    ClaimedTrial,
    EvidenceTrial,
    TrialEvidence,
    check_claim,
    evidence_trials,
    is_result_name,
    result_name,
)

__all__ = ["check_grading", "grading_claim", "read_trial_evidence", "write_trial_results"]

# One result.json larger than this is not Harbor's (they are a few KiB): refused, not read into memory.
MAX_RESULT_BYTES = 16 * 1024 * 1024


def _read(path: Path, name: str) -> bytes:
    """The bytes of a regular file, never through a link (the evidence listing already skipped links)."""
    try:
        handle, info = open_regular(path)
    except NotRegularFile:
        raise CheckFailed(f"{name}: not a regular file") from None
    except OSError as exc:
        raise CheckFailed(f"{name}: cannot be read ({exc.strerror})") from None
    with handle:
        if info.st_size > MAX_RESULT_BYTES:
            raise CheckFailed(f"{name}: {info.st_size} bytes, more than a trial result may be ({MAX_RESULT_BYTES})")
        return handle.read(MAX_RESULT_BYTES + 1)


def read_trial_evidence(artifacts: Path) -> TrialEvidence:
    """The trial evidence under ``artifacts/evidence/``, named as evidence-SHA256SUMS will list it."""
    files = {path.relative_to(artifacts).as_posix(): path for path in nested_files(artifacts)} if artifacts.is_dir() else {}
    names = frozenset(name for name in files if name.startswith("evidence/"))
    plan = _read(files[PLAN_NAME], PLAN_NAME) if PLAN_NAME in files else None
    results = {name.split("/")[2]: _read(files[name], name) for name in sorted(names) if is_result_name(name)}
    return TrialEvidence(plan=plan, names=names, results=results)


def grading_claim(grading: Grading) -> Claim:
    return Claim(document="grading.json", label="grading", run_id=grading.run_id, status=grading.status,
                 counts=grading.counts, score=grading.score,
                 trials=tuple(ClaimedTrial(t.task, t.trial_name, t.outcome, t.reward) for t in grading.trials))


def check_grading(artifacts: Path, grading: Grading) -> tuple[TrialEvidence, tuple[EvidenceTrial, ...], GradeCounts]:
    """Grade the trial evidence under ``artifacts`` again and require grading.json to say the same;
    CheckFailed names the first field that differs. Returns the evidence, its graded trials and counts."""
    evidence = read_trial_evidence(artifacts)
    claim = grading_claim(grading)
    trials = evidence_trials(evidence, claim)
    return evidence, trials, check_claim(claim, trials)


def _embedded(name: str, data: bytes) -> EmbeddedFile:
    return EmbeddedFile(name=name, sha256=hashlib.sha256(data).hexdigest(), content=base64.b64encode(data).decode())


def write_trial_results(artifacts: Path, run_id: str, evidence: TrialEvidence) -> Path:
    """``trial-results.json``: the plan and every trial's result.json that ``evidence`` holds, byte for byte."""
    files = [_embedded(PLAN_NAME, evidence.plan)] if evidence.plan is not None else []
    files += [_embedded(result_name(trial), data) for trial, data in sorted(evidence.results.items())]
    return dump_document(TrialResults(run_id=run_id, files=tuple(files)), artifacts / TRIAL_RESULTS)
