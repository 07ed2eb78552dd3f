"""The worker's finalizer: evidence + signatures, then the outbox rows for the run.

``run_once(config, finalize=evidence_finalizer(...))`` calls it after grading and
BEFORE the terminal transition; the requests it returns are stored in the same
transaction that makes the run terminal, so a worker killed at any point leaves
either a non-terminal run (retried) or a terminal run with its publication queued.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pipeline.core.contracts import Grading, PublicationRequest
from pipeline.core.documents import Comparison, load_document
from pipeline.core.history import check_graded_comparison
from pipeline.evidence.scrub import secret_values
from pipeline.evidence.signing import Signer
from pipeline.evidence.writer import write_evidence
from pipeline.infra.intake.policy import load_policy
from pipeline.infra.queue.sql import RunRecord
from pipeline.infra.worker.export import COMPARISON

Finalize = Callable[["RunRecord", Grading, Path], Sequence[PublicationRequest]]


def evidence_finalizer(
    *,
    target: Literal["github", "local"],
    signer: Signer | Callable[[], Signer],
    options: Mapping[str, str] | None = None,
    timings: dict[str, float] | None = None,
) -> Finalize:
    """Write and sign the run's evidence, then ask for its publication.

    ``target`` "github" publishes to the source repository's release for the payload's
    tag (``options`` may add ``api_url``, ``release_id``); "local" to ``options.root``.
    ``signer`` may be a factory, called once on first use (so an idle worker needs no
    OIDC token). ``timings`` (optional) accumulates ``evidence`` and ``signing`` seconds.
    """
    chosen: list[Signer] = []

    def get_signer() -> Signer:
        if not chosen:
            chosen.append(signer() if callable(signer) else signer)
        return chosen[0]

    def finalize(record: RunRecord, grading: Grading, run_dir: Path) -> Sequence[PublicationRequest]:
        started = time.monotonic()
        # The worker's comparison with the repository's previous release (comparison.json), checked
        # as the seal job checks an export's: the finalizer signs only what the rule gives.
        comparison = _comparison(run_dir, grading)
        # The worker holds the policy's secret_env values: none of them reaches a published byte (evidence.scrub).
        secrets = secret_values(load_policy().secret_env)
        result = write_evidence(run_dir, grading, record.payload, signer=get_signer(), comparison=comparison,
                                secrets=secrets)
        if timings is not None:
            timings["evidence"] = timings.get("evidence", 0.0) + time.monotonic() - started - result.signing_seconds
            timings["signing"] = timings.get("signing", 0.0) + result.signing_seconds
        opts: dict[str, Any] = {"trigger": "tag", **(options or {})}
        if target == "github":
            opts.setdefault("repository", record.payload.source.repository)
        return [PublicationRequest(
            run_id=grading.run_id, target=target, tag=record.payload.source.tag,
            artifacts_dir=str(result.artifacts), options={k: str(v) for k, v in opts.items()},
        )]

    return finalize


def _comparison(run_dir: Path, grading: Grading) -> Comparison | None:
    path = run_dir / COMPARISON
    if not path.is_file():
        return None
    comparison = load_document(Comparison, path)
    check_graded_comparison(comparison, grading, COMPARISON)
    return comparison
