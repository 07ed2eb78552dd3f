"""Dispatch never adopts a run that is not the dispatched workflow's own (issue 9.2).

Hostile GitHub states, PyGithub over real HTTP against the emulator, on fake time:
other workflows reacting to the same event, runs already complete when first
seen with a duplicate a moment later, a ``return_run_details`` id that names
someone else's run, and look-alike runs (path, event, branch, head repository,
title variants).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from pipeline.core.contracts import DigestsFile, load_model
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.dispatch.correlate import PollConfig
from pipeline.dispatch.dispatch import DispatchResult, build_payload, dispatch_and_wait
from tests.doubles.github import DispatchEvent, GitHubEmulator, Run, RunHandle
from tests.fixtures.github import SyncedClock, digests_data

CID = "bench-infra-4242-1-0a1b2c3d4e5f"
TITLE = f"Benchmark v1.2.3 {CID}"
BENCHMARK = ".github/workflows/benchmark.yml"
OTHER = ".github/workflows/other.yml"
LIST_OP = "actions/list-workflow-runs"
POLL = PollConfig(attempts=10, interval_s=5.0, skew_s=120.0)
RUN_NAME = "run-name: ${{ format('Benchmark {0} {1}', github.event.client_payload.source.tag || inputs.tag, " \
           "github.event.client_payload.correlation_id || inputs.correlation_id) }}\n"
INPUTS = ("  workflow_dispatch:\n    inputs:\n      payload: {type: string}\n      tag: {type: string}\n"
          "      correlation_id: {type: string}\n")


def payload(correlation: str = CID) -> Any:
    return build_payload(load_model(DigestsFile, digests_data(), "digests"), correlation_id=correlation)


def run(gh: Any, repo: str, clock: SyncedClock, *, workflow_dispatch: bool = False, event_type: str = "benchseal-benchmark",
        correlation: str = CID, poll: PollConfig = POLL) -> DispatchResult:
    return dispatch_and_wait(gh, repo, payload(correlation), workflow_file="benchmark.yml",
                             workflow_dispatch=workflow_dispatch, event_type=event_type, timeout_s=600, poll=poll,
                             clock=clock)


def other_workflow(emulator: GitHubEmulator, repo: str, types: str = "[benchseal-benchmark]") -> None:
    """A second workflow of the infra repository with the same run-name, reacting to the same events."""
    emulator.add_workflow(repo, OTHER, f"name: other\n{RUN_NAME}on:\n  repository_dispatch:\n    types: {types}\n"
                                       f"{INPUTS}jobs: {{}}\n")


def by_workflow(conclusions: dict[str, str]) -> Any:
    """A dispatch callback that ends each workflow's run with its own conclusion."""
    def callback(handle: RunHandle, event: DispatchEvent) -> None:
        handle.start()
        handle.complete(conclusions[event.workflow_path])

    return callback


# --- another workflow reacting to the same event ------------------------------------------------


def test_another_workflows_completed_run_is_not_adopted_while_ours_fails(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock) -> None:
    other_workflow(github_emulator, infra_repo)
    github_emulator.workflow_appearance_delay[BENCHMARK] = timedelta(seconds=12)  # ours is listed late
    github_emulator.on_dispatch(by_workflow({OTHER: "success", BENCHMARK: "failure"}))
    with pytest.raises(CheckFailed, match="concluded 'failure'"):
        run(github_client, infra_repo, synced_clock)
    assert len(github_emulator.runs(infra_repo)) == 2  # both workflows ran, with the same title


def test_another_workflows_run_alone_is_no_match(github_emulator: GitHubEmulator, github_client: Any,
                                                 infra_repo: str, synced_clock: SyncedClock) -> None:
    # Only the other workflow listens to this event type: its run carries our exact title.
    other_workflow(github_emulator, infra_repo, types="[other-type]")
    github_emulator.on_dispatch(by_workflow({OTHER: "success"}))
    with pytest.raises(CheckFailed, match=r"no run of \.github/workflows/benchmark\.yml"):
        run(github_client, infra_repo, synced_clock, event_type="other-type")
    [foreign] = github_emulator.runs(infra_repo)
    assert foreign.display_title == TITLE and foreign.conclusion == "success"


