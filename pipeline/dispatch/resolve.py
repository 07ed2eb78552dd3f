"""Resolve a tag to the commit it names, peeling annotated tags (and tags of tags)."""

from __future__ import annotations

from typing import Any

import github
import requests
from github import GithubException, UnknownObjectException
from github.Repository import Repository

from pipeline.core.contracts import COMMIT_RE, validate_git_tag, validate_repository
from pipeline.core.errors import CheckFailed, InfrastructureError

MAX_PEEL_DEPTH = 5


# The name dispatch.dispatch and cli.resolve_ref import: contracts' one repository rule (field "repo" by default).


def tag_of_ref(tag: str, field: str = "tag") -> str:
    """A tag name, or a ``refs/tags/`` ref reduced to one, checked by the one git tag rule."""
    return validate_git_tag(tag.removeprefix("refs/tags/"), field)


def _object_of(answer: Any, what: str) -> tuple[str, str]:
    """(type, sha) of the ``object`` GitHub answered for a ref or a tag object.

    Read from the answer itself: PyGithub turns a missing member into None, and a malformed
    answer must fail with its name, not as an AttributeError further on.
    """
    target = answer.get("object") if isinstance(answer, dict) else None
    kind = target.get("type") if isinstance(target, dict) else None
    sha = target.get("sha") if isinstance(target, dict) else None
    if not isinstance(kind, str) or not isinstance(sha, str):
        shape = sorted(answer)[:12] if isinstance(answer, dict) else type(answer).__name__
        raise CheckFailed(f"GitHub answered {what} without an object type and sha (answer: {shape})")
    if not COMMIT_RE.match(sha):
        raise CheckFailed(f"GitHub answered {what} with object {sha!r}, not a 40-character lowercase hex id")
    return kind, sha


def peel_tag(repository: Repository, tag: str, *, max_depth: int = MAX_PEEL_DEPTH) -> str:
    """The commit ``refs/tags/<tag>`` of ``repository`` points at now.

    GitHub's own exceptions propagate (callers decide what is retryable); CheckFailed when the
    answer names no commit: another ref, a tree or blob, tags nested too deep, a malformed answer.
    """
    ref = f"refs/tags/{tag}"
    answer = repository.get_git_ref(f"tags/{tag}").raw_data
    named = answer.get("ref") if isinstance(answer, dict) else None
    if named != ref:
        raise CheckFailed(f"GitHub answered ref {named!r} for tag {tag!r}")
    kind, sha = _object_of(answer, ref)
    for _ in range(max_depth + 1):
        if kind != "tag":
            break
        kind, sha = _object_of(repository.get_git_tag(sha).raw_data, f"tag object {sha}")
    else:
        raise CheckFailed(f"tag {tag!r} in {repository.full_name}: more than {max_depth} nested tag objects; "
                          "refusing to peel further")
    if kind != "commit":
        raise CheckFailed(f"tag {tag!r} in {repository.full_name} points to a {kind}, not a commit")
    return sha


def resolve_tag(gh: github.Github, repo: str, tag: str, *, max_depth: int = MAX_PEEL_DEPTH) -> str:
    """The 40-hex commit ``tag`` points at in ``repo``; CheckFailed when it does not exist."""

    validate_repository(repo)
    tag = tag_of_ref(tag)
    try:
        return peel_tag(gh.get_repo(repo), tag, max_depth=max_depth)
    except UnknownObjectException:
        raise CheckFailed(f"tag {tag!r} not found in {repo}") from None
    except GithubException as exc:
        raise InfrastructureError(f"resolving tag {tag!r} in {repo}: GitHub answered HTTP {exc.status}") from None
    except requests.exceptions.RequestException as exc:
        raise InfrastructureError(f"resolving tag {tag!r} in {repo}: {type(exc).__name__}") from None
