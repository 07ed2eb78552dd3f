"""GitHubTarget against the OpenAPI-checked emulator, through unmodified PyGithub over HTTP."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.dispatch.client import make_client
from pipeline.publish.body import END, START, splice
from pipeline.publish.bundle import load_bundle
from pipeline.publish.targets import GitHubTarget, PublishError, PublishPolicy
from tests.fixtures.github import tag_release_commit

REPO = "acme/widget"
ASSETS = ["SHA256SUMS", "SHA256SUMS.sigstore.json", "sbom-runner.cdx.json", "summary.json"]


def _repo(emu: Any, *, timeout: int = 30) -> Any:
    return make_client(base_url=emu.base_url, token=emu.token, backoff_factor=0.0, timeout=timeout).get_repo(REPO)


def _setup(emu: Any, *, immutable: bool = False, prerelease: bool = False, draft: bool = False,
           body: str = "Hand-written notes.\n") -> Any:
    emu.add_repo(REPO, immutable_releases=immutable)
    tag_release_commit(emu, REPO, "v1.0.0")  # the run's commit (summary.json source.commit)
    repo = _repo(emu)
    return repo.create_git_release(tag="v1.0.0", name="v1.0.0", message=body, draft=draft, prerelease=prerelease)


def _assets(emu: Any, tag: str) -> dict[str, bytes]:
    release = emu.release(REPO, tag)
    return {a.name: a.data for a in release.assets}


def _expected_assets(art: Path) -> dict[str, bytes]:
    return {name: (art / name).read_bytes() for name in ASSETS}


def _writes(emu: Any) -> int:
    return sum(emu.count(method=m) for m in ("POST", "PATCH", "DELETE"))


def test_publish_sets_body_section_and_assets_exactly(emulator: Any, make_artifacts: Any) -> None:
    _setup(emulator)
    art = make_artifacts()
    bundle = load_bundle(art, "v1.0.0")
    result = GitHubTarget(_repo(emulator)).publish(bundle)
    release = emulator.release(REPO, "v1.0.0")
    assert release.body == splice("Hand-written notes.\n", bundle.section)
    assert release.body.startswith("Hand-written notes.\n\n" + START) and release.body.endswith(END + "\n")
    assert _assets(emulator, "v1.0.0") == _expected_assets(art)
    assert result.strategy == "in-place" and set(result.assets.values()) == {"uploaded"}
    assert not release.draft and not release.prerelease


def test_rerun_changes_nothing_and_never_422(emulator: Any, make_artifacts: Any) -> None:
    _setup(emulator)
    art = make_artifacts()
    target = GitHubTarget(_repo(emulator))
    target.publish(load_bundle(art, "v1.0.0"))
    writes = _writes(emulator)
    again = target.publish(load_bundle(art, "v1.0.0"))
    assert set(again.assets.values()) == {"kept"} and not again.body_changed
    assert _writes(emulator) == writes
    assert all(r.status < 400 for r in emulator.requests if r.operation.startswith("repos/"))

    # A new run for the same tag: changed files replaced, unchanged kept, body section replaced.
    art2 = make_artifacts("run2", score=None, status="FAILED", reason="agent error")
    third = target.publish(load_bundle(art2, "v1.0.0"))
    assert third.assets == {"SHA256SUMS": "replaced", "SHA256SUMS.sigstore.json": "replaced",
                            "sbom-runner.cdx.json": "kept", "summary.json": "replaced"}
    assert _assets(emulator, "v1.0.0") == _expected_assets(art2)
    body = emulator.release(REPO, "v1.0.0").body
    assert body.count(START) == 1 and "not scored (FAILED: agent error)" in body


def test_hand_edits_around_the_section_survive(emulator: Any, make_artifacts: Any) -> None:
    _setup(emulator, body="Intro\n<!-- benchseal:start -->\nstale, end marker lost\n\nFooter text")
    bundle = load_bundle(make_artifacts(), "v1.0.0")
    GitHubTarget(_repo(emulator)).publish(bundle)
    body = emulator.release(REPO, "v1.0.0").body
    assert body == f"Intro\n{START}\n{bundle.section}\n{END}\nstale, end marker lost\n\nFooter text"


def test_existing_assets_same_digest_kept_different_replaced(emulator: Any, make_artifacts: Any,
                                                             tmp_path: Path) -> None:
    release = _setup(emulator)
    art = make_artifacts()
    # What a previous attempt left: one asset complete (its response lost), one with other bytes.
    release.upload_asset(str(art / "summary.json"), label="summary.json", name="summary.json")
    stale = tmp_path / "stale"
    stale.write_text("old sbom")
    release.upload_asset(str(stale), label="sbom-runner.cdx.json", name="sbom-runner.cdx.json")
    result = GitHubTarget(_repo(emulator)).publish(load_bundle(art, "v1.0.0"))
    assert result.assets["summary.json"] == "kept" and result.assets["sbom-runner.cdx.json"] == "replaced"
    assert _assets(emulator, "v1.0.0") == _expected_assets(art)


def test_release_with_other_tag_is_refused(emulator: Any, make_artifacts: Any) -> None:
    _setup(emulator)
    other = _repo(emulator).create_git_release(tag="v2.0.0", name="v2.0.0", message="")
    target = GitHubTarget(_repo(emulator), release_id=other.id)
    with pytest.raises(PublishError, match=r"has tag 'v2\.0\.0'") as info:
        target.publish(load_bundle(make_artifacts(), "v1.0.0"))
    assert not info.value.retryable
    assert _assets(emulator, "v2.0.0") == {} and _assets(emulator, "v1.0.0") == {}


def test_manual_publication_only_to_prereleases(emulator: Any, make_artifacts: Any) -> None:
    _setup(emulator)
    bundle = load_bundle(make_artifacts(), "v1.0.0")
    with pytest.raises(PublishError, match="not a prerelease") as info:
        GitHubTarget(_repo(emulator)).publish(bundle, manual=True)
    assert not info.value.retryable and _assets(emulator, "v1.0.0") == {}
    allowed = GitHubTarget(_repo(emulator), PublishPolicy(allow_manual_full_release=True)).publish(bundle, manual=True)
    assert allowed.strategy == "in-place"
    tag_release_commit(emulator, REPO, "v1.1.0-rc1")
    _repo(emulator).create_git_release(tag="v1.1.0-rc1", name="rc", message="", prerelease=True)
    rc = GitHubTarget(_repo(emulator)).publish(load_bundle(make_artifacts("rc"), "v1.1.0-rc1"), manual=True)
    assert rc.assets and _assets(emulator, "v1.1.0-rc1")


def test_missing_release_is_a_retryable_error(emulator: Any, make_artifacts: Any) -> None:
    emulator.add_repo(REPO)
    tag_release_commit(emulator, REPO, "v1.0.0")
    with pytest.raises(PublishError, match=r"no release for tag v1\.0\.0") as info:
        GitHubTarget(_repo(emulator)).publish(load_bundle(make_artifacts(), "v1.0.0"))
    assert info.value.retryable


def test_immutable_release_uses_companion(emulator: Any, make_artifacts: Any) -> None:
    _setup(emulator, immutable=True)
    assert emulator.release(REPO, "v1.0.0").immutable
    art = make_artifacts()
    bundle = load_bundle(art, "v1.0.0")
    target = GitHubTarget(_repo(emulator))
    result = target.publish(bundle)
    assert result.strategy == "companion"
    companion = emulator.release(REPO, "v1.0.0-benchmark")
    assert companion is not None and not companion.draft and companion.immutable
    assert _assets(emulator, "v1.0.0-benchmark") == _expected_assets(art)
    assert _assets(emulator, "v1.0.0") == {}
    main_body = emulator.release(REPO, "v1.0.0").body
    assert main_body.startswith("Hand-written notes.\n\n" + START)
    assert "companion release `v1.0.0-benchmark`" in main_body
    writes = _writes(emulator)
    again = target.publish(bundle)
    assert again.strategy == "companion" and set(again.assets.values()) == {"kept"}
    assert _writes(emulator) == writes
    # A different run cannot overwrite locked assets: refused for good, nothing changed.
    with pytest.raises(PublishError, match="immutable") as info:
        target.publish(load_bundle(make_artifacts("other", score=0.5, counts={**json.loads(
            (art / "summary.json").read_text())["counts"], "resolved": 1, "unresolved": 1}), "v1.0.0"))
    assert not info.value.retryable
    assert _assets(emulator, "v1.0.0-benchmark") == _expected_assets(art)


def test_immutable_refusal_detected_from_upload_answer(emulator: Any, make_artifacts: Any) -> None:
    # The release JSON does not say immutable (older server), but the upload is refused like one.
    _setup(emulator)
    emulator.release(REPO, "v1.0.0").immutable = True
    rel = emulator.release(REPO, "v1.0.0")
    original_json = emulator._release_json

    def hide_flag(ctx: Any, repo: Any, release: Any) -> dict[str, Any]:
        data = original_json(ctx, repo, release)
        data["immutable"] = False
        return data

    emulator._release_json = hide_flag
    art = make_artifacts()
    result = GitHubTarget(_repo(emulator)).publish(load_bundle(art, "v1.0.0"))
    assert result.strategy == "companion" and rel.assets == []
    assert _assets(emulator, "v1.0.0-benchmark") == _expected_assets(art)


def test_draft_release_gets_assets_in_place_and_stays_draft(emulator: Any, make_artifacts: Any) -> None:
    _setup(emulator, immutable=True, draft=True)
    art = make_artifacts()
    result = GitHubTarget(_repo(emulator)).publish(load_bundle(art, "v1.0.0"))
    release = emulator.release(REPO, "v1.0.0")
    assert result.strategy == "draft" and release.draft and not release.immutable
    assert _assets(emulator, "v1.0.0") == _expected_assets(art)


@pytest.mark.parametrize(("operation", "statuses"), [
    ("repos/update-release", [500]),
    ("repos/update-release", [502, 503]),
    ("repos/upload-release-asset", [502]),
    ("repos/delete-release-asset", [500]),
    ("repos/list-release-assets", [500, 500, 500, 500]),
])
def test_faults_end_in_one_correct_publication(emulator: Any, make_artifacts: Any, tmp_path: Path,
                                               operation: str, statuses: list[int]) -> None:
    release = _setup(emulator)
    stale = tmp_path / "stale"
    stale.write_text("old")
    release.upload_asset(str(stale), label="summary.json", name="summary.json")  # so a DELETE is needed
    art = make_artifacts()
    bundle = load_bundle(art, "v1.0.0")
    emulator.inject_fault(operation, statuses)
    target = GitHubTarget(_repo(emulator))
    failures = 0
    for _ in range(5):
        try:
            target.publish(bundle)
            break
        except PublishError as exc:
            assert exc.retryable
            failures += 1
    assert failures >= 1
    assert _assets(emulator, "v1.0.0") == _expected_assets(art)
    assert emulator.release(REPO, "v1.0.0").body == splice("Hand-written notes.\n", bundle.section)


def test_timeout_then_success(emulator: Any, make_artifacts: Any) -> None:
    _setup(emulator)
    art = make_artifacts()
    bundle = load_bundle(art, "v1.0.0")
    emulator.inject_fault("repos/upload-release-asset", [500], delay=2.5)
    # Transport retries are GET-only; the timed-out POST surfaces as a retryable error.
    target = GitHubTarget(_repo(emulator, timeout=1))
    with pytest.raises(PublishError) as info:
        target.publish(bundle)
    assert info.value.retryable
    GitHubTarget(_repo(emulator)).publish(bundle)
    assert _assets(emulator, "v1.0.0") == _expected_assets(art)
    digests = {a.name: a.digest for a in emulator.release(REPO, "v1.0.0").assets}
    assert digests["summary.json"] == "sha256:" + hashlib.sha256((art / "summary.json").read_bytes()).hexdigest()


def test_files_of_an_earlier_publication_are_removed_others_kept(emulator: Any, make_artifacts: Any,
                                                                 tmp_path: Path) -> None:
    release = _setup(emulator)
    human = tmp_path / "notes.pdf"
    human.write_bytes(b"%PDF maintainers' file")
    release.upload_asset(str(human), label="notes.pdf", name="notes.pdf")
    # An earlier publication carried publisher-error.json (listed in its SHA256SUMS).
    first = make_artifacts("first")
    (first / "publisher-error.json").write_text('{"error": "earlier"}')
    sums = "".join(f"{hashlib.sha256((first / n).read_bytes()).hexdigest()}  {n}\n"
                   for n in ("publisher-error.json", "sbom-runner.cdx.json", "summary.json"))
    (first / "SHA256SUMS").write_text(sums)
    target = GitHubTarget(_repo(emulator))
    target.publish(load_bundle(first, "v1.0.0"))
    assert "publisher-error.json" in _assets(emulator, "v1.0.0")
    second = make_artifacts("second", score=None, status="FAILED", reason="agent error")
    result = target.publish(load_bundle(second, "v1.0.0"))
    assert result.assets["publisher-error.json"] == "removed"
    assert _assets(emulator, "v1.0.0") == {**_expected_assets(second), "notes.pdf": human.read_bytes()}
