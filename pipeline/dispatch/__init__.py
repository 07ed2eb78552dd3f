"""GitHub side of benchseal: tag resolution and fail-closed dispatch.

Public API for other stages:

* ``resolve_tag(gh, repo, tag) -> str`` (40-hex commit)
* ``dispatch_and_wait(gh, repo, payload, *, workflow_file="benchmark.yml", workflow_dispatch=False,
  event_type, timeout_s, poll) -> DispatchResult`` (``workflow=FILE``: older spelling of
  ``workflow_file=FILE, workflow_dispatch=True``)
* ``make_client(...) -> github.Github`` (token from GITHUB_TOKEN / GH_TOKEN, no POST retries)
"""
