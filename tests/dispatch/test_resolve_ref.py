"""Tag resolution over HTTP: lightweight, annotated, tags of tags, missing, not-a-commit, bounded depth."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.dispatch.resolve import resolve_tag
from tests.doubles.github import GitHubEmulator

REPO = "acme/widget"


@pytest.fixture
def repo(github_emulator: GitHubEmulator) -> str:
    github_emulator.add_repo(REPO)
    github_emulator.add_commit(REPO, "second")
    return REPO


def test_lightweight_tag(github_emulator: GitHubEmulator, github_client: Any, repo: str) -> None:
    commit = github_emulator.head(repo)
    github_emulator.add_tag(repo, "v1.0.0", commit)
    assert resolve_tag(github_client, repo, "v1.0.0") == commit
    assert github_emulator.count("git/get-tag") == 0


def test_annotated_tag_is_peeled(github_emulator: GitHubEmulator, github_client: Any, repo: str) -> None:
    commit = github_emulator.head(repo)
    tag_sha = github_emulator.add_tag(repo, "v1.1.0", commit, annotated=True)
    assert tag_sha != commit
    assert resolve_tag(github_client, repo, "refs/tags/v1.1.0") == commit
    assert github_emulator.count("git/get-tag") == 1


def test_tag_of_a_tag_is_peeled(github_emulator: GitHubEmulator, github_client: Any, repo: str) -> None:
    commit = github_emulator.head(repo)
    inner = github_emulator.add_tag_object(repo, "v2.0.0-inner", commit)
    middle = github_emulator.add_tag_object(repo, "v2.0.0-middle", inner, target_type="tag")
    github_emulator.add_tag(repo, "v2.0.0", middle, annotated=True, target_type="tag")
    assert resolve_tag(github_client, repo, "v2.0.0") == commit
    assert github_emulator.count("git/get-tag") == 3


def test_nesting_beyond_the_bound_is_refused(github_emulator: GitHubEmulator, github_client: Any, repo: str) -> None:
    sha, kind = github_emulator.head(repo), "commit"
    for i in range(8):
        sha, kind = github_emulator.add_tag_object(repo, f"deep-{i}", sha, target_type=kind), "tag"
    github_emulator.set_ref(repo, "refs/tags/v3.0.0", sha, "tag")
    with pytest.raises(CheckFailed, match="nested tag objects"):
        resolve_tag(github_client, repo, "v3.0.0")


def test_missing_tag(github_client: Any, repo: str) -> None:
    with pytest.raises(CheckFailed, match=r"tag 'v9\.9\.9' not found in acme/widget"):
        resolve_tag(github_client, repo, "v9.9.9")


def test_tag_pointing_at_a_tree_is_refused(github_emulator: GitHubEmulator, github_client: Any, repo: str) -> None:
    github_emulator.set_ref(repo, "refs/tags/v4.0.0", "d" * 40, "tree")
    with pytest.raises(CheckFailed, match="points to a tree, not a commit"):
        resolve_tag(github_client, repo, "v4.0.0")


def test_server_error_is_infrastructure(github_emulator: GitHubEmulator, github_client: Any, repo: str) -> None:
    github_emulator.add_tag(repo, "v5.0.0")
    github_emulator.inject_fault("git/get-ref", [500] * 4)  # outlasts the transport's 3 GET retries
    with pytest.raises(InfrastructureError, match="HTTP 500"):
        resolve_tag(github_client, repo, "v5.0.0")
    assert github_emulator.count("git/get-ref") == 4


@pytest.mark.parametrize("tag", ["", "-v1", "v1 .0", "v1..2", "v1\n", "a" * 129])
def test_bad_tag_names_are_usage_errors(github_client: Any, tag: str) -> None:
    with pytest.raises(ValidationError):
        resolve_tag(github_client, REPO, tag)


@pytest.mark.parametrize("name", ["acme", "acme/widget/x", "ac me/widget", "/widget"])
def test_bad_repository_names_are_usage_errors(github_client: Any, name: str) -> None:
    with pytest.raises(ValidationError, match="OWNER/NAME"):
        resolve_tag(github_client, name, "v1.0.0")


@pytest.mark.parametrize("operation, annotated", [("git/get-ref", False), ("git/get-tag", True)])
def test_an_answer_without_an_object_fails_with_its_name(github_emulator: GitHubEmulator, github_client: Any,
                                                         repo: str, operation: str, annotated: bool) -> None:
    """A 200 that is not a ref (or tag object) fails closed as a check, never as an AttributeError."""
    github_emulator.add_tag(repo, "v6.0.0", github_emulator.head(repo), annotated=annotated)
    github_emulator.inject_fault(operation, [200])  # answers {"message": ...}: off-contract on purpose
    with pytest.raises(CheckFailed, match="GitHub answered"):
        resolve_tag(github_client, repo, "v6.0.0")
    assert [v.operation for v in github_emulator.violations] == [operation]
    github_emulator.violations.clear()  # the emulator flagged the off-contract answer, as it must
