"""The dispatch token needs exactly Actions: read and write on the infra repository.

The emulator enforces fine-grained token permissions per operation (``add_token``), so
these runs prove what docs/github.md states: ``benchseal dispatch --workflow-dispatch``
(workflow_dispatch with return_run_details, what tag.yml and runner-release.yml run)
works with a token that has only ``actions: write`` on the infra repository, while
repository_dispatch would need ``contents: write`` (push rights to the infra code).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dispatch.test_dispatch_cli import cli, github_clock, json_failure  # noqa: F401 -- the real clock
from tests.doubles.github import DispatchEvent, GitHubEmulator, RunHandle
from tests.doubles.github.emulator import OPERATION_PERMISSIONS, ROUTES

pytestmark = pytest.mark.slow  # real processes

CID = "widget-901-1-0123abcd"


def _args(infra_repo: str, digests_file: Path, *extra: str) -> list[str]:
    return ["dispatch", "--repo", infra_repo, "--digests", str(digests_file), "--correlation", CID,
            "--poll-interval", "0.2", "--poll-attempts", "10", "--json", *extra]


def test_every_routed_operation_has_a_permission() -> None:
    assert {route.operation for route in ROUTES} == set(OPERATION_PERMISSIONS)


def test_workflow_dispatch_with_return_run_details_needs_only_actions_write(
        github_emulator: GitHubEmulator, infra_repo: str, digests_file: Path) -> None:
    events: list[DispatchEvent] = []

    def callback(handle: RunHandle, event: DispatchEvent) -> None:
        events.append(event)
        handle.complete("success")

    github_emulator.on_dispatch(callback)
    token = github_emulator.add_token([infra_repo], {"actions": "write"})
    ok = cli(_args(infra_repo, digests_file, "--workflow-file", "benchmark.yml", "--workflow-dispatch"),
             github_emulator, token=token)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    result = json.loads(ok.stdout)
    [run] = github_emulator.runs(infra_repo)
    # mode "workflow_dispatch" (not "+run-name"): GitHub named the run (return_run_details)
    assert (result["mode"], result["run_id"], result["conclusion"]) == ("workflow_dispatch", run.id, "success")
    [event] = events
    assert event.kind == "workflow_dispatch" and event.inputs is not None
    assert event.inputs["correlation_id"] == CID and json.loads(event.inputs["payload"])["correlation_id"] == CID
    assert github_emulator.count("actions/create-workflow-dispatch", "POST") == 1
    assert github_emulator.count("repos/create-dispatch-event") == 0


def test_the_same_token_cannot_send_a_repository_dispatch(github_emulator: GitHubEmulator, infra_repo: str,
                                                          digests_file: Path) -> None:
    github_emulator.on_dispatch(lambda handle, event: handle.complete("success"))
    token = github_emulator.add_token([infra_repo], {"actions": "write"})
    body = json_failure(cli(_args(infra_repo, digests_file), github_emulator, token=token), 1)
    assert "403" in body["error"] and "Resource not accessible by personal access token" in body["error"]
    assert github_emulator.runs(infra_repo) == []
    # contents: write (push rights to the infra code) is what repository_dispatch takes
    writer = github_emulator.add_token([infra_repo], {"actions": "read", "contents": "write"})
    assert cli(_args(infra_repo, digests_file), github_emulator, token=writer).returncode == 0


@pytest.mark.parametrize("repositories, permissions", [
    (None, {"actions": "read"}),  # read only: may list runs, may not dispatch
    (None, {"contents": "write"}),  # may not even read the workflow
    (["acme/other"], {"actions": "write"}),  # another repository: the infra one answers 404
])
def test_less_than_actions_write_on_the_infra_repository_fails_closed(
        github_emulator: GitHubEmulator, infra_repo: str, digests_file: Path,
        repositories: list[str] | None, permissions: dict[str, str]) -> None:
    github_emulator.on_dispatch(lambda handle, event: handle.complete("success"))
    github_emulator.add_repo("acme/other")
    token = github_emulator.add_token(repositories or [infra_repo], permissions)
    json_failure(cli(_args(infra_repo, digests_file, "--workflow-dispatch"), github_emulator, token=token), 1)
    assert github_emulator.runs(infra_repo) == []


def test_limited_tokens_answer_as_github_does(github_emulator: GitHubEmulator, infra_repo: str) -> None:
    import requests

    def get(token: str, path: str) -> requests.Response:
        return requests.get(github_emulator.base_url + path, headers={"Authorization": f"Bearer {token}"},
                            timeout=10)

    reader = github_emulator.add_token([infra_repo], {"actions": "read"})
    assert get(reader, f"/repos/{infra_repo}").status_code == 200  # metadata: read is implied
    assert get(reader, f"/repos/{infra_repo}/actions/workflows/benchmark.yml").status_code == 200
    denied = get(reader, f"/repos/{infra_repo}/git/matching-refs/tags/v")
    assert denied.status_code == 403
    assert denied.json()["message"] == "Resource not accessible by personal access token"
    job_token = github_emulator.add_token([infra_repo], {"checks": "write"}, kind="github-token")
    assert get(job_token, f"/repos/{infra_repo}/actions/runs").json()["message"] == \
        "Resource not accessible by integration"
    assert get(reader, "/repos/acme/elsewhere").status_code == 404
    assert get("github_pat_" + "0" * 40, f"/repos/{infra_repo}").status_code == 401
    with pytest.raises(ValueError):
        github_emulator.add_token([infra_repo], {"actions": "admin"})
    with pytest.raises(ValueError):
        github_emulator.add_token([], {"actions": "write"})