def test_both_workflows_react_and_ours_is_the_one_followed(github_emulator: GitHubEmulator, github_client: Any,
                                                           infra_repo: str, synced_clock: SyncedClock) -> None:
    other_workflow(github_emulator, infra_repo)
    github_emulator.on_dispatch(by_workflow({OTHER: "failure", BENCHMARK: "success"}))
    result = run(github_client, infra_repo, synced_clock)
    [ours] = [r for r in github_emulator.runs(infra_repo) if r.path == BENCHMARK]
    assert (result.run_id, result.conclusion, result.workflow_path) == (ours.id, "success", BENCHMARK)


def test_workflow_dispatch_by_title_ignores_another_workflows_run(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock) -> None:
    other_workflow(github_emulator, infra_repo)
    github_emulator.reject_return_run_details = True  # older GHES: found by title
    github_emulator.create_run(infra_repo, display_title=TITLE, workflow="other.yml", event="workflow_dispatch",
                               status="completed", conclusion="success")
    github_emulator.workflow_appearance_delay[BENCHMARK] = timedelta(seconds=7)
    github_emulator.on_dispatch(by_workflow({BENCHMARK: "failure"}))
    with pytest.raises(CheckFailed, match="concluded 'failure'"):
        run(github_client, infra_repo, synced_clock, workflow_dispatch=True)


# --- complete on first sight: the duplicate check gets its chance -------------------------------


@pytest.mark.parametrize("workflow_dispatch", [False, True])
def test_run_complete_on_first_sight_with_a_duplicate_on_the_next_poll_fails(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock,
        workflow_dispatch: bool) -> None:
    event = "workflow_dispatch" if workflow_dispatch else "repository_dispatch"

    def callback(handle: RunHandle, ev: DispatchEvent) -> None:
        handle.complete("success")
        now = synced_clock.now()
        github_emulator.create_run(infra_repo, display_title=handle.run.display_title, workflow="benchmark.yml",
                                   event=event, status="completed", conclusion="success", created_at=now,
                                   visible_at=now + timedelta(seconds=3))

    github_emulator.on_dispatch(callback)
    with pytest.raises(CheckFailed, match=r"2 workflow runs .* match correlation"):
        run(github_client, infra_repo, synced_clock, workflow_dispatch=workflow_dispatch)
    assert github_emulator.count(LIST_OP) == 2  # seen complete, then the confirming poll saw two


def test_a_complete_match_is_confirmed_by_exactly_one_more_poll(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock) -> None:
    github_emulator.on_dispatch(lambda handle, event: handle.complete("success"))
    result = run(github_client, infra_repo, synced_clock)
    assert result.conclusion == "success"
    assert github_emulator.count(LIST_OP) == 2 and synced_clock.slept == [5.0]


def test_a_match_that_vanishes_before_confirmation_fails(github_emulator: GitHubEmulator, github_client: Any,
                                                         infra_repo: str, synced_clock: SyncedClock) -> None:
    def callback(handle: RunHandle, event: DispatchEvent) -> None:
        handle.complete("success")
        # re-titled a moment later (e.g. an edited run-name on a re-run): no longer ours
        github_emulator.on_dispatch(lambda h, e: None)

    github_emulator.on_dispatch(callback)

    original_sleep = synced_clock.sleep

    def sleep(seconds: float) -> None:
        original_sleep(seconds)
        for r in github_emulator.runs(infra_repo):
            github_emulator.set_run(infra_repo, r.id, display_title=r.display_title + "-retitled")

    synced_clock.sleep = sleep  # type: ignore[method-assign]
    with pytest.raises(CheckFailed, match="disappeared from the listing"):
        run(github_client, infra_repo, synced_clock)


# --- a run id returned by return_run_details -----------------------------------------------------


def test_returned_run_id_of_another_workflow_is_refused(github_emulator: GitHubEmulator, github_client: Any,
                                                        infra_repo: str, synced_clock: SyncedClock) -> None:
    other_workflow(github_emulator, infra_repo)
    foreign = github_emulator.create_run(infra_repo, display_title=TITLE, workflow="other.yml",
                                         event="workflow_dispatch", status="completed", conclusion="success")
    github_emulator.return_run_details_id = lambda started: foreign.id
    github_emulator.on_dispatch(by_workflow({BENCHMARK: "failure"}))
    with pytest.raises(CheckFailed, match=rf"run {foreign.id} returned by the dispatch is not the dispatched run.*"
                                          rf"belongs to workflow"):
        run(github_client, infra_repo, synced_clock, workflow_dispatch=True)


