"""summary.json, SHA256SUMS (checked by the real sha256sum -c), and resealing."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError as PydanticValidationError

from pipeline.core import layout
from pipeline.core.documents import Dataset
from pipeline.core.errors import CheckFailed
from pipeline.evidence import artifacts
from pipeline.evidence.writer import reseal
from pipeline.verify.release import verify_release
from tests.fixtures.sigstore import make_inputs

RUNNER = "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64
API = "127.0.0.1:5055/benchseal/api@sha256:" + "2" * 64


def test_summary_fields() -> None:
    grading, payload = make_inputs({"runner": RUNNER, "api": API})
    digest = "sha256:" + "d" * 64
    grading = grading.model_copy(update={"dataset_digest": digest})
    summary = artifacts.build_summary(grading, payload).to_json_dict()
    assert summary["schema"] == "benchseal.summary/v1"
    assert summary["images"]["runner"] == {"name": "127.0.0.1:5055/benchseal/runner", "digest": "sha256:" + "1" * 64,
                                           "ref": RUNNER}
    # The dataset is named by the content digest the worker staged and verified for the run's trials.
    assert summary["dataset"] == {"name": "smoke", "digest": digest, "revision": None}
    assert summary["score"] == 0.5 and summary["status"] == "SUCCEEDED"
    assert summary["counts"]["resolved"] == 1
    assert summary["source"]["commit"] == payload.source.commit and summary["source"]["tag"] == "v9.9.9"
    assert summary["harbor_version"] == "0.26.0" and summary["agent"] == {"name": "oracle", "version": "1.0",
                                                                         "version_pin": None, "model": None,
                                                                         "release": None}
    assert summary["run_id"] == "run-evidence-0001" and "infra_run_id" not in summary and summary["correlation_id"] == "evidence-test-0001"
    assert summary["timings"]["started_at"] == "2026-12-02T10:00:00Z" and len(summary["timings"]["trials"]) == 2


def test_old_summary_dataset_revision_still_reads() -> None:
    """Summaries sealed before datasets were pinned carry only a directory revision: still read, shown as such."""
    old = Dataset.model_validate({"name": "smoke", "revision": "sha256:" + "e" * 64})
    assert old.digest is None and old.pinned == "sha256:" + "e" * 64
    assert Dataset.model_validate({"name": "smoke", "digest": "sha256:" + "f" * 64}).pinned == "sha256:" + "f" * 64
    with pytest.raises(PydanticValidationError):
        Dataset.model_validate({"name": "smoke", "digest": "sha256:abc"})


def test_summary_refuses_images_other_than_dispatched() -> None:
    grading, _ = make_inputs({"runner": RUNNER, "api": API})
    _, other = make_inputs({"runner": RUNNER.replace("1" * 64, "3" * 64), "api": API})
    with pytest.raises(CheckFailed):
        artifacts.build_summary(grading, other)


def test_sha256sums_is_sha256sum_format(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}\n")
    (tmp_path / "b.bin").write_bytes(bytes(range(256)) * 5000)
    (tmp_path / "c.txt.sigstore.json").write_text("{}")
    path = artifacts.write_checksums(tmp_path)
    lines = path.read_text().splitlines()
    assert [line.split("  ")[1] for line in lines] == ["a.json", "b.bin", "c.txt.sigstore.json"]
    done = subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=tmp_path, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert layout.parse_checksums(path.read_text()) == {
        name: h for h, name in (line.split("  ") for line in lines)}
    (tmp_path / "b.bin").write_bytes(b"changed")
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path, capture_output=True, check=False).returncode == 1


@pytest.mark.parametrize("text", [
    "abc  x\n", "A" * 64 + "  x\n", "a" * 64 + " x\n", "a" * 64 + "  x", "a" * 64 + "  ../x\n",
    "a" * 64 + "  x\n" + "b" * 64 + "  x\n",
])
def test_parse_checksums_is_strict(text: str) -> None:
    with pytest.raises(CheckFailed):
        layout.parse_checksums(text)


@pytest.mark.slow
def test_publisher_error_is_checksummed_and_resealed(release_copy: Path, signer_v1: object,
                                                     sigstore_instance: object) -> None:
    root = sigstore_instance.trusted_root  # type: ignore[attr-defined]
    old_bundle = (release_copy / "SHA256SUMS.sigstore.json").read_bytes()
    (release_copy / "publisher-error.json").write_text(json.dumps({"error": "upload failed"}) + "\n")
    with pytest.raises(CheckFailed, match=r"publisher-error\.json: not covered by SHA256SUMS"):
        verify_release(release_copy, repository="acme/widget", tag="v9.9.9", trusted_root=root)
    reseal(release_copy, signer=signer_v1)  # type: ignore[arg-type]
    assert "publisher-error.json" in (release_copy / "SHA256SUMS").read_text()
    assert (release_copy / "SHA256SUMS.sigstore.json").read_bytes() != old_bundle
    verify_release(release_copy, repository="acme/widget", tag="v9.9.9", trusted_root=root)
    shutil.rmtree(release_copy)


@pytest.mark.slow
def test_nested_evidence_is_listed_and_checked(release_copy: Path, signer_v1: object, sigstore_instance: object,
                                               tmp_path: Path) -> None:
    """The worker's trial dirs under artifacts/evidence/ are not release assets but are checksummed."""
    root = sigstore_instance.trusted_root  # type: ignore[attr-defined]
    trial = release_copy / "evidence" / "harbor" / "hello__evidence0001"
    (trial / "trial log.txt").write_text("ok\n")
    reseal(release_copy, signer=signer_v1)  # type: ignore[arg-type]
    sums = (release_copy / "SHA256SUMS").read_text()
    assert "evidence-SHA256SUMS" in sums and "trial-results.json" in sums and "/" not in sums
    nested = (release_copy / "evidence-SHA256SUMS").read_text()
    assert "  evidence/harbor/hello__evidence0001/result.json\n" in nested
    assert "  evidence/harbor/hello__evidence0001/trial log.txt\n" in nested
    for listing in ("SHA256SUMS", "evidence-SHA256SUMS"):
        assert subprocess.run(["sha256sum", "-c", "--strict", listing], cwd=release_copy, capture_output=True,
                              check=False).returncode == 0
    verify_release(release_copy, repository="acme/widget", tag="v9.9.9", trusted_root=root)
    # a release is flat: the nested files are not there, and it still verifies (trial-results.json carries
    # the files the score is graded from)
    flat = tmp_path / "flat"
    flat.mkdir()
    for path in release_copy.iterdir():
        if path.is_file():
            shutil.copy2(path, flat / path.name)
    verify_release(flat, repository="acme/widget", tag="v9.9.9", trusted_root=root)
    # in the run dir, tampered or unlisted nested files are caught
    original = (trial / "result.json").read_bytes()
    (trial / "result.json").write_text('{"reward": 0}\n')
    with pytest.raises(CheckFailed, match=r"result\.json: missing or does not match"):
        verify_release(release_copy, repository="acme/widget", tag="v9.9.9", trusted_root=root)
    (trial / "result.json").write_bytes(original)
    (trial / "extra.txt").write_text("x")
    with pytest.raises(CheckFailed, match=r"extra\.txt: not covered by evidence-SHA256SUMS"):
        verify_release(release_copy, repository="acme/widget", tag="v9.9.9", trusted_root=root)
    # a trial dir planted and resealed (signed by the right identity): its result is not among the
    # trial results the score was graded from, and no trial of that name is planned
    (trial / "extra.txt").unlink()
    planted = release_copy / "evidence" / "harbor" / "task__evidence0001"
    planted.mkdir()
    (planted / "result.json").write_text('{"verifier_result": {"rewards": {"reward": 1}}}\n')
    reseal(release_copy, signer=signer_v1)  # type: ignore[arg-type]
    with pytest.raises(CheckFailed, match=r"^evidence-SHA256SUMS: lists evidence/harbor/task__evidence0001/result\.json, "
                                          r"but trial-results\.json does not carry it$"):
        verify_release(release_copy, repository="acme/widget", tag="v9.9.9", trusted_root=root)
