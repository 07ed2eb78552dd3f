"""GitHubTarget against the OpenAPI-checked emulator, through unmodified PyGithub over HTTP."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import ValidationError
from pipeline.dispatch.client import make_client
from pipeline.publish.body import END, START, asset_record, splice
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


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _left_by_benchseal(release: Any, files: dict[str, Path]) -> None:
    """What an interrupted publication leaves: the files it uploaded, recorded in the body first."""
    release.update_release(name=release.name, message=splice(release.body or "", asset_record(
        (name, _sha(path)) for name, path in files.items())))
    for name, path in files.items():
        release.upload_asset(str(path), label=name, name=name)


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
    stale = tmp_path / "stale"
    stale.write_text("old sbom")
    _left_by_benchseal(release, {"summary.json": art / "summary.json", "sbom-runner.cdx.json": stale})
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
    rc_art = make_artifacts("rc", source={"repository": REPO, "commit": "c" * 40, "tag": "v1.1.0-rc1"})
    rc = GitHubTarget(_repo(emulator)).publish(load_bundle(rc_art, "v1.1.0-rc1"), manual=True)
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
        target.publish(load_bundle(make_artifacts("other", score=round(1 / 3, 6), counts={**json.loads(
            (art / "summary.json").read_text())["counts"], "resolved": 1, "unresolved": 2}), "v1.0.0"))
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
    _left_by_benchseal(release, {"summary.json": stale})  # so a DELETE is needed
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


# --- the repository and the tag come from the policy and the API, never from the payload --------

def _no_writes_since(emu: Any, before: int) -> None:
    assert _writes(emu) == before, [r for r in emu.requests if r.method != "GET"]


def test_unlisted_repository_is_refused_before_any_write(emulator: Any, make_artifacts: Any) -> None:
    # A run whose payload named another project's repository: the token could write there, the policy says no.
    emulator.add_repo("evil/widget")
    tag_release_commit(emulator, "evil/widget", "v1.0.0")
    gh = make_client(base_url=emulator.base_url, token=emulator.token, backoff_factor=0.0)
    gh.get_repo("evil/widget").create_git_release(tag="v1.0.0", name="v1.0.0", message="theirs")
    art = make_artifacts(source={"repository": "evil/widget", "commit": "c" * 40, "tag": "v1.0.0"})
    before = _writes(emulator)
    with pytest.raises(PublishError, match="not allowed by the infra policy") as info:
        GitHubTarget(gh.get_repo("evil/widget")).publish(load_bundle(art, "v1.0.0"))
    assert not info.value.retryable
    _no_writes_since(emulator, before)
    assert emulator.release("evil/widget", "v1.0.0").body == "theirs"


@pytest.mark.parametrize("summary_repository", [
    "local/benchseal",          # listed, but not the repository being written
    "acme/widget/", "acme/..", "acme/widget.git", "\u212acme/widget", "acme/wid\u200bget", "unknown",
])
def test_run_is_published_only_to_its_own_listed_repository(emulator: Any, make_artifacts: Any,
                                                            summary_repository: str) -> None:
    _setup(emulator)
    art = make_artifacts(source={"repository": summary_repository, "commit": "c" * 40, "tag": "v1.0.0"})
    before = _writes(emulator)
    # A name that is no repository name is refused when summary.json is read (its model, naming
    # source.repository); a well-formed one that is not this target's by the target.
    with pytest.raises((PublishError, ValidationError)) as info:
        GitHubTarget(_repo(emulator)).publish(load_bundle(art, "v1.0.0"))
    if isinstance(info.value, PublishError):
        assert not info.value.retryable
    else:
        assert "source.repository" in info.value.diagnostics()
    assert info.value.diagnostics().isprintable()
    _no_writes_since(emulator, before)
    assert _assets(emulator, "v1.0.0") == {}


def test_repository_case_is_canonical(emulator: Any, make_artifacts: Any) -> None:
    _setup(emulator)
    art = make_artifacts(source={"repository": "ACME/Widget", "commit": "c" * 40, "tag": "v1.0.0"})
    gh = make_client(base_url=emulator.base_url, token=emulator.token, backoff_factor=0.0)
    result = GitHubTarget(gh.get_repo("Acme/WIDGET")).publish(load_bundle(art, "v1.0.0"))
    assert result.strategy == "in-place" and _assets(emulator, "v1.0.0") == _expected_assets(art)


def test_repository_the_api_answers_for_is_checked(emulator: Any, make_artifacts: Any) -> None:
    # GitHub redirects a renamed or transferred repository: the requested name proves nothing.
    _setup(emulator)
    original = emulator._repo_json

    def renamed(ctx: Any, repo: Any, full: bool) -> dict[str, Any]:
        data = original(ctx, repo, full)
        data["full_name"] = "evil/widget"
        return data

    emulator._repo_json = renamed
    before = _writes(emulator)
    with pytest.raises(PublishError, match="only to its own source repository") as info:
        GitHubTarget(_repo(emulator)).publish(load_bundle(make_artifacts(), "v1.0.0"))
    assert not info.value.retryable
    _no_writes_since(emulator, before)


def test_missing_tag_is_refused_retryably(emulator: Any, make_artifacts: Any) -> None:
    emulator.add_repo(REPO)  # a draft release has no tag yet
    _repo(emulator).create_git_release(tag="v1.0.0", name="v1.0.0", message="", draft=True)
    before = _writes(emulator)
    with pytest.raises(PublishError, match=r"tag 'v1\.0\.0' does not exist") as info:
        GitHubTarget(_repo(emulator)).publish(load_bundle(make_artifacts(), "v1.0.0"))
    assert info.value.retryable
    _no_writes_since(emulator, before)


def test_tag_of_another_commit_is_refused(emulator: Any, make_artifacts: Any) -> None:
    emulator.add_repo(REPO)
    other = emulator.add_commit(REPO, "not the benchmarked commit")
    emulator.add_tag(REPO, "v1.0.0", other)
    _repo(emulator).create_git_release(tag="v1.0.0", name="v1.0.0", message="notes")
    before = _writes(emulator)
    with pytest.raises(PublishError, match=f"points at commit {other}, the run benchmarked {'c' * 40}") as info:
        GitHubTarget(_repo(emulator)).publish(load_bundle(make_artifacts(), "v1.0.0"))
    assert not info.value.retryable
    _no_writes_since(emulator, before)
    assert emulator.release(REPO, "v1.0.0").body == "notes"


def test_tag_moved_between_accept_and_publish_is_refused(emulator: Any, make_artifacts: Any) -> None:
    _setup(emulator)
    target = GitHubTarget(_repo(emulator))
    first = make_artifacts()
    target.publish(load_bundle(first, "v1.0.0"))
    body = emulator.release(REPO, "v1.0.0").body
    # The tag is force-moved to another commit after the second run was accepted for the old one.
    moved = emulator.add_commit(REPO, "force-pushed")
    emulator.set_ref(REPO, "refs/tags/v1.0.0", moved)
    second = make_artifacts("second", score=None, status="FAILED", reason="agent error")
    before = _writes(emulator)
    with pytest.raises(PublishError, match="refusing to publish to a release of another commit") as info:
        target.publish(load_bundle(second, "v1.0.0"))
    assert not info.value.retryable
    _no_writes_since(emulator, before)
    assert emulator.release(REPO, "v1.0.0").body == body and _assets(emulator, "v1.0.0") == _expected_assets(first)


def test_annotated_tags_are_peeled(emulator: Any, make_artifacts: Any) -> None:
    emulator.add_repo(REPO)
    inner = tag_release_commit(emulator, REPO, "v1.0.0", annotated=True)
    assert inner == "c" * 40
    # A tag of a tag object: peeled twice.
    outer = emulator.add_tag_object(REPO, "v1.0.0", emulator.repo(REPO).refs["refs/tags/v1.0.0"][1], target_type="tag")
    emulator.set_ref(REPO, "refs/tags/v1.0.0", outer, "tag")
    _repo(emulator).create_git_release(tag="v1.0.0", name="v1.0.0", message="")
    art = make_artifacts()
    GitHubTarget(_repo(emulator)).publish(load_bundle(art, "v1.0.0"))
    assert _assets(emulator, "v1.0.0") == _expected_assets(art)


def test_annotated_tag_of_another_commit_is_refused(emulator: Any, make_artifacts: Any) -> None:
    emulator.add_repo(REPO)
    head = emulator.head(REPO)
    emulator.add_tag(REPO, "v1.0.0", head, annotated=True)
    _repo(emulator).create_git_release(tag="v1.0.0", name="v1.0.0", message="")
    with pytest.raises(PublishError, match=f"points at commit {head}"):
        GitHubTarget(_repo(emulator)).publish(load_bundle(make_artifacts(), "v1.0.0"))
    assert _assets(emulator, "v1.0.0") == {}


def test_tag_of_a_tree_is_refused(emulator: Any, make_artifacts: Any) -> None:
    emulator.add_repo(REPO)
    tree = emulator.add_tag_object(REPO, "v1.0.0", "c" * 40, target_type="tree")
    emulator.set_ref(REPO, "refs/tags/v1.0.0", tree, "tag")
    _repo(emulator).create_git_release(tag="v1.0.0", name="v1.0.0", message="")
    with pytest.raises(PublishError, match="points to a tree") as info:
        GitHubTarget(_repo(emulator)).publish(load_bundle(make_artifacts(), "v1.0.0"))
    assert not info.value.retryable and _assets(emulator, "v1.0.0") == {}


def test_release_named_by_id_is_held_to_the_same_rules(emulator: Any, make_artifacts: Any) -> None:
    emulator.add_repo(REPO)
    emulator.add_tag(REPO, "v1.0.0", emulator.head(REPO))
    release = _repo(emulator).create_git_release(tag="v1.0.0", name="v1.0.0", message="")
    with pytest.raises(PublishError, match="another commit"):
        GitHubTarget(_repo(emulator), release_id=release.id).publish(load_bundle(make_artifacts(), "v1.0.0"))
    assert _assets(emulator, "v1.0.0") == {}


def test_companion_tag_of_another_commit_is_refused(emulator: Any, make_artifacts: Any) -> None:
    _setup(emulator, immutable=True)
    # Someone published "<tag>-benchmark" at another commit first.
    emulator.add_tag(REPO, "v1.0.0-benchmark", emulator.head(REPO))
    _repo(emulator).create_git_release(tag="v1.0.0-benchmark", name="squatted", message="")
    with pytest.raises(PublishError, match=r"companion tag 'v1\.0\.0-benchmark' does not point at commit") as info:
        GitHubTarget(_repo(emulator)).publish(load_bundle(make_artifacts(), "v1.0.0"))
    assert not info.value.retryable and _assets(emulator, "v1.0.0-benchmark") == {}


def test_policy_is_read_at_publish_time(emulator: Any, make_artifacts: Any, tmp_path: Path) -> None:
    # A repository removed from the policy after its run was accepted is no longer written to.
    import yaml

    from pipeline.infra.intake.policy import POLICY_PATH, load_policy

    data = yaml.safe_load(POLICY_PATH.read_text())
    data["sources"] = [s for s in data["sources"] if s["repository"] != REPO]
    path = tmp_path / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    _setup(emulator)
    before = _writes(emulator)
    with pytest.raises(PublishError, match="not allowed by the infra policy"):
        GitHubTarget(_repo(emulator), sources=load_policy(path)).publish(load_bundle(make_artifacts(), "v1.0.0"))
    _no_writes_since(emulator, before)


@pytest.mark.parametrize("draft", [False, True])
def test_the_publish_token_needs_only_contents_write_on_the_source_repository(emulator: Any, make_artifacts: Any,
                                                                               draft: bool) -> None:
    """docs/github.md: the publisher's token is fine-grained, Contents: read and write on the source
    repositories (Metadata: read implied), nothing else. The emulator enforces it per operation."""
    _setup(emulator, draft=draft)
    art = make_artifacts()
    writer = emulator.add_token([REPO], {"contents": "write"})
    repo = make_client(base_url=emulator.base_url, token=writer, backoff_factor=0.0).get_repo(REPO)
    result = GitHubTarget(repo).publish(load_bundle(art, "v1.0.0"))
    assert set(result.assets.values()) == {"uploaded"}
    assert _assets(emulator, "v1.0.0") == _expected_assets(art)

    reader = emulator.add_token([REPO], {"contents": "read", "actions": "write"})
    repo = make_client(base_url=emulator.base_url, token=reader, backoff_factor=0.0).get_repo(REPO)
    with pytest.raises(PublishError, match="403"):
        GitHubTarget(repo).publish(load_bundle(make_artifacts("run2", score=None, status="FAILED",
                                                              reason="agent error"), "v1.0.0"))
