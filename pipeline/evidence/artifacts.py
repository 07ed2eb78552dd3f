"""summary.json and SHA256SUMS of a run's published artifacts.

``SHA256SUMS`` is exactly what ``sha256sum -c`` reads: ``<64 hex><space><space><name>``
per line, sorted by name, covering every file in the artifacts directory except
SHA256SUMS itself and its own bundle (which signs it). Hashing is streamed.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.contracts import DispatchPayload, Grading
from pipeline.core.digests import ImageRef, parse_ref
from pipeline.core.documents import (
    AgentInfo,
    Comparison,
    Dataset,
    ImageDescriptor,
    ModelUsage,
    ReleaseSummary,
    SummaryImages,
    Timings,
    TrialTiming,
    dump_document,
)
from pipeline.core.errors import CheckFailed
from pipeline.core.evidence_archive import write_archive
from pipeline.core.fsutil import atomic_write_text, sha256_file
from pipeline.core.layout import (
    CHECKSUMS,
    EVIDENCE_ARCHIVE,
    NESTED_SUMS,
    SUMMARY,
    checksummed_files,
    nested_files,
    render_checksums,
)
from pipeline.core.scoring import grading_noise
from pipeline.evidence.signing import Signer

EVALUATION_METHOD = ("harbor-verifier-reward: a trial is resolved when its verifier reward is 1 (a reward that is not "
                     "a number in [0, 1] is an infrastructure error); score = resolved / completed")


def _task_images(grading: Grading) -> dict[str, str] | None:
    """{task: name@sha256} of the trials that ran on a prebuilt image (pipeline.infra.worker.task_images)."""
    found: dict[str, str] = {}
    for trial in grading.trials:
        if trial.task_image is not None and found.setdefault(trial.task, trial.task_image) != trial.task_image:
            raise CheckFailed(f"grading.trials: task {trial.task} ran on {found[trial.task]} and {trial.task_image}")
    return dict(sorted(found.items())) or None


def build_summary(grading: Grading, payload: DispatchPayload, *, harbor_version: str | None = None,
                  comparison: Comparison | None = None) -> ReleaseSummary:
    """The benchseal.summary/v1 document for a graded run (``comparison``: the checked comparison.json)."""
    runner = parse_ref(grading.runner_ref, "grading.runner_ref")
    api = parse_ref(grading.api_ref, "grading.api_ref")
    if runner.ref != payload.runner or api.ref != payload.api:
        raise CheckFailed("grading image refs differ from the dispatch payload's: the run did not use the dispatched images")
    interval, tasks = grading_noise(grading)
    agent_versions = sorted({t.agent_version for t in grading.trials if t.agent_version})
    harbor_versions = sorted({t.harbor_version for t in grading.trials if t.harbor_version})
    return ReleaseSummary(
        suite=grading.suite,
        # The digest the worker staged and verified for every trial (never a hash of whatever directory is here now).
        dataset=Dataset(name=grading.suite, digest=grading.dataset_digest, subset=grading.subset,
                        task_images=_task_images(grading)),
        evaluation_method=EVALUATION_METHOD,
        status=grading.status,
        reason=grading.reason,
        counts=grading.counts,
        score=grading.score,
        source=payload.source,
        images=SummaryImages(runner=_image(runner), api=_image(api)),
        harbor_version=grading.harbor_version or harbor_version or (harbor_versions[0] if harbor_versions else None),
        agent=AgentInfo(name=grading.agent,
                        version=agent_versions[0] if len(agent_versions) == 1 else (tuple(agent_versions) or None),
                        # Model-backed agents: the policy's version pin and the model they called.
                        version_pin=grading.agent_version_pin, model=grading.model,
                        release=payload.agent_artifact),
        run_id=grading.run_id,
        correlation_id=payload.correlation_id,
        timings=Timings.model_validate({
            "started_at": grading.started_at,
            "finished_at": grading.finished_at,
            "trials": [
                TrialTiming(task=t.task, trial=t.trial_name, outcome=t.outcome, reward=t.reward,
                            total_seconds=t.total_seconds, agent_seconds=t.agent_seconds,
                            verifier_seconds=t.verifier_seconds, model_calls=t.model_calls,
                            input_tokens=t.input_tokens, output_tokens=t.output_tokens, reason=t.reason,
                            canary=t.canary, worker=t.worker)
                for t in grading.trials
            ],
        }),
        model_usage=_model_usage(grading),
        graded_by=grading.graded_by,  # each trial's worker is in timings.trials
        # The score's noise, by the grading rule's own functions (``benchseal verify`` recomputes both).
        interval=interval,
        tasks=tasks,
        comparison=comparison,
        policy_digest=grading.policy_digest,  # the policy file the worker ran and graded under
    )


def _image(ref: ImageRef) -> ImageDescriptor:
    return ImageDescriptor(name=ref.name, digest=ref.digest, ref=ref.ref)


def _model_usage(grading: Grading) -> ModelUsage | None:
    """Totals over the trials that reported model usage (None when no trial called a model)."""
    reported = [t for t in grading.trials if t.model_calls is not None]
    if not reported:
        return None
    return ModelUsage(trials=len(reported), model_calls=sum(t.model_calls or 0 for t in reported),
                      input_tokens=sum(t.input_tokens or 0 for t in reported),
                      output_tokens=sum(t.output_tokens or 0 for t in reported))


def write_summary(artifacts: Path, summary: ReleaseSummary) -> Path:
    return dump_document(summary, artifacts / SUMMARY)


def write_checksums(artifacts: Path) -> Path:
    """evidence-SHA256SUMS over the nested evidence and its archive (every file it lists, one asset),
    then SHA256SUMS over every top-level file, the archive included (so SHA256SUMS's bundle signs it)."""
    nested = nested_files(artifacts)
    if nested:
        names = [p.relative_to(artifacts).as_posix() for p in nested]
        text = render_checksums([(sha256_file(p), name) for p, name in zip(nested, names, strict=True)])
        atomic_write_text(artifacts / NESTED_SUMS, text)
        write_archive(artifacts, names, artifacts / EVIDENCE_ARCHIVE)
    else:
        (artifacts / NESTED_SUMS).unlink(missing_ok=True)
        (artifacts / EVIDENCE_ARCHIVE).unlink(missing_ok=True)
    path = artifacts / CHECKSUMS
    atomic_write_text(path, render_checksums([(sha256_file(p), p.name) for p in checksummed_files(artifacts)]))
    return path


def recheck_and_resign(artifacts: Path, signer: Signer) -> Path:
    """After a file was added (e.g. publisher-error.json): rewrite SHA256SUMS and re-sign it."""
    path = write_checksums(artifacts)
    signer.sign_file(path)
    return path
