"""LocalTarget: dist/releases/<tag>/ holds body.md and exactly the vouched-for assets, idempotently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.publish.body import END, START, extract
from pipeline.publish.bundle import load_bundle
from pipeline.publish.targets import LocalTarget

PUBLISHED = ["SHA256SUMS", "SHA256SUMS.sigstore.json", "sbom-runner.cdx.json", "summary.json"]


def _with_strays(art: Path) -> Path:
    """Files the evidence stage did not vouch for: never published."""
    (art / "evidence").mkdir(exist_ok=True)
    (art / "evidence" / "worker.log").write_text("nested trial evidence: not a release asset\n")
    (art / "notes.tmp").write_text("not covered by SHA256SUMS\n")
    return art


def test_publish_creates_release_dir_with_exact_assets(tmp_path: Path, make_artifacts: Any) -> None:
    art = _with_strays(make_artifacts())
    target = LocalTarget(tmp_path / "dist")
    result = target.publish(load_bundle(art, "v1.0.0"))
    dest = tmp_path / "dist" / "v1.0.0"
    assert sorted(p.name for p in dest.iterdir()) == sorted([*PUBLISHED, "body.md"])
    for name in PUBLISHED:
        assert (dest / name).read_bytes() == (art / name).read_bytes()
    body = (dest / "body.md").read_text()
    assert body.count(START) == 1 and body.count(END) == 1
    assert "| Score | **1.000** (3/3 resolved) |" in (extract(body) or "")
    assert result.assets == dict.fromkeys(PUBLISHED, "uploaded")
    assert not [p for p in (tmp_path / "dist").iterdir() if p.name.startswith(".")]


def test_republish_is_a_no_op_and_keeps_user_text(tmp_path: Path, make_artifacts: Any) -> None:
    art = make_artifacts()
    target = LocalTarget(tmp_path / "dist")
    target.publish(load_bundle(art, "v1.0.0"))
    body_path = tmp_path / "dist" / "v1.0.0" / "body.md"
    body_path.write_text("Hand-written notes.\n\n" + body_path.read_text() + "\nFooter.\n")
    before = body_path.read_bytes()
    inode = body_path.stat().st_ino
    again = target.publish(load_bundle(art, "v1.0.0"))
    assert set(again.assets.values()) == {"kept"} and not again.body_changed
    assert body_path.read_bytes() == before and body_path.stat().st_ino == inode

    art = make_artifacts("failed", score=None, status="FAILED", reason="agent error")
    third = target.publish(load_bundle(art, "v1.0.0"))
    text = body_path.read_text()
    assert third.assets["summary.json"] == "replaced" and third.assets["SHA256SUMS"] == "replaced"
    assert third.assets["sbom-runner.cdx.json"] == "kept"
    assert text.startswith("Hand-written notes.\n\n" + START) and text.endswith(END + "\n\nFooter.\n")
    assert "not scored (FAILED: agent error)" in text and "1.000" not in text


def test_tampered_artifact_is_not_published(tmp_path: Path, make_artifacts: Any) -> None:
    art = make_artifacts()
    summary = json.loads((art / "summary.json").read_text())
    (art / "summary.json").write_text(json.dumps({**summary, "score": 0.5}))
    with pytest.raises(CheckFailed, match="does not match SHA256SUMS"):
        load_bundle(art, "v1.0.0")
    assert not (tmp_path / "dist").exists()


def test_tag_cannot_escape_the_root(tmp_path: Path, make_artifacts: Any) -> None:
    with pytest.raises(CheckFailed):
        LocalTarget(tmp_path / "dist").publish(load_bundle(make_artifacts(), "../x"))


@pytest.mark.parametrize("repository", ["evil/widget", "acme/widget/", "acme/..", "../../etc", "\u212acme/widget",
                                        "acme/widget\n", "unknown"])
def test_local_target_applies_the_repository_rule(tmp_path: Path, make_artifacts: Any, repository: str) -> None:
    from pipeline.publish.targets import PublishError

    art = make_artifacts(source={"repository": repository, "commit": "c" * 40, "tag": "v1.0.0"})
    # A malformed name is refused by summary.json's model; a well-formed foreign one by the target.
    with pytest.raises((PublishError, ValidationError)) as info:
        LocalTarget(tmp_path / "dist").publish(load_bundle(art, "v1.0.0"))
    if isinstance(info.value, PublishError):
        assert not info.value.retryable
    else:
        assert "source.repository" in info.value.diagnostics()
    assert info.value.diagnostics().isprintable()
    assert not (tmp_path / "dist").exists()


def test_local_target_compares_repository_case_insensitively(tmp_path: Path, make_artifacts: Any) -> None:
    art = make_artifacts(source={"repository": "Local/BenchSeal", "commit": "c" * 40, "tag": "v1.0.0"})
    result = LocalTarget(tmp_path / "dist").publish(load_bundle(art, "v1.0.0"))
    assert (Path(result.location) / "summary.json").is_file()


def test_publish_cli_escapes_what_it_echoes(tmp_path: Path, make_artifacts: Any) -> None:
    import subprocess
    import sys

    forged = "\x1b[31mred\r\n::error file=x::forged\u202e\u2028"
    art = make_artifacts(run_id="run-" + forged, source={"repository": "evil/widget", "commit": "c" * 40,
                                                         "tag": "v1.0.0"})
    done = subprocess.run([sys.executable, "-m", "pipeline", "publish", str(art), "--tag", "v1.0.0",
                           "--root", str(tmp_path / "rel")], capture_output=True, check=False, timeout=60)
    err = done.stderr.decode("utf-8")
    assert done.returncode == 1 and "not allowed by the infra policy" in err, err
    assert err.count("\n") == 1 and err[:-1].isprintable() and "\\x1b[31mred\\x0d\\x0a::error" in err, repr(err)
    assert not (tmp_path / "rel").exists()