def _shape(emulator: GitHubEmulator, repo: str, clock: SyncedClock, **changes: Any) -> Run:
    """A completed, successful run of benchmark.yml with our title, then altered by ``changes``."""
    created = changes.pop("created_at", clock.now())
    run_ = emulator.create_run(repo, display_title=changes.pop("display_title", TITLE), workflow="benchmark.yml",
                               event=changes.pop("event", "workflow_dispatch"), status="completed",
                               conclusion="success", created_at=created)
    return emulator.set_run(repo, run_.id, **changes) if changes else run_


LOOKALIKES: dict[str, dict[str, Any]] = {
    "id-as-substring": {"display_title": f"Benchmark v1.2.3 {CID}-2"},
    "id-prefix": {"display_title": f"Benchmark v1.2.3 {CID[:-1]}"},
    "different-case": {"display_title": f"Benchmark v1.2.3 {CID.upper()}"},
    "trailing-space": {"display_title": TITLE + " "},
    "trailing-newline": {"display_title": TITLE + "\n"},
    "tab-delimited": {"display_title": f"Benchmark v1.2.3\t{CID}"},
    "nbsp-delimited": {"display_title": f"Benchmark v1.2.3\u00a0{CID}"},
    "zero-width-suffix": {"display_title": TITLE + "\u200b"},
    "same-file-other-directory": {"path": ".github/workflows/sub/benchmark.yml"},
    "same-file-other-repository": {"path": "evil/infra/.github/workflows/benchmark.yml@main"},
    "file-name-suffix": {"path": ".github/workflows/benchmark.yml.bak"},
    "empty-ref": {"path": ".github/workflows/benchmark.yml@"},
    "other-workflow-id": {"workflow_id": "other"},  # the id of other.yml, with benchmark.yml's path
    "other-event": {"event": "push"},
    "other-branch": {"head_branch": "attacker"},
    "fork-head-repository": {"head_repository": "evil/bench-infra"},
    "stale": {"created_at": "stale"},
}


@pytest.mark.parametrize("kind", sorted(LOOKALIKES))
def test_returned_run_id_of_a_lookalike_run_is_refused(github_emulator: GitHubEmulator, github_client: Any,
                                                       infra_repo: str, synced_clock: SyncedClock, kind: str) -> None:
    github_emulator.add_repo("evil/bench-infra")
    changes = dict(LOOKALIKES[kind])
    if changes.get("created_at") == "stale":
        changes["created_at"] = synced_clock.now() - timedelta(hours=1)
    if changes.get("workflow_id") == "other":
        changes["workflow_id"] = github_emulator.add_workflow(infra_repo, OTHER, name="other").id
    lookalike = _shape(github_emulator, infra_repo, synced_clock, **changes)
    github_emulator.return_run_details_id = lambda started: lookalike.id
    github_emulator.on_dispatch(by_workflow({BENCHMARK: "success"}))
    with pytest.raises(CheckFailed, match=rf"run {lookalike.id} returned by the dispatch is not the dispatched run"):
        run(github_client, infra_repo, synced_clock, workflow_dispatch=True)
    assert github_emulator.count(LIST_OP) == 0  # refused before following anything


def test_returned_run_id_that_does_not_exist_fails_bounded(github_emulator: GitHubEmulator, github_client: Any,
                                                           infra_repo: str, synced_clock: SyncedClock) -> None:
    github_emulator.return_run_details_id = lambda started: 999_999
    github_emulator.on_dispatch(by_workflow({BENCHMARK: "success"}))
    with pytest.raises(CheckFailed, match="run 999999 returned by the dispatch was not found"):
        run(github_client, infra_repo, synced_clock, workflow_dispatch=True, poll=PollConfig(attempts=4, interval_s=5))
    assert github_emulator.count("actions/get-workflow-run") == 4


def test_returned_run_id_that_is_not_the_listed_match_is_refused(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock) -> None:
    # GitHub names a run that passes every check when read, but by the first listing it no longer
    # matches, and the one match listed is another run (the one really started).
    github_emulator.on_dispatch(by_workflow({BENCHMARK: "success"}))
    named: list[Run] = []

    def pick(started: Run) -> int:
        named.append(_shape(github_emulator, infra_repo, synced_clock))
        return named[0].id

    github_emulator.return_run_details_id = pick
    answer_run = github_emulator._h_get_run_api

    def racing_get(ctx: Any) -> object:  # a GitHub whose answers race with a re-titling
        body = answer_run(ctx)
        github_emulator.set_run(infra_repo, named[0].id, display_title="Benchmark v1.2.3 somebody-else-0001")
        return body

    github_emulator._h_get_run_api = racing_get  # type: ignore[method-assign]
    with pytest.raises(CheckFailed, match=r"the only run .* is \d+, but the dispatch returned run \d+; refusing"):
        run(github_client, infra_repo, synced_clock, workflow_dispatch=True)


