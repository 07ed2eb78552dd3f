"""``benchseal verify OWNER/REPO@TAG``: fetch a GitHub release's evidence into a private directory.

The release is looked up by tag through the GitHub API (PyGithub, ``GITHUB_API_URL``; a token
from ``--token-file``, ``GITHUB_TOKEN`` or ``GH_TOKEN``, none for a public release). Only the
evidence is downloaded: ``SHA256SUMS``, its bundle, the files it lists and their bundles;
the maintainers' other assets are left alone. Every name must be one plain file name (no
``/``, no ``..``, listed once), every asset at most ``MAX_ASSET_BYTES`` and all of them at most
``MAX_TOTAL_BYTES`` (the API's declared size first, the bytes counted while streaming); each
is streamed to a new file (``O_EXCL``, ``O_NOFOLLOW``) in a fresh 0700 temporary directory,
which ``fetched_release`` removes when the caller is done. Nothing here decides what is
trusted: the caller runs ``verify_release`` on the directory with its own expectation.

Every failure is one line (exit 1), a ``ReleaseRefused`` of its rule (``pipeline.core.errors``):
``ReleaseUnavailable`` for no such repository or release, a release without benchseal evidence, an asset
failing to download, a refused or rate-limited answer (when it resets; no retry beyond the client's own for
5xx); ``AssetRefused`` for an asset name that is not one plain file name, listed twice, or missing;
``AssetTooLarge``; ``ChecksumMismatch`` for a malformed SHA256SUMS.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import github
import requests
from github import GithubException, UnknownObjectException
from github.GitReleaseAsset import GitReleaseAsset

from pipeline.core.contracts import validate_git_tag, validate_repository
from pipeline.core.errors import (
    AssetRefused,
    AssetTooLarge,
    CheckFailed,
    ChecksumMismatch,
    ReleaseUnavailable,
    UsageError,
)
from pipeline.core.fsutil import name_problem
from pipeline.core.layout import CHECKSUMS, CHECKSUMS_BUNDLE, SUMMARY, bundle_name, parse_checksums
from pipeline.dispatch.client import api_url_from_env, classify, make_client, make_retry

__all__ = ["MAX_ASSET_BYTES", "MAX_TOTAL_BYTES", "ReleaseRef", "fetched_release", "parse_reference", "read_token"]

MAX_ASSET_BYTES = 256 * 1024 * 1024
MAX_TOTAL_BYTES = 1024 * 1024 * 1024
_CHUNK = 1024 * 1024
_TOKEN_HINT = "set GITHUB_TOKEN or GH_TOKEN, or give --token-file"  # noqa: S105 -- a hint, not a token


@dataclass(frozen=True)
class ReleaseRef:
    """``OWNER/REPO@TAG``: the release a consumer asks for (also their expected repository and tag)."""

    repository: str
    tag: str

    def __str__(self) -> str:
        return f"{self.repository}@{self.tag}"


def parse_reference(text: str) -> ReleaseRef:
    """``OWNER/REPO@TAG``, each part by the one rule it has (ValidationError: usage, exit 2)."""
    repository, _, tag = text.partition("@")
    return ReleaseRef(validate_repository(repository, "OWNER/REPO@TAG: OWNER/REPO"),
                      validate_git_tag(tag, "OWNER/REPO@TAG: TAG"))


def read_token(token_file: Path | None, env: Mapping[str, str] | None = None) -> str | None:
    """The token: ``token_file``'s content (stripped; unreadable or empty is a usage error), else
    ``GITHUB_TOKEN`` / ``GH_TOKEN``, else None (anonymous: enough for a public release)."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"invalid --token-file: cannot read {token_file}: {exc.__class__.__name__}") from None
        if not token or len(token.split()) != 1:
            raise UsageError(f"invalid --token-file: {token_file} must hold one token")
        return token
    env = os.environ if env is None else env
    return next((env[name].strip() for name in ("GITHUB_TOKEN", "GH_TOKEN") if env.get(name, "").strip()), None)


