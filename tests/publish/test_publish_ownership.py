"""Publishing touches only what benchseal wrote (issue 22, point 3), on both targets.

A release's assets that benchseal did not write (the maintainers' SHA256SUMS, binaries, a file
with the name of one of benchseal's) are never replaced or deleted; one in the way of an upload
is a one-line refusal before any write; evidence of another tag or repository is refused before
anything is written. Every test ends by comparing the maintainers' bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import PublicationRequest
from pipeline.core.errors import ValidationError
from pipeline.core.layout import PUBLISHER_ERROR
from pipeline.dispatch.client import make_client
from pipeline.publish.body import END, START, asset_record, extract, recorded_assets, splice
from pipeline.publish.bundle import load_bundle
from pipeline.publish.outbox import default_target_factory
from pipeline.publish.targets import GitHubTarget, LocalTarget, PublishError
from tests.fixtures.github import tag_release_commit

REPO = "acme/widget"
TAG = "v1.0.0"
# The maintainers' own release files: a SHA256SUMS of their binaries, the binaries, and more.
BINARIES = {"widget-linux-amd64": b"\x7fELF widget binary", "widget-darwin-arm64": b"\xcf\xfa\xed\xfe widget"}
THEIR_SUMS = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(BINARIES.items()))


def _repo(emu: Any) -> Any:
    return make_client(base_url=emu.base_url, token=emu.token, backoff_factor=0.0).get_repo(REPO)


def _release(emu: Any, maintainers: dict[str, bytes], tmp_path: Path, *, body: str = "Release notes.\n",
             immutable: bool = False) -> Any:
    emu.add_repo(REPO, immutable_releases=immutable)
    tag_release_commit(emu, REPO, TAG)
    # An immutable release takes assets only while it is a draft: uploaded, then published.
    release = _repo(emu).create_git_release(tag=TAG, name=TAG, message=body, draft=immutable)
    files = tmp_path / "maintainers"
    files.mkdir(exist_ok=True)
    for name, data in maintainers.items():
        (files / name).write_bytes(data)
        release.upload_asset(str(files / name), label=name, name=name)
    if immutable:
        release = release.update_release(name=TAG, message=body, draft=False)
    return release


def _assets(emu: Any, tag: str = TAG) -> dict[str, bytes]:
    release = emu.release(REPO, tag)
    return {a.name: a.data for a in release.assets}


def _writes(emu: Any) -> int:
    return sum(emu.count(method=m) for m in ("POST", "PATCH", "DELETE"))


def _theirs_intact(emu: Any, maintainers: dict[str, bytes], tag: str = TAG) -> None:
    assets = _assets(emu, tag)
    assert {name: assets.get(name) for name in maintainers} == maintainers


def _benchseal_files(art: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in art.iterdir() if p.is_file()}


def _with_publisher_error(art: Path) -> Path:
    """A run resealed after its publication failed: publisher-error.json, listed and signed."""
    (art / PUBLISHER_ERROR).write_text('{"error": "earlier"}')
    names = sorted(p.name for p in art.iterdir() if p.is_file() and not p.name.startswith("SHA256SUMS"))
    sums = "".join(f"{hashlib.sha256((art / n).read_bytes()).hexdigest()}  {n}\n" for n in names)
    (art / "SHA256SUMS").write_text(sums)
    (art / "SHA256SUMS.sigstore.json").write_text(json.dumps({"for": hashlib.sha256(sums.encode()).hexdigest()}))
    return art


# --- GitHub ------------------------------------------------------------------------------------

def test_maintainers_sha256sums_is_not_taken_for_benchseals(emulator: Any, make_artifacts: Any,
                                                            tmp_path: Path) -> None:
    """The issue's case: their SHA256SUMS (listing their binaries) was read as an earlier benchseal
    listing, and the binaries it names were deleted. Now: a refusal naming the file, nothing written."""
    theirs = {"SHA256SUMS": THEIR_SUMS.encode(), **BINARIES}
    _release(emulator, theirs, tmp_path)
    before = _writes(emulator)
    with pytest.raises(PublishError) as info:
        GitHubTarget(_repo(emulator)).publish(load_bundle(make_artifacts(), TAG))
    message = info.value.diagnostics()
    assert "already holds SHA256SUMS, which benchseal did not write" in message and "\n" not in message
    assert not info.value.retryable
    assert _writes(emulator) == before
    assert _assets(emulator) == theirs and emulator.release(REPO, TAG).body == "Release notes.\n"


@pytest.mark.parametrize("name", ["summary.json", "SHA256SUMS.sigstore.json", "sbom-runner.cdx.json"])
def test_any_maintainer_file_named_like_a_benchseal_asset_is_refused(emulator: Any, make_artifacts: Any,
                                                                     tmp_path: Path, name: str) -> None:
    art = make_artifacts()
    # Even with benchseal's exact bytes: an asset benchseal did not record is not benchseal's.
    theirs = {**BINARIES, name: (art / name).read_bytes() if name == "summary.json" else b"their own file"}
    _release(emulator, theirs, tmp_path)
    before = _writes(emulator)
    with pytest.raises(PublishError, match=re.escape(f"already holds {name}, which benchseal did not write")):
        GitHubTarget(_repo(emulator)).publish(load_bundle(art, TAG))
    assert _writes(emulator) == before and _assets(emulator) == theirs


def test_republishing_twice_keeps_every_maintainer_asset(emulator: Any, make_artifacts: Any, tmp_path: Path) -> None:
    theirs = {**BINARIES, "checksums.txt": THEIR_SUMS.encode(), "notes.pdf": b"%PDF notes"}
    _release(emulator, theirs, tmp_path)
    target = GitHubTarget(_repo(emulator))
    first = _with_publisher_error(make_artifacts("first"))
    result = target.publish(load_bundle(first, TAG))
    assert set(result.assets.values()) == {"uploaded"}
    assert _assets(emulator) == {**theirs, **_benchseal_files(first)}
    # The same run again: nothing written at all.
    writes = _writes(emulator)
    assert set(target.publish(load_bundle(first, TAG)).assets.values()) == {"kept"}
    assert _writes(emulator) == writes
    # Another run: benchseal's changed files replaced, its stale publisher-error.json removed, theirs kept.
    second = make_artifacts("second", score=None, status="FAILED", reason="agent error")
    again = target.publish(load_bundle(second, TAG))
    assert again.assets[PUBLISHER_ERROR] == "removed" and again.assets["summary.json"] == "replaced"
    assert _assets(emulator) == {**theirs, **_benchseal_files(second)}
    third = target.publish(load_bundle(make_artifacts("third"), TAG))
    assert "removed" not in third.assets.values()
    _theirs_intact(emulator, theirs)
    body = emulator.release(REPO, TAG).body
    assert body.startswith("Release notes.\n\n" + START) and body.count(START) == 1 and body.count(END) == 1


def test_a_maintainer_file_named_like_a_stale_benchseal_asset_is_kept(emulator: Any, make_artifacts: Any,
                                                                      tmp_path: Path) -> None:
    release = _release(emulator, BINARIES, tmp_path)
    target = GitHubTarget(_repo(emulator))
    target.publish(load_bundle(_with_publisher_error(make_artifacts("first")), TAG))
    # The maintainers replace benchseal's publisher-error.json with a file of their own.
    [old] = [a for a in release.get_assets() if a.name == PUBLISHER_ERROR]
    old.delete_asset()
    own = tmp_path / PUBLISHER_ERROR
    own.write_bytes(b'{"maintainers": "our own status file"}')
    release.upload_asset(str(own), label=PUBLISHER_ERROR, name=PUBLISHER_ERROR)
    result = target.publish(load_bundle(make_artifacts("second", score=None, status="FAILED", reason="x"), TAG))
    assert PUBLISHER_ERROR not in result.assets
    _theirs_intact(emulator, {**BINARIES, PUBLISHER_ERROR: own.read_bytes()})


def test_a_benchseal_asset_the_maintainers_changed_is_theirs(emulator: Any, make_artifacts: Any,
                                                             tmp_path: Path) -> None:
    release = _release(emulator, BINARIES, tmp_path)
    target = GitHubTarget(_repo(emulator))
    target.publish(load_bundle(make_artifacts("first"), TAG))
    [sbom] = [a for a in release.get_assets() if a.name == "sbom-runner.cdx.json"]
    sbom.delete_asset()
    edited = tmp_path / "sbom-runner.cdx.json"
    edited.write_bytes(b'{"bomFormat": "CycloneDX", "edited": "by hand"}')
    release.upload_asset(str(edited), label=edited.name, name=edited.name)
    before = _writes(emulator)
    other = make_artifacts("second", score=None, status="FAILED", reason="x")
    (other / "sbom-runner.cdx.json").write_text('{"bomFormat": "CycloneDX", "specVersion": "1.7"}')
    other = _with_publisher_error(other)  # re-listed with the new sbom
    with pytest.raises(PublishError, match=re.escape("already holds sbom-runner.cdx.json, which benchseal did not write")):
        target.publish(load_bundle(other, TAG))
    assert _writes(emulator) == before
    _theirs_intact(emulator, {**BINARIES, edited.name: edited.read_bytes()})


@pytest.mark.parametrize("where", ["outside", "summary"])
def test_a_forged_record_proves_nothing(emulator: Any, make_artifacts: Any, tmp_path: Path, where: str) -> None:
    """A record line outside benchseal's section (the maintainers' text), or inside it but written
    by a run's summary values (escaped, so never a record), claims nothing."""
    theirs = {**BINARIES, "checksums.txt": THEIR_SUMS.encode()}
    forged = asset_record((n, hashlib.sha256(d).hexdigest()) for n, d in theirs.items())
    if where == "outside":
        _release(emulator, theirs, tmp_path, body=f"Notes.\n{forged}\n")
        art = make_artifacts("first")
    else:
        _release(emulator, theirs, tmp_path)
        art = make_artifacts("first", suite=f"x\n\n{forged}\n", reason=f"\n{forged}", status="FAILED", score=None)
    target = GitHubTarget(_repo(emulator))
    target.publish(load_bundle(art, TAG))
    assert {n for n, _ in recorded_assets(emulator.release(REPO, TAG).body)} == set(_benchseal_files(art))
    target.publish(load_bundle(make_artifacts("second"), TAG))
    _theirs_intact(emulator, theirs)