def test_returned_run_id_beside_a_second_match_is_refused(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock) -> None:
    # The named run passes every check, but another run of the workflow carries the same id.
    github_emulator.on_dispatch(by_workflow({BENCHMARK: "success"}))
    github_emulator.return_run_details_id = lambda started: _shape(github_emulator, infra_repo, synced_clock).id
    with pytest.raises(CheckFailed, match="2 workflow runs"):
        run(github_client, infra_repo, synced_clock, workflow_dispatch=True)


# --- look-alike runs in the listing (repository_dispatch) ---------------------------------------


@pytest.mark.parametrize("kind", ["same-file-other-directory", "same-file-other-repository", "file-name-suffix",
                                  "empty-ref", "different-case", "trailing-space", "id-as-substring"])
def test_listed_lookalike_is_never_adopted(github_emulator: GitHubEmulator, github_client: Any, infra_repo: str,
                                           synced_clock: SyncedClock, kind: str) -> None:
    _shape(github_emulator, infra_repo, synced_clock, event="repository_dispatch", **LOOKALIKES[kind])
    with pytest.raises(CheckFailed, match="no run of"):
        run(github_client, infra_repo, synced_clock, event_type="nobody-listens",
            poll=PollConfig(attempts=3, interval_s=5))


@pytest.mark.parametrize("kind", ["other-branch", "fork-head-repository"])
def test_listed_run_of_the_workflow_with_our_id_but_wrong_origin_fails(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock,
        kind: str) -> None:
    github_emulator.add_repo("evil/bench-infra")
    _shape(github_emulator, infra_repo, synced_clock, event="repository_dispatch", **LOOKALIKES[kind])
    github_emulator.on_dispatch(by_workflow({BENCHMARK: "success"}))
    with pytest.raises(CheckFailed, match=r"carries correlation .* but (ran on branch|has head repository)"):
        run(github_client, infra_repo, synced_clock)


@pytest.mark.parametrize("path", [BENCHMARK + "@refs/heads/main", BENCHMARK + "@main",
                                  "acme/bench-infra/" + BENCHMARK + "@refs/heads/main", "ACME/bench-infra/" + BENCHMARK])
def test_run_paths_github_reports_for_the_workflow_are_accepted(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock,
        path: str) -> None:
    def callback(handle: RunHandle, event: DispatchEvent) -> None:
        handle.set(path=path)
        handle.complete("success")

    github_emulator.on_dispatch(callback)
    assert run(github_client, infra_repo, synced_clock).conclusion == "success"


# --- the workflow itself --------------------------------------------------------------------------


def test_workflow_file_is_looked_up_and_must_be_active(github_emulator: GitHubEmulator, github_client: Any,
                                                       infra_repo: str, synced_clock: SyncedClock) -> None:
    github_emulator.add_workflow(infra_repo, ".github/workflows/sub/renamed.yml", name="sub")
    with pytest.raises(CheckFailed, match=r"workflow 'renamed\.yml' in acme/bench-infra not found"):
        dispatch_and_wait(github_client, infra_repo, payload(), workflow_file="renamed.yml", timeout_s=60, poll=POLL,
                          clock=synced_clock)
    assert github_emulator.count("repos/create-dispatch-event") == 0


@pytest.mark.parametrize("name", ["../benchmark.yml", ".github/workflows/benchmark.yml", "benchmark.json",
                                  "benchmark.YML", "benchmark", ".yml", "bench mark.yml", "benchmark.yml\n",
                                  "bench\x1bmark.yml", "", "benchmark.yml/", "..yml", "a/b.yaml"])
def test_workflow_file_must_be_a_plain_file_name(github_client: Any, infra_repo: str, synced_clock: SyncedClock,
                                                 name: str, github_emulator: GitHubEmulator) -> None:
    with pytest.raises(ValidationError, match="plain workflow file name"):
        dispatch_and_wait(github_client, infra_repo, payload(), workflow_file=name, timeout_s=60, poll=POLL,
                          clock=synced_clock)
    assert github_emulator.requests == []  # refused before any request