@contextmanager
def fetched_release(ref: ReleaseRef, *, token: str | None, max_asset: int = MAX_ASSET_BYTES,
                    max_total: int = MAX_TOTAL_BYTES) -> Iterator[Path]:
    """The evidence of ``ref``'s release in a fresh private directory, removed on exit."""
    with tempfile.TemporaryDirectory(prefix="benchseal-verify-") as scratch:  # mkdtemp: mode 0700
        directory = Path(scratch) / "release"
        directory.mkdir(mode=0o700)
        _download(ref, directory, token, max_asset, max_total)
        yield directory


def _client(token: str | None) -> github.Github:
    if token is not None:
        return make_client(token=token)
    # Anonymous (a public release): the same transport policy as make_client, without a token.
    return github.Github(base_url=api_url_from_env(), timeout=30, per_page=100, retry=make_retry())


def _download(ref: ReleaseRef, directory: Path, token: str | None, max_asset: int, max_total: int) -> None:
    where = f"{ref}"
    try:
        repo = _call(lambda: _client(token).get_repo(ref.repository), f"{ref.repository}: no such repository",
                     token, where)
        release = _call(lambda: repo.get_release(ref.tag), f"{ref.repository} has no release for tag {ref.tag}",
                        token, where)
        assets = _call(lambda: list(release.get_assets()), f"{where}: the release's assets are gone", token, where)
    except requests.RequestException as exc:
        raise ReleaseUnavailable(f"{where}: cannot reach GitHub at {api_url_from_env()}: {exc.__class__.__name__}",
                                 subject=where) from None
    by_name: dict[str, GitReleaseAsset] = {}
    for asset in assets:
        _check_name(asset.name, where)
        if asset.name in by_name:
            raise AssetRefused(f"{where}: the release lists the asset {asset.name!r} twice", subject=asset.name)
        by_name[asset.name] = asset
    if CHECKSUMS not in by_name or SUMMARY not in by_name:
        raise ReleaseUnavailable(f"{where}: the release carries no benchseal evidence (no {CHECKSUMS} or {SUMMARY} "
                                 "asset): it was never scored, or its evidence is not published yet", subject=where)
    fetched = _Budget(max_asset, max_total)
    for name in (CHECKSUMS, CHECKSUMS_BUNDLE):
        _fetch(by_name, name, directory, fetched, token, where)
    try:
        listed = parse_checksums((directory / CHECKSUMS).read_bytes())  # flat names: the parser's rule
    except CheckFailed as exc:
        raise ChecksumMismatch(str(exc), subject=CHECKSUMS) from None
    # The files SHA256SUMS lists and the bundles of those; a bundle of anything else is not evidence.
    for name in sorted((set(listed) | {bundle_name(n) for n in listed if bundle_name(n) in by_name})
                       - {CHECKSUMS, CHECKSUMS_BUNDLE}):
        _fetch(by_name, name, directory, fetched, token, where)


def _check_name(name: str, where: str) -> None:
    problem = name_problem(name) or ("has a '/'" if "/" in name else "has '..'" if ".." in name else None)
    if problem:
        raise AssetRefused(f"{where}: refusing the asset name {name!r}: it {problem} (an asset is one plain file "
                           "name)", subject=name)


@dataclass
class _Budget:
    max_asset: int
    max_total: int
    total: int = 0

    def take(self, name: str, size: int, where: str) -> None:
        if size > self.max_asset:
            raise AssetTooLarge(f"{where}: the asset {name} is too large ({size} bytes; at most {self.max_asset})",
                                subject=name)
        if self.total + size > self.max_total:
            raise AssetTooLarge(f"{where}: the release's assets are too large (more than {self.max_total} bytes)",
                                subject=where)
        self.total += size


