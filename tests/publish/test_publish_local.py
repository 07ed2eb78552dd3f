"""LocalTarget: dist/releases/<tag>/ holds body.md and exactly the vouched-for assets, idempotently."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pipeline.errors import CheckFailed
from pipeline.publish.body import END, START, extract
from pipeline.publish.bundle import load_bundle
from pipeline.publish.targets import LocalTarget

SUMMARY = {
    "schema": "benchseal.summary/v1",
    "status": "SUCCEEDED",
    "suite": "smoke",
    "counts": {"total": 3, "completed": 3, "resolved": 3, "unresolved": 0, "infra_errors": 0},
    "score": 1.0,
    "run_id": "run-local-1",
    "source": {"repository": "acme/widget", "commit": "c" * 40, "tag": "v1.0.0"},
}


def make_artifacts(root: Path, summary: dict[str, object] = SUMMARY) -> Path:
    art = root / "artifacts"
    art.mkdir(parents=True, exist_ok=True)
    (art / "summary.json").write_text(json.dumps(summary))
    (art / "sbom-runner.cdx.json").write_text('{"bomFormat": "CycloneDX"}')
    (art / "logs").mkdir(exist_ok=True)
    (art / "logs" / "worker.log").write_text("nested: not a release asset\n")
    (art / "notes.tmp").write_text("not covered by SHA256SUMS: never published\n")
    lines = []
    for name in ("sbom-runner.cdx.json", "summary.json"):
        lines.append(f"{hashlib.sha256((art / name).read_bytes()).hexdigest()}  {name}\n")
    (art / "SHA256SUMS").write_text("".join(lines))
    (art / "summary.json.sigstore.json").write_text('{"mediaType": "bundle"}')
    return art


def test_publish_creates_release_dir_with_exact_assets(tmp_path: Path) -> None:
    art = make_artifacts(tmp_path)
    target = LocalTarget(tmp_path / "dist")
    result = target.publish(load_bundle(art, "v1.0.0"))
    dest = tmp_path / "dist" / "v1.0.0"
    assert sorted(p.name for p in dest.iterdir()) == [
        "SHA256SUMS", "body.md", "sbom-runner.cdx.json", "summary.json", "summary.json.sigstore.json"]
    for name in ("SHA256SUMS", "summary.json", "summary.json.sigstore.json"):
        assert (dest / name).read_bytes() == (art / name).read_bytes()
    body = (dest / "body.md").read_text()
    assert body.count(START) == 1 and body.count(END) == 1
    assert "| Score | **1.000** (3/3 resolved) |" in (extract(body) or "")
    assert result.assets == dict.fromkeys(
        ["SHA256SUMS", "sbom-runner.cdx.json", "summary.json", "summary.json.sigstore.json"], "uploaded")
    assert not [p for p in (tmp_path / "dist").iterdir() if p.name.startswith(".")]


def test_republish_is_a_no_op_and_keeps_user_text(tmp_path: Path) -> None:
    art = make_artifacts(tmp_path)
    target = LocalTarget(tmp_path / "dist")
    target.publish(load_bundle(art, "v1.0.0"))
    body_path = tmp_path / "dist" / "v1.0.0" / "body.md"
    body_path.write_text("Hand-written notes.\n\n" + body_path.read_text() + "\nFooter.\n")
    before = body_path.read_bytes()
    inode = body_path.stat().st_ino
    again = target.publish(load_bundle(art, "v1.0.0"))
    assert set(again.assets.values()) == {"kept"} and not again.body_changed
    assert body_path.read_bytes() == before and body_path.stat().st_ino == inode

    changed = dict(SUMMARY, score=None, status="FAILED", reason="agent error")
    art = make_artifacts(tmp_path, changed)
    third = target.publish(load_bundle(art, "v1.0.0"))
    text = body_path.read_text()
    assert third.assets["summary.json"] == "replaced" and third.assets["SHA256SUMS"] == "replaced"
    assert text.startswith("Hand-written notes.\n\n" + START) and text.endswith(END + "\n\nFooter.\n")
    assert "not scored (FAILED: agent error)" in text and "1.000" not in text


def test_tampered_artifact_is_not_published(tmp_path: Path) -> None:
    art = make_artifacts(tmp_path)
    (art / "summary.json").write_text(json.dumps(dict(SUMMARY, score=0.5)))
    with pytest.raises(CheckFailed, match="does not match SHA256SUMS"):
        load_bundle(art, "v1.0.0")


def test_tag_cannot_escape_the_root(tmp_path: Path) -> None:
    art = make_artifacts(tmp_path)
    with pytest.raises(CheckFailed):
        LocalTarget(tmp_path / "dist").publish(load_bundle(art, "../x"))