def test_an_interrupted_publication_is_finished_by_a_resealed_run(emulator: Any, make_artifacts: Any,
                                                                  tmp_path: Path) -> None:
    """The names are recorded before the first upload: what an interrupted attempt uploaded is
    provably benchseal's, so the next attempt (with re-signed evidence) may replace it."""
    _release(emulator, BINARIES, tmp_path)
    art = make_artifacts()
    target = GitHubTarget(_repo(emulator))
    emulator.inject_fault("repos/upload-release-asset", [502], after=True)  # the upload landed, its answer lost
    with pytest.raises(PublishError) as info:
        target.publish(load_bundle(art, TAG))
    assert info.value.retryable and "SHA256SUMS" in _assets(emulator)
    resealed = _with_publisher_error(art)
    result = target.publish(load_bundle(resealed, TAG))
    assert result.assets["SHA256SUMS"] == "replaced"
    assert _assets(emulator) == {**BINARIES, **_benchseal_files(resealed)}


@pytest.mark.parametrize("source", [
    {"tag": "v2.0.0"}, {"tag": "v1.0.0-benchmark"}, {"tag": "V1.0.0"}, {"tag": "v1.0.0-rc1"},
    {"repository": "local/benchseal"},
])
def test_evidence_of_another_release_is_refused_before_any_write(emulator: Any, make_artifacts: Any,
                                                                 tmp_path: Path, source: dict[str, str]) -> None:
    theirs = dict(BINARIES)
    _release(emulator, theirs, tmp_path)
    for tag in ("v2.0.0", "v1.0.0-benchmark", "V1.0.0", "v1.0.0-rc1"):
        tag_release_commit(emulator, REPO, tag)  # every tag at the run's commit: only the summary differs
    art = make_artifacts(source={"repository": REPO, "commit": "c" * 40, "tag": TAG, **source})
    before = _writes(emulator)
    with pytest.raises(PublishError, match="refusing to publish run") as info:
        GitHubTarget(_repo(emulator)).publish(load_bundle(art, TAG))
    assert not info.value.retryable and info.value.diagnostics().isprintable()
    assert _writes(emulator) == before
    assert _assets(emulator) == theirs and emulator.release(REPO, TAG).body == "Release notes.\n"


