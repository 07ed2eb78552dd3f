"""in-toto v1 statements with SLSA provenance v1 predicates.

* ``provenance-images.intoto.json``: subjects are the runner and api images
  (name + sha256 of the manifest); the predicate names the builder, the source
  commit, the workflow and the build parameters.
* ``provenance-summary.intoto.json``: the subject is summary.json; the predicate
  binds it to the image digests the run used (resolvedDependencies).

The files hold the exact bytes that the DSSE bundles sign.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipeline.contracts import DispatchPayload, Grading
from pipeline.digests import parse_ref
from pipeline.fsutil import atomic_write_text, canonical_json, sha256_file

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://benchseal.invalid/build-types/image-release/v1"
RUN_TYPE = "https://benchseal.invalid/build-types/benchmark-run/v1"
LOCAL_BUILDER = "https://benchseal.invalid/builders/local"


def builder_id() -> str:
    """The GitHub workflow that ran the release when in Actions; a local builder id otherwise."""
    server = os.environ.get("GITHUB_SERVER_URL")
    workflow_ref = os.environ.get("GITHUB_WORKFLOW_REF")
    if server and workflow_ref:
        return f"{server}/{workflow_ref}"
    return LOCAL_BUILDER


def _source_uri(payload: DispatchPayload) -> str:
    return f"git+https://github.com/{payload.source.repository}@refs/tags/{payload.source.tag}"


def _image_subject(ref: str, field: str) -> dict[str, Any]:
    image = parse_ref(ref, field)
    return {"name": image.name, "digest": {"sha256": image.digest.removeprefix("sha256:")}}


def images_statement(payload: DispatchPayload, *, workflow: str | None = None) -> dict[str, Any]:
    run_url = _run_url()
    return {
        "_type": STATEMENT_TYPE,
        "subject": [_image_subject(payload.runner, "runner"), _image_subject(payload.api, "api")],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "source": {"repository": payload.source.repository, "ref": f"refs/tags/{payload.source.tag}"},
                    "workflow": workflow or os.environ.get("GITHUB_WORKFLOW_REF", "local"),
                },
                "internalParameters": {"images": ["runner", "api"], "reproducible": True},
                "resolvedDependencies": [
                    {"uri": _source_uri(payload), "digest": {"gitCommit": payload.source.commit}},
                ],
            },
            "runDetails": {
                "builder": {"id": builder_id()},
                "metadata": {"invocationId": run_url or f"benchseal:{payload.correlation_id}"},
            },
        },
    }


def summary_statement(summary_path: Path, grading: Grading, payload: DispatchPayload) -> dict[str, Any]:
    runner = parse_ref(grading.runner_ref, "runner_ref")
    api = parse_ref(grading.api_ref, "api_ref")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": summary_path.name, "digest": {"sha256": sha256_file(summary_path)}}],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": RUN_TYPE,
                "externalParameters": {
                    "suite": grading.suite,
                    "agent": grading.agent,
                    "correlation_id": payload.correlation_id,
                    "source": {"repository": payload.source.repository, "ref": f"refs/tags/{payload.source.tag}"},
                },
                "internalParameters": {"run_id": grading.run_id},
                "resolvedDependencies": [
                    {"uri": f"oci://{runner.name}", "name": "runner", "digest": {"sha256": runner.digest.removeprefix("sha256:")}},
                    {"uri": f"oci://{api.name}", "name": "api", "digest": {"sha256": api.digest.removeprefix("sha256:")}},
                    {"uri": _source_uri(payload), "digest": {"gitCommit": payload.source.commit}},
                ],
            },
            "runDetails": {
                "builder": {"id": builder_id()},
                "metadata": {"invocationId": grading.run_id, "startedOn": grading.started_at, "finishedOn": grading.finished_at},
            },
        },
    }


def write_statement(path: Path, statement: dict[str, Any]) -> Path:
    atomic_write_text(path, canonical_json(statement))
    return path


def _run_url() -> str | None:
    server, repo, run = (os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    if server and repo and run:
        return f"{server}/{repo}/actions/runs/{run}/attempts/{os.environ.get('GITHUB_RUN_ATTEMPT', '1')}"
    return None
