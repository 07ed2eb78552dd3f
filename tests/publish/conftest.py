"""Fixtures for the publish tests: a run's artifacts dir (real files, real SHA256SUMS) and the GitHub emulator."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_RUNNER = "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64
_API = "127.0.0.1:5055/benchseal/api@sha256:" + "2" * 64
# A complete benchseal.summary/v1 document (pipeline.core.documents.ReleaseSummary).
SUMMARY: dict[str, Any] = {
    "schema": "benchseal.summary/v1",
    "status": "SUCCEEDED",
    "reason": None,
    "suite": "smoke",
    "dataset": {"name": "smoke", "revision": None},
    "evaluation_method": "harbor-verifier-reward",
    "counts": {"total": 3, "completed": 3, "resolved": 3, "unresolved": 0, "infra_errors": 0},
    "score": 1.0,
    "run_id": "run-gh-1",
    "correlation_id": "corr-publish-0001",
    "source": {"repository": "acme/widget", "commit": "c" * 40, "tag": "v1.0.0"},
    "images": {role: {"name": ref.split("@")[0], "digest": ref.split("@")[1], "ref": ref}
               for role, ref in (("runner", _RUNNER), ("api", _API))},
    "harbor_version": "0.26.0",
    "agent": {"name": "oracle", "version": None},
    "timings": {"started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:01:00Z", "trials": []},
}

MakeArtifacts = Callable[..., Path]


@pytest.fixture
def make_artifacts(tmp_path: Path) -> MakeArtifacts:
    """Write summary.json, an SBOM, a bundle and SHA256SUMS; keyword overrides change summary.json."""

    def make(name: str = "run", **summary: Any) -> Path:
        art = tmp_path / name / "artifacts"
        art.mkdir(parents=True, exist_ok=True)
        (art / "summary.json").write_text(json.dumps({**SUMMARY, **summary}, sort_keys=True))
        (art / "sbom-runner.cdx.json").write_text('{"bomFormat": "CycloneDX", "specVersion": "1.6"}')
        sums = "".join(f"{hashlib.sha256((art / n).read_bytes()).hexdigest()}  {n}\n"
                       for n in ("sbom-runner.cdx.json", "summary.json"))
        (art / "SHA256SUMS").write_text(sums)
        (art / "SHA256SUMS.sigstore.json").write_text(json.dumps({"for": hashlib.sha256(sums.encode()).hexdigest()}))
        return art

    return make


@pytest.fixture
def emulator(github_emulator: Any) -> Iterator[Any]:
    """The github stage's emulator fixture (OpenAPI violations fail the test); callbacks must not fail."""
    yield github_emulator
    assert github_emulator.callback_errors == []