def test_immutable_release_with_maintainers_assets_gets_a_companion(emulator: Any, make_artifacts: Any,
                                                                    tmp_path: Path) -> None:
    theirs = {"SHA256SUMS": THEIR_SUMS.encode(), **BINARIES}
    _release(emulator, theirs, tmp_path, immutable=True)
    art = make_artifacts()
    result = GitHubTarget(_repo(emulator)).publish(load_bundle(art, TAG))
    assert result.strategy == "companion"
    assert _assets(emulator) == theirs
    assert _assets(emulator, f"{TAG}-benchmark") == _benchseal_files(art)
    # The release itself records no benchseal asset; the companion records its own.
    assert recorded_assets(emulator.release(REPO, TAG).body) == frozenset()
    assert {n for n, _ in recorded_assets(emulator.release(REPO, f"{TAG}-benchmark").body)} == set(_benchseal_files(art))


# --- local directory -----------------------------------------------------------------------------

def _local_release(root: Path, files: dict[str, bytes]) -> Path:
    dest = root / TAG
    dest.mkdir(parents=True)
    for name, data in files.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)
    return dest


def _local_bytes(dest: Path, names: dict[str, bytes]) -> dict[str, bytes | None]:
    return {name: (dest / name).read_bytes() if (dest / name).is_file() else None for name in names}


