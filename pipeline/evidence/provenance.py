"""in-toto v1 statements with SLSA provenance v1 predicates.

* ``provenance-images.intoto.json``: subjects are the runner and api images
  (name + sha256 of the manifest); the predicate names the builder, the source
  commit, the workflow and the build parameters.
* ``provenance-summary.intoto.json``: the subject is summary.json; the predicate
  binds it to the image digests the run used (resolvedDependencies).

The files hold the exact bytes that the DSSE bundles sign. One build type per kind of build, each
documented in docs/build-types.md: ``BUILD_TYPE`` (the images; their own attached provenance,
pipeline.attest.images, carries it too, with the same parameters) and ``RUN_TYPE`` (a benchmark run).
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.core.contracts import DispatchPayload, Grading
from pipeline.core.digests import parse_ref
from pipeline.core.documents import (
    BuildDefinition,
    Builder,
    DigestSet,
    ExternalParameters,
    InternalParameters,
    ProvenanceStatement,
    ResourceDescriptor,
    RunDetails,
    RunMetadata,
    SlsaProvenance,
    SourceRef,
    Subject,
)
from pipeline.core.fsutil import atomic_write_text, canonical_json, sha256_file

BUILD_TYPE = "https://benchseal.invalid/build-types/image-release/v1"
RUN_TYPE = "https://benchseal.invalid/build-types/benchmark-run/v1"
LOCAL_BUILDER = "https://benchseal.invalid/builders/local"


def builder_id() -> str:
    """The GitHub workflow that ran the release when in Actions (benchseal's reusable workflow when it
    names itself in $BENCHSEAL_BUILDER_REF, else the run's own); a local builder id otherwise."""
    server = os.environ.get("GITHUB_SERVER_URL")
    workflow_ref = os.environ.get("BENCHSEAL_BUILDER_REF") or os.environ.get("GITHUB_WORKFLOW_REF")
    if server and workflow_ref:
        return f"{server}/{workflow_ref}"
    return LOCAL_BUILDER


def _source_uri(payload: DispatchPayload) -> str:
    return f"git+https://github.com/{payload.source.repository}@refs/tags/{payload.source.tag}"


def _source(payload: DispatchPayload) -> SourceRef:
    return SourceRef(repository=payload.source.repository, ref=f"refs/tags/{payload.source.tag}")


def _git(payload: DispatchPayload) -> ResourceDescriptor:
    return ResourceDescriptor(uri=_source_uri(payload), digest=DigestSet(gitCommit=payload.source.commit))


def _image_subject(ref: str, field: str) -> Subject:
    image = parse_ref(ref, field)
    return Subject(name=image.name, digest=DigestSet(sha256=image.digest.removeprefix("sha256:")))


def images_statement(payload: DispatchPayload, *, workflow: str | None = None) -> ProvenanceStatement:
    invocation = run_url()
    return ProvenanceStatement(
        subject=(_image_subject(payload.runner, "runner"), _image_subject(payload.api, "api")),
        predicate=SlsaProvenance(
            buildDefinition=BuildDefinition(
                buildType=BUILD_TYPE,
                externalParameters=ExternalParameters(
                    source=_source(payload), workflow=workflow or os.environ.get("GITHUB_WORKFLOW_REF", "local")),
                internalParameters=InternalParameters(images=("runner", "api"), reproducible=True),
                resolvedDependencies=(_git(payload),),
            ),
            runDetails=RunDetails(builder=Builder(id=builder_id()),
                                  metadata=RunMetadata(invocationId=invocation or f"benchseal:{payload.correlation_id}")),
        ),
    )


def summary_statement(summary_path: Path, grading: Grading, payload: DispatchPayload) -> ProvenanceStatement:
    runner = parse_ref(grading.runner_ref, "runner_ref")
    api = parse_ref(grading.api_ref, "api_ref")
    return ProvenanceStatement(
        subject=(Subject(name=summary_path.name, digest=DigestSet(sha256=sha256_file(summary_path))),),
        predicate=SlsaProvenance(
            buildDefinition=BuildDefinition(
                buildType=RUN_TYPE,
                externalParameters=ExternalParameters(source=_source(payload), suite=grading.suite,
                                                      agent=grading.agent, correlation_id=payload.correlation_id),
                internalParameters=InternalParameters(run_id=grading.run_id),
                resolvedDependencies=(
                    ResourceDescriptor(uri=f"oci://{runner.name}", name="runner",
                                       digest=DigestSet(sha256=runner.digest.removeprefix("sha256:"))),
                    ResourceDescriptor(uri=f"oci://{api.name}", name="api",
                                       digest=DigestSet(sha256=api.digest.removeprefix("sha256:"))),
                    _git(payload),
                ),
            ),
            runDetails=RunDetails(builder=Builder(id=builder_id()), metadata=RunMetadata.model_validate(
                {"invocationId": grading.run_id, "startedOn": grading.started_at, "finishedOn": grading.finished_at})),
        ),
    )


def write_statement(path: Path, statement: ProvenanceStatement) -> Path:
    # exclude_none: the two build types fill different parameters; absent is not null.
    atomic_write_text(path, canonical_json(statement.model_dump(mode="json", by_alias=True, exclude_none=True)))
    return path


def run_url() -> str | None:
    """The Actions run this process is a job of (its attempt's URL), None outside Actions."""
    server, repo, run = (os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    if server and repo and run:
        return f"{server}/{repo}/actions/runs/{run}/attempts/{os.environ.get('GITHUB_RUN_ATTEMPT', '1')}"
    return None
