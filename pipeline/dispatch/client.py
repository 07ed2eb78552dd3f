"""The PyGithub client factory used by production code and tests.

Token only from the environment (``GITHUB_TOKEN`` or ``GH_TOKEN``), never argv.
API root from ``GITHUB_API_URL`` (set by Actions; ``https://HOST/api/v3`` on
GitHub Enterprise). The urllib3 retry never retries POST: PyGithub's default
does, and a retried dispatch is a duplicate benchmark.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import github
import requests
from github import GithubException, RateLimitExceededException
from urllib3.util.retry import Retry

from pipeline.core.errors import UsageError

DEFAULT_API_URL = "https://api.github.com"
TOKEN_VARIABLES = ("GITHUB_TOKEN", "GH_TOKEN")
# Idempotent methods only. POST (dispatch, create release, upload) is never
# retried by the transport; callers decide what is safe to repeat.
RETRY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
RETRY_STATUSES = (500, 502, 503, 504)


def token_from_env(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    for name in TOKEN_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return value
    raise UsageError("no GitHub token: set GITHUB_TOKEN or GH_TOKEN in the environment (never pass it as an argument)")


def api_url_from_env(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return (env.get("GITHUB_API_URL") or DEFAULT_API_URL).rstrip("/")


def make_retry(total: int = 3, backoff_factor: float = 0.5) -> Retry:

    return Retry(
        total=total,
        connect=total,
        read=total,
        status=total,
        allowed_methods=RETRY_METHODS,
        status_forcelist=RETRY_STATUSES,
        backoff_factor=backoff_factor,
        # Hand the last 5xx to PyGithub (a GithubException with a status)
        # instead of a bare requests RetryError.
        raise_on_status=False,
        # Never sleep an unbounded Retry-After inside the transport; rate
        # limits surface to the caller, which waits within its own bounds.
        respect_retry_after_header=False,
    )


def make_client(
    *,
    base_url: str | None = None,
    token: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: int = 30,
    per_page: int = 100,
    retry_total: int = 3,
    backoff_factor: float = 0.5,
    throttle: bool | None = None,
) -> github.Github:
    """A ``github.Github`` with benchseal's transport policy.

    ``throttle`` keeps PyGithub's pauses between requests (0.25 s) and writes
    (1 s); it defaults to on for github.com and off otherwise (emulator, GHES).
    """

    url = (base_url or api_url_from_env(env)).rstrip("/")
    if throttle is None:
        throttle = url == DEFAULT_API_URL
    return github.Github(
        base_url=url,
        auth=github.Auth.Token(token or token_from_env(env)),
        timeout=timeout,
        per_page=per_page,
        retry=make_retry(retry_total, backoff_factor),
        seconds_between_requests=0.25 if throttle else 0,
        seconds_between_writes=1.0 if throttle else 0,
    )


@dataclass(frozen=True)
class Transient:
    """A failure worth waiting out: rate limit (``retry_after`` seconds) or server/network error."""

    reason: str
    retry_after: float | None = None
    rate_limited: bool = False


def classify(exc: BaseException) -> Transient | None:
    """Transient (rate limit, 5xx, network) or None for a definitive answer."""

    if isinstance(exc, GithubException):
        status = exc.status
        headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
        message = str((exc.data or {}).get("message", "")) if isinstance(exc.data, dict) else ""
        retry_after = _float(headers.get("retry-after"))
        limited = isinstance(exc, RateLimitExceededException) or status == 429 or (
            status == 403 and ("rate limit" in message.lower() or retry_after is not None
                               or headers.get("x-ratelimit-remaining") == "0"))
        if limited:
            return Transient(f"HTTP {status} rate limited", retry_after, rate_limited=True)
        if status >= 500:
            return Transient(f"HTTP {status}")
        return None
    if isinstance(exc, requests.exceptions.RetryError | requests.exceptions.ConnectionError
                  | requests.exceptions.Timeout):
        return Transient(type(exc).__name__)
    return None


def _float(value: object) -> float | None:
    try:
        return float(str(value)) if value is not None else None
    except ValueError:
        return None