def test_local_target_keeps_the_maintainers_files(tmp_path: Path, make_artifacts: Any) -> None:
    theirs = {**BINARIES, "notes/README.txt": b"their directory", "checksums.txt": THEIR_SUMS.encode()}
    dest = _local_release(tmp_path / "dist", theirs)
    target = LocalTarget(tmp_path / "dist")
    first = _with_publisher_error(make_artifacts("first"))
    assert set(target.publish(load_bundle(first, TAG)).assets.values()) == {"uploaded"}
    assert _local_bytes(dest, theirs) == theirs
    mtimes = {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}
    assert set(target.publish(load_bundle(first, TAG)).assets.values()) == {"kept"}
    assert {p.name: p.stat().st_mtime_ns for p in dest.iterdir()} == mtimes
    second = make_artifacts("second", score=None, status="FAILED", reason="agent error")
    result = target.publish(load_bundle(second, TAG))
    assert result.assets[PUBLISHER_ERROR] == "removed" and not (dest / PUBLISHER_ERROR).exists()
    assert _local_bytes(dest, theirs) == theirs
    assert sorted(p.name for p in dest.iterdir()) == sorted({*BINARIES, "notes", "checksums.txt", "body.md",
                                                             *_benchseal_files(second)})
    assert not [p for p in (tmp_path / "dist").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("name", ["SHA256SUMS", "summary.json", "SHA256SUMS.sigstore.json"])
def test_local_target_refuses_a_maintainer_file_with_a_benchseal_name(tmp_path: Path, make_artifacts: Any,
                                                                      name: str) -> None:
    theirs = {**BINARIES, name: THEIR_SUMS.encode(), "body.md": b"Their notes.\n"}
    dest = _local_release(tmp_path / "dist", theirs)
    with pytest.raises(PublishError, match=re.escape(f"already holds {name}, which benchseal did not write")):
        LocalTarget(tmp_path / "dist").publish(load_bundle(make_artifacts(), TAG))
    assert _local_bytes(dest, theirs) == theirs and sorted(p.name for p in dest.iterdir()) == sorted(theirs)


def test_local_target_keeps_a_maintainer_file_named_like_a_stale_benchseal_file(tmp_path: Path,
                                                                                make_artifacts: Any) -> None:
    target = LocalTarget(tmp_path / "dist")
    target.publish(load_bundle(_with_publisher_error(make_artifacts("first")), TAG))
    dest = tmp_path / "dist" / TAG
    (dest / PUBLISHER_ERROR).write_bytes(b"maintainers' own file")
    result = target.publish(load_bundle(make_artifacts("second"), TAG))
    assert PUBLISHER_ERROR not in result.assets
    assert (dest / PUBLISHER_ERROR).read_bytes() == b"maintainers' own file"
    # A body.md section that the maintainers cut out of the file: nothing of benchseal's is provable.
    body = (dest / "body.md").read_text()
    (dest / "body.md").write_text(body.replace(extract(body) or "", "hand-edited"))
    with pytest.raises(PublishError, match="which benchseal did not write"):
        target.publish(load_bundle(make_artifacts("third", score=None, status="FAILED", reason="x"), TAG))


@pytest.mark.parametrize("source", [{"tag": "v2.0.0"}, {"tag": "v1.0.0-benchmark"}])
def test_local_target_refuses_evidence_of_another_tag(tmp_path: Path, make_artifacts: Any,
                                                      source: dict[str, str]) -> None:
    art = make_artifacts(source={"repository": REPO, "commit": "c" * 40, "tag": TAG, **source})
    with pytest.raises(PublishError, match=re.escape("summary.json source.tag")):
        LocalTarget(tmp_path / "dist").publish(load_bundle(art, TAG))
    assert not (tmp_path / "dist").exists()


def test_local_publication_for_another_repository_is_refused(tmp_path: Path, make_artifacts: Any) -> None:
    art = make_artifacts()  # acme/widget
    request = PublicationRequest(run_id="run-gh-1", artifacts_dir=str(art), target="local", tag=TAG,
                                 options={"root": str(tmp_path / "dist"), "repository": "local/benchseal"})
    with pytest.raises(PublishError, match=re.escape("source.repository is 'acme/widget', the release is in 'local/benchseal'")):
        default_target_factory()(request).publish(load_bundle(art, TAG))
    assert not (tmp_path / "dist").exists()


def test_record_round_trip() -> None:
    pairs = {("SHA256SUMS", "a" * 64), ("summary.json", "b" * 64), ("summary.json", "c" * 64)}
    body = splice("notes", f"section\n\n{asset_record(pairs)}")
    assert recorded_assets(body) == pairs
    assert recorded_assets(body.replace(START, "")) == frozenset()
    two = splice("notes", f"{asset_record(pairs)}\n{asset_record(pairs)}")
    assert recorded_assets(two) == frozenset()  # two records: nothing proven


def test_a_section_without_a_record_proves_nothing_and_says_why(tmp_path: Path, make_artifacts: Any) -> None:
    """A release an older benchseal published (section, no record): its files are not provably benchseal's."""
    art = make_artifacts()
    section = "### Benchmark (v1.0.0)\n\nolder section, no asset record"
    dest = _local_release(tmp_path / "dist", {**_benchseal_files(art), "body.md": splice("", section).encode()})
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    with pytest.raises(PublishError, match=re.escape("no asset record (an older benchseal)")):
        LocalTarget(tmp_path / "dist").publish(load_bundle(make_artifacts("second", score=None, status="FAILED",
                                                                          reason="x"), TAG))
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before


@pytest.mark.parametrize("kind", ["dest", "body"])
def test_local_target_writes_through_no_link(tmp_path: Path, make_artifacts: Any, kind: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "body.md").write_text("not a release\n")
    root = tmp_path / "dist"
    root.mkdir()
    if kind == "dest":
        (root / TAG).symlink_to(elsewhere, target_is_directory=True)
    else:
        (root / TAG).mkdir()
        (root / TAG / "body.md").symlink_to(elsewhere / "body.md")
    with pytest.raises(PublishError, match="refusing to publish there"):
        LocalTarget(root).publish(load_bundle(make_artifacts(), TAG))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["body.md"]
    assert (elsewhere / "body.md").read_text() == "not a release\n"


def test_an_asset_name_the_record_cannot_hold_is_refused_before_any_request(make_artifacts: Any) -> None:
    art = make_artifacts()
    (art / "odd name.sigstore.json").write_text("{}")  # a bundle file the glob picks up
    with pytest.raises(ValidationError, match="release asset name"):
        load_bundle(art, TAG)
