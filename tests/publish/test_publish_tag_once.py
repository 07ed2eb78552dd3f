"""The local target never replaces a sealed tag's directory with another commit's release (issue 35
point 6): ``dist/releases/<tag>/`` holds the release of one commit; a re-run of that commit may
replace it, another commit, a case variant of the tag or a directory whose summary.json is gone may not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.publish.bundle import load_bundle
from pipeline.publish.targets import LocalTarget, PublishError

A = "c" * 40  # the commit tests/publish/conftest.py's summary names
B = "d" * 40
SOURCE = {"repository": "acme/widget", "commit": A, "tag": "v1.0.0"}


def _tree(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("first", ["scored", "failed"])
def test_another_commit_never_replaces_a_published_tag(tmp_path: Path, make_artifacts: Any, first: str) -> None:
    target = LocalTarget(tmp_path / "dist")
    sealed = make_artifacts("first") if first == "scored" else make_artifacts(
        "first", score=None, status="FAILED", reason="agent error")
    target.publish(load_bundle(sealed, "v1.0.0"))
    dest = tmp_path / "dist" / "v1.0.0"
    before = _tree(dest)
    moved = make_artifacts("moved", source=dict(SOURCE, commit=B), run_id="run-" + "e" * 20)
    with pytest.raises(PublishError) as info:
        target.publish(load_bundle(moved, "v1.0.0"))
    assert not info.value.retryable
    (line,) = str(info.value).splitlines()
    assert f"tag v1.0.0 of acme/widget was released from commit {A}" in line and f"refusing commit {B}" in line
    assert _tree(dest) == before


def test_a_rerun_of_the_same_commit_replaces_its_own_release(tmp_path: Path, make_artifacts: Any) -> None:
    target = LocalTarget(tmp_path / "dist")
    target.publish(load_bundle(make_artifacts("first", score=None, status="FAILED", reason="agent error"), "v1.0.0"))
    rerun = make_artifacts("rerun", run_id="run-" + "f" * 20)
    result = target.publish(load_bundle(rerun, "v1.0.0"))
    assert result.assets["summary.json"] == "replaced"
    assert json.loads((tmp_path / "dist" / "v1.0.0" / "summary.json").read_text())["run_id"] == "run-" + "f" * 20


def test_a_tag_differing_only_in_case_is_the_same_release(tmp_path: Path, make_artifacts: Any) -> None:
    target = LocalTarget(tmp_path / "dist")
    target.publish(load_bundle(make_artifacts("first"), "v1.0.0"))
    upper = make_artifacts("upper", source=dict(SOURCE, commit=B, tag="V1.0.0"))
    with pytest.raises(PublishError, match=r"already holds the release v1\.0\.0 .*differ only in case") as info:
        target.publish(load_bundle(upper, "V1.0.0"))
    assert not info.value.retryable and not (tmp_path / "dist" / "V1.0.0").exists()


def test_a_release_whose_summary_is_gone_is_not_replaced(tmp_path: Path, make_artifacts: Any) -> None:
    target = LocalTarget(tmp_path / "dist")
    target.publish(load_bundle(make_artifacts("first"), "v1.0.0"))
    (tmp_path / "dist" / "v1.0.0" / "summary.json").unlink()
    with pytest.raises(PublishError, match=r"without a readable summary\.json: cannot tell which commit"):
        target.publish(load_bundle(make_artifacts("moved", source=dict(SOURCE, commit=B)), "v1.0.0"))