def _fetch(by_name: Mapping[str, GitReleaseAsset], name: str, directory: Path, budget: _Budget, token: str | None,
           where: str) -> None:
    asset = by_name.get(name)
    if asset is None:
        raise AssetRefused(f"{where}: the asset {name} is missing from the release ({CHECKSUMS} lists it)",
                           subject=name)
    budget.take(name, asset.size, where)  # the declared size, before a byte is read
    declared, written = asset.size, 0
    try:
        download = asset.download_asset(chunk_size=_CHUNK)
        if download is None:  # PyGithub answers None only when given a path to write to
            raise ReleaseUnavailable(f"{where}: downloading the asset {name} failed: no content", subject=where)
        _, _, chunks = download
        fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                written += len(chunk)
                if written > declared:  # more bytes than GitHub declared: counted against the budget
                    budget.take(name, written - declared, where)
                    declared = written
                out.write(chunk)
    except requests.HTTPError as exc:
        response = exc.response
        status = response.status_code if response is not None else 0
        raise _failure(GithubException(status, {"message": _message(response)},
                                       dict(response.headers) if response is not None else {}),
                       f"{where}: downloading the asset {name} failed", token, where) from None
    except requests.RequestException as exc:
        raise ReleaseUnavailable(f"{where}: downloading the asset {name} failed: {exc.__class__.__name__}",
                                 subject=where) from None


def _message(response: requests.Response | None) -> str:
    try:
        data = response.json() if response is not None else {}
    except ValueError:
        return ""
    return str(data.get("message", "")) if isinstance(data, dict) else ""


def _call[T](fetch: Callable[[], T], not_found: str, token: str | None, where: str) -> T:
    try:
        return fetch()
    except UnknownObjectException:
        raise ReleaseUnavailable(not_found + ("" if token is not None else f" (or it is private: {_TOKEN_HINT})"),
                                 subject=where) from None
    except GithubException as exc:
        raise _failure(exc, f"{where}: GitHub refused the request", token, where) from None


def _failure(exc: GithubException, what: str, token: str | None, where: str) -> ReleaseUnavailable:
    """One line for a GitHub error answer: when a rate limit resets, what a 401/403/404 means."""
    headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
    message = str((exc.data or {}).get("message", "")) if isinstance(exc.data, dict) else ""
    transient = classify(exc)
    if transient is not None and transient.rate_limited:
        return ReleaseUnavailable(f"{where}: GitHub rate-limited the request (HTTP {exc.status}{_reset(headers)}); "
                                  + ("retry then" if token is not None else f"retry then, or with a token ({_TOKEN_HINT})"),
                                  subject=where)
    if exc.status == 404:
        return ReleaseUnavailable(f"{what}: HTTP 404 (gone since it was listed, or not visible to this token)",
                                  subject=where)
    if exc.status == 401:
        return ReleaseUnavailable(f"{where}: GitHub refused the token (HTTP 401{': ' + message if message else ''})"
                                  if token is not None else f"{where}: GitHub asks for a token (HTTP 401): {_TOKEN_HINT}",
                                  subject=where)
    hint = f" ({_TOKEN_HINT})" if token is None and exc.status == 403 else ""
    return ReleaseUnavailable(f"{what}: HTTP {exc.status}{': ' + message[:200] if message else ''}{hint}", subject=where)


def _reset(headers: Mapping[str, str]) -> str:
    """', resets at ...' from GitHub's rate-limit headers (retry-after first, else x-ratelimit-reset)."""
    retry_after = headers.get("retry-after", "")
    if retry_after.isdigit():
        return f", retry after {int(retry_after)} s"
    reset = headers.get("x-ratelimit-reset", "")
    if reset.isdigit():
        moment = datetime.fromtimestamp(int(reset), UTC)
        wait = max(0, int(reset) - int(time.time()))
        return f", the limit resets at {moment:%Y-%m-%dT%H:%M:%SZ}, in {wait} s"
    return ", no reset time given"
