"""GitHub side of benchseal: tag resolution and fail-closed dispatch.

Public API for other stages:

* ``resolve_tag(gh, repo, tag) -> str`` (40-hex commit)
* ``dispatch_and_wait(gh, repo, payload, *, workflow_file="benchmark.yml", workflow_dispatch=False,
  event_type, timeout_s, poll) -> DispatchResult`` (``workflow=FILE``: older spelling of
  ``workflow_file=FILE, workflow_dispatch=True``)
* ``make_client(...) -> github.Github`` (token from GITHUB_TOKEN / GH_TOKEN, no POST retries)
"""

from __future__ import annotations

from pipeline.dispatch.client import make_client, token_from_env
from pipeline.dispatch.correlate import DEFAULT_WORKFLOW_FILE, PollConfig, title_matches, validate_workflow_file
from pipeline.dispatch.dispatch import (
    DEFAULT_EVENT_TYPE,
    DispatchResult,
    build_payload,
    dispatch_and_wait,
    load_digests,
    new_correlation_id,
)
from pipeline.dispatch.resolve import resolve_tag

__all__ = [
    "DEFAULT_EVENT_TYPE",
    "DEFAULT_WORKFLOW_FILE",
    "DispatchResult",
    "PollConfig",
    "build_payload",
    "dispatch_and_wait",
    "load_digests",
    "make_client",
    "new_correlation_id",
    "resolve_tag",
    "title_matches",
    "token_from_env",
    "validate_workflow_file",
]
