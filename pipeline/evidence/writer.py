"""Evidence of a run: summary, SBOMs, provenance, checksums, Sigstore bundles.

``write_evidence`` writes ``<run_dir>/artifacts/`` completely. Order matters:
the trial evidence is scrubbed first (``evidence.scrub``: host paths made run-relative, secrets
redacted, so every sum below is over what is published), then checked (``evidence.trials``:
grading.json must be what the trials say, or nothing is signed), then content (a private instance's
trust files, ``evidence.trust``; trial-results.json, summary, its exports for the charting tools, SBOMs,
provenance and test-result statements), then its bundles, then evidence-SHA256SUMS and the evidence
archive, then SHA256SUMS over every file so far (bundles and archive included), then SHA256SUMS's own bundle.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.contracts import DispatchPayload, Grading
from pipeline.core.documents import Comparison
from pipeline.core.layout import ARTIFACTS_DIR, MANIFESTS, PROVENANCE_IMAGES, PROVENANCE_SUMMARY, SBOMS
from pipeline.evidence import artifacts, exports, provenance, sbom, testresult
from pipeline.evidence.artifacts import recheck_and_resign
from pipeline.evidence.scrub import scrub_evidence
from pipeline.evidence.signing import Signer
from pipeline.evidence.trials import check_grading, write_trial_results
from pipeline.evidence.trust import write_trust_files

__all__ = ["EvidenceResult", "reseal", "write_evidence"]


@dataclass(frozen=True)
class EvidenceResult:
    artifacts: Path
    summary: Path
    checksums: Path
    sboms: dict[str, Path]
    statements: tuple[Path, ...]
    bundles: tuple[Path, ...]
    identity: str
    issuer: str
    trusted_root: Path | None
    signing_seconds: float = 0.0


def write_evidence(run_dir: Path, grading: Grading, payload: DispatchPayload, *, signer: Signer,
                   comparison: Comparison | None = None, secrets: Sequence[str] = ()) -> EvidenceResult:
    """Write and sign every artifact of a terminal run into ``run_dir/artifacts``.

    Idempotent: a retry rewrites every file atomically with the same content
    (bundles differ: each signature gets a new certificate and log entry). Refused (CheckFailed naming
    the field) before anything is signed when grading.json is not what the trial evidence says.
    ``secrets``: values no published byte may hold (the infra policy's secret_env values), redacted.
    """
    out = run_dir / ARTIFACTS_DIR
    scrub_evidence(out, grading.run_id, secrets)
    evidence, _, _ = check_grading(out, grading)
    out.mkdir(parents=True, exist_ok=True)
    write_trust_files(out, signer)
    write_trial_results(out, grading.run_id, evidence)
    summary_document = artifacts.build_summary(grading, payload, comparison=comparison)
    summary = artifacts.write_summary(out, summary_document)
    exports.write_exports(out, summary_document)  # for the charting tools; SHA256SUMS signs them
    # The two images are read in parallel: most of the time is network and zlib (no GIL).
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {role: pool.submit(sbom.write_sbom, ref, out / SBOMS[role], manifest_out=out / MANIFESTS[role])
                   for role, ref in (("runner", grading.runner_ref), ("api", grading.api_ref))}
        sboms = {role: future.result() for role, future in futures.items()}
    statements = (
        provenance.write_statement(out / PROVENANCE_IMAGES, provenance.images_statement(payload)),
        provenance.write_statement(out / PROVENANCE_SUMMARY, provenance.summary_statement(summary, grading, payload)),
        testresult.write_test_result(out, summary_document, summary),
    )
    signing = time.monotonic()
    bundles = [signer.sign_file(summary), *(signer.sign_file(p) for p in sboms.values())]
    bundles += [signer.sign_statement(p) for p in statements]
    signing = time.monotonic() - signing
    checksums = artifacts.write_checksums(out)
    started = time.monotonic()
    bundles.append(signer.sign_file(checksums))
    signing += time.monotonic() - started
    return EvidenceResult(
        artifacts=out, summary=summary, checksums=checksums, sboms=sboms, statements=statements,
        bundles=tuple(bundles), identity=signer.identity, issuer=signer.issuer, trusted_root=signer.trusted_root,
        signing_seconds=signing,
    )


def reseal(artifacts_dir: Path, *, signer: Signer) -> Path:
    """Re-checksum every file (e.g. after publisher-error.json was added) and re-sign SHA256SUMS."""

    return recheck_and_resign(artifacts_dir, signer)

