"""Resolve a tag to the commit it names, peeling annotated tags (and tags of tags)."""

from __future__ import annotations

import github
import requests
from github import GithubException, UnknownObjectException

from pipeline.contracts import COMMIT_RE, REPOSITORY_RE, validate_git_tag
from pipeline.errors import CheckFailed, InfrastructureError, ValidationError

MAX_PEEL_DEPTH = 5


def validate_repo(repo: str, field: str = "repo") -> str:
    if not REPOSITORY_RE.match(repo):
        raise ValidationError(field, "must be 'OWNER/NAME'", repo)
    return repo


def tag_of_ref(tag: str, field: str = "tag") -> str:
    """A tag name, or a ``refs/tags/`` ref reduced to one, checked by the one git tag rule."""
    return validate_git_tag(tag.removeprefix("refs/tags/"), field)


def resolve_tag(gh: github.Github, repo: str, tag: str, *, max_depth: int = MAX_PEEL_DEPTH) -> str:
    """The 40-hex commit ``tag`` points at in ``repo``; CheckFailed when it does not exist."""

    validate_repo(repo)
    tag = tag_of_ref(tag)
    try:
        repository = gh.get_repo(repo)
        ref = repository.get_git_ref(f"tags/{tag}")
        kind, sha = ref.object.type, ref.object.sha
        for _ in range(max_depth + 1):
            if kind != "tag":
                break
            tag_object = repository.get_git_tag(sha)
            kind, sha = tag_object.object.type, tag_object.object.sha
        else:
            raise CheckFailed(f"tag {tag!r} in {repo}: more than {max_depth} nested tag objects; refusing to peel further")
    except UnknownObjectException:
        raise CheckFailed(f"tag {tag!r} not found in {repo}") from None
    except GithubException as exc:
        raise InfrastructureError(f"resolving tag {tag!r} in {repo}: GitHub answered HTTP {exc.status}") from None
    except requests.exceptions.RequestException as exc:
        raise InfrastructureError(f"resolving tag {tag!r} in {repo}: {type(exc).__name__}") from None
    if kind != "commit":
        raise CheckFailed(f"tag {tag!r} in {repo} points to a {kind}, not a commit")
    if not isinstance(sha, str) or not COMMIT_RE.match(sha):
        raise CheckFailed(f"tag {tag!r} in {repo} resolved to {sha!r}, not a 40-character lowercase hex commit")
    return sha
