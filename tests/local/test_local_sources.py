"""Issue 25: ``release --local --project examples/X/benchseal.toml`` releases the example as ITS OWN repository,
``benchseal-examples/X``: a git repository under the state dir whose one commit's tree is the directory
HEAD holds (never the work tree), tagged with the release tag and checked out there; made again only
when that tree changed, never touching the user's checkout. The images it builds are then signed as the
local builder's release.yml and the evidence as its benchmark.yml for the local infra repository, pinned
by the shipped infra policy."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipeline.core.errors import UsageError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.policy import load_policy
from pipeline.local import sources
from pipeline.verify.external import image_identity

HELLO = REPO_ROOT / "examples" / "hello-agent" / "benchseal.toml"
QWEN = REPO_ROOT / "examples" / "qwen-code" / "benchseal.toml"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BENCHSEAL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_an_example_is_its_own_repository_at_the_tag(home: Path) -> None:
    before = _git(REPO_ROOT, "status", "--porcelain", "--", "examples")
    source = sources.release_source(HELLO, "v0.1.0")
    assert source.repository == "benchseal-examples/hello-agent" == sources.release_repository(HELLO)
    assert source.checkout == (home / "sources" / "hello-agent").resolve() and source.own_repository
    assert source.project == source.checkout / "benchseal.toml"
    # One commit, whose tree is exactly what benchseal's HEAD holds for the example.
    assert _git(source.checkout, "rev-list", "--all") == source.commit
    assert _git(source.checkout, "rev-parse", f"{source.commit}^{{tree}}") == _git(REPO_ROOT, "rev-parse",
                                                                                 "HEAD:examples/hello-agent")
    assert _git(source.checkout, "rev-parse", "refs/tags/v0.1.0") == source.commit == _git(source.checkout,
                                                                                           "rev-parse", "HEAD")
    assert _git(source.checkout, "describe", "--exact-match", "--tags", "HEAD") == "v0.1.0"
    assert _git(source.checkout, "status", "--porcelain") == ""
    # Its commit time is the example's last change in benchseal's history (the images' SOURCE_DATE_EPOCH).
    assert _git(source.checkout, "log", "-1", "--format=%ct") == _git(REPO_ROOT, "log", "-1", "--format=%ct", "HEAD",
                                                                      "--", "examples/hello-agent")
    # What the build reads: the source checkout's top is the repository made here.
    from pipeline.imaging.images import source_checkout

    assert source_checkout(source.project) == source.checkout
    assert _git(REPO_ROOT, "status", "--porcelain", "--", "examples") == before  # the user's tree untouched


def test_the_same_tree_is_the_same_commit_and_is_not_made_again(home: Path) -> None:
    first = sources.release_source(HELLO, "v0.1.0")
    marker = first.checkout / ".git" / "benchseal-test-marker"
    marker.write_text("still here\n")
    again = sources.release_source(HELLO, "v0.1.0")
    assert again == first and marker.is_file()
    # Another tag of the same tree: the same commit, tagged again.
    other = sources.release_source(HELLO, "v0.1.1")
    assert other.commit == first.commit and _git(first.checkout, "rev-parse", "refs/tags/v0.1.1") == first.commit
    # A work tree someone edited in the state dir is made again from HEAD's tree.
    (first.checkout / "benchseal.toml").write_text("tampered\n")
    remade = sources.release_source(HELLO, "v0.1.0")
    assert remade.commit == first.commit and (remade.checkout / "benchseal.toml").read_bytes() == \
        subprocess.run(["git", "-C", str(REPO_ROOT), "show", "HEAD:examples/hello-agent/benchseal.toml"],
                       capture_output=True, check=True).stdout
    # A fresh state dir makes the same commit: the images built from it are reused.
    assert sources.release_source(HELLO, "v0.1.0").commit == first.commit


def test_each_example_is_a_repository_of_its_own(home: Path) -> None:
    hello, qwen = sources.release_source(HELLO, "v0.1.0"), sources.release_source(QWEN, "v0.24.4")
    assert (hello.repository, qwen.repository) == ("benchseal-examples/hello-agent", "benchseal-examples/qwen-code")
    assert hello.checkout != qwen.checkout and hello.commit != qwen.commit


def test_a_directory_in_no_checkout_is_its_files(home: Path, tmp_path: Path) -> None:
    project = tmp_path / "outside" / "my-agent" / "benchseal.toml"
    project.parent.mkdir(parents=True)
    project.write_text('schema = "benchseal.project/v1"\n')
    first = sources.release_source(project, "v1.0.0")
    assert first.repository == "benchseal-examples/my-agent"
    assert sources.release_source(project, "v1.0.0") == first
    (project.parent / "more.txt").write_text("x\n")
    changed = sources.release_source(project, "v1.0.0")
    assert changed.commit != first.commit and (changed.checkout / "more.txt").is_file()


def test_another_checkout_is_released_from_where_it_is(home: Path, tmp_path: Path) -> None:
    checkout = tmp_path / "widget"
    checkout.mkdir()
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    (checkout / "benchseal.toml").write_text('schema = "benchseal.project/v1"\n')
    subprocess.run(["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t", "add", "."], check=True)
    subprocess.run(["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   check=True)
    source = sources.release_source(checkout / "benchseal.toml", "v1.0.0")
    assert source.checkout == checkout.resolve() and source.commit == _git(checkout, "rev-parse", "HEAD")
    assert not (home / "sources").exists()


def test_an_uncommitted_example_is_refused(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Released from the tree HEAD holds: a directory HEAD does not have cannot be released."""
    example = REPO_ROOT / "examples" / f"uncommitted-{tmp_path.name}"
    monkeypatch.setattr(sources, "_toplevel", lambda directory: REPO_ROOT.resolve())
    with pytest.raises(UsageError, match="is not in benchseal's HEAD commit"):
        sources.example_repository(example / "benchseal.toml", "v1.0.0")
    assert not example.exists()


def test_the_environment_names_the_source_only_while_building(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("GITHUB_REPOSITORY", "someone/else")
    monkeypatch.delenv("GITHUB_REF", raising=False)
    source = sources.release_source(HELLO, "v0.1.0")
    with sources.releasing(source, "v0.1.0"):
        from pipeline.imaging.images import source_info

        info = source_info(source.checkout)
        assert (info.repository, info.ref, info.commit) == (source.repository, "refs/tags/v0.1.0", source.commit)
    assert os.environ["GITHUB_REPOSITORY"] == "someone/else" and "GITHUB_REF" not in os.environ


def test_the_shipped_policy_admits_the_local_sources_by_the_local_builder() -> None:
    policy = load_policy()
    for repository in ("local/benchseal", "benchseal-examples/hello-agent", "benchseal-examples/qwen-code"):
        (source,) = [s for s in policy.sources if s.repository == repository]
        (signer,) = source.signer
        assert signer.builder == sources.BUILDER.workflow("release.yml")
        expected = image_identity(repository, "v0.1.0", "a" * 40, ref=signer.ref, builder=signer.builder)
        assert expected.identity == "https://github.com/local/benchseal/.github/workflows/release.yml@refs/heads/main"
        assert (expected.repository, expected.ref) == (repository, "refs/tags/v0.1.0")
    agents = {a.name: a for a in policy.agents if hasattr(a, "repositories")}
    assert "benchseal-examples/hello-agent" in agents["hello-agent"].repositories
    assert "benchseal-examples/qwen-code" in agents["qwen-code"].repositories
