"""Adversarial correlation scenarios: PyGithub over real HTTP against the emulator, on fake time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from pipeline.core.contracts import load_model
from pipeline.core.errors import CheckFailed, InfrastructureError
from pipeline.dispatch.correlate import PollConfig
from pipeline.dispatch.dispatch import DispatchResult, build_payload, dispatch_and_wait
from tests.doubles.github import DispatchEvent, GitHubEmulator, RunHandle
from tests.fixtures.github import API_REF, RUNNER_REF, SyncedClock, digests_data

CID = "bench-infra-4242-1-0a1b2c3d4e5f"
LIST_OP = "actions/list-workflow-runs"  # the dispatched workflow's own runs, never the repository's
DISPATCH_OP = "repos/create-dispatch-event"
POLL = PollConfig(attempts=30, interval_s=5.0, skew_s=120.0)


def payload(correlation: str = CID) -> Any:
    from pipeline.core.contracts import DigestsFile

    digests = load_model(DigestsFile, digests_data(), "digests")
    return build_payload(digests, correlation_id=correlation)


def run(gh: Any, repo: str, clock: SyncedClock, correlation: str = CID, *, workflow: str | None = None,
        poll: PollConfig = POLL, timeout_s: float = 600.0) -> DispatchResult:
    return dispatch_and_wait(gh, repo, payload(correlation), workflow=workflow, event_type="benchseal-benchmark",
                             timeout_s=timeout_s, poll=poll, clock=clock)


def complete(conclusion: str = "success") -> Any:
    def callback(handle: RunHandle, event: DispatchEvent) -> None:
        handle.start()
        handle.complete(conclusion)

    return callback


def test_happy_path_repository_dispatch(github_emulator: GitHubEmulator, github_client: Any, infra_repo: str,
                                        synced_clock: SyncedClock) -> None:
    seen: list[DispatchEvent] = []

    def callback(handle: RunHandle, event: DispatchEvent) -> None:
        seen.append(event)
        handle.complete("success")

    github_emulator.on_dispatch(callback)
    result = run(github_client, infra_repo, synced_clock)
    [created] = github_emulator.runs(infra_repo)
    assert result == DispatchResult(created.id, result.html_url, "success", CID, "repository_dispatch")
    assert result.html_url.endswith(f"/actions/runs/{created.id}")
    # the title comes from benchmark.yml's run-name
    assert created.display_title == f"Benchmark v1.2.3 {CID}"
    [event] = seen
    assert event.event_type == "benchseal-benchmark"
    assert event.client_payload is not None and len(event.client_payload) <= 10
    assert event.client_payload["runner"] == RUNNER_REF and event.client_payload["api"] == API_REF
    assert event.client_payload["source"] == {"repository": "acme/widget", "commit": "c" * 40, "tag": "v1.2.3"}
    assert event.benchseal_payload() == payload().to_json_dict()
    assert github_emulator.count(DISPATCH_OP) == 1


def test_run_appears_late_is_found_within_one_poll(github_emulator: GitHubEmulator, github_client: Any,
                                                   infra_repo: str, synced_clock: SyncedClock) -> None:
    github_emulator.run_appearance_delay = timedelta(seconds=17)  # visible from the 5th poll (t=20 s)
    github_emulator.on_dispatch(complete("success"))
    result = run(github_client, infra_repo, synced_clock)
    [created] = github_emulator.runs(infra_repo)
    assert result.run_id == created.id
    # polls at t=0,5,10,15 saw nothing; t=20 found it already complete; t=25 confirmed it was still the only one
    assert github_emulator.count(LIST_OP) == 6
    assert github_emulator.count("actions/list-workflow-runs-for-repo") == 0
    assert synced_clock.slept == [5.0] * 5


def test_newer_unrelated_run_with_similar_title_is_never_adopted(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock) -> None:
    def callback(handle: RunHandle, event: DispatchEvent) -> None:
        handle.complete("failure")
        # A newer, successful run of another release with a near-identical title.
        github_emulator.create_run(infra_repo, display_title=f"Benchmark v1.2.3 {CID}x", status="completed",
                                   conclusion="success", created_at=synced_clock.now() + timedelta(seconds=2))
        github_emulator.create_run(infra_repo, display_title=f"Benchmark v1.2.4 other-{CID}", status="completed",
                                   conclusion="success", created_at=synced_clock.now() + timedelta(seconds=3))

    github_emulator.on_dispatch(callback)
    with pytest.raises(CheckFailed, match="concluded 'failure'"):
        run(github_client, infra_repo, synced_clock)


def test_id_that_is_a_substring_of_another_runs_id_does_not_match(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock) -> None:
    # Our dispatch never produces a run (no workflow listens to the event type we send).
    for title in (f"Benchmark v1.2.3 {CID}-2", f"Benchmark v1.2.3 x{CID}", f"Benchmark v1.2.3 {CID}.retry",
                  f"{CID}", f"Benchmark v1.2.3 {CID} later", f"Benchmark v1.2.3 {CID.upper()}",
                  f"Benchmark v1.2.3 {CID} ", f"Benchmark v1.2.3 {CID}\n", f"Benchmark v1.2.3\t{CID}",
                  f"Benchmark v1.2.3\u00a0{CID}", f"Benchmark v1.2.3 {CID[:-1]}", f"Benchmark v1.2.3 {CID}\u200b"):
        github_emulator.create_run(infra_repo, display_title=title, status="completed", conclusion="success")
    with pytest.raises(CheckFailed, match=r"no run of .* after 30 polls"):
        dispatch_and_wait(github_client, infra_repo, payload(), workflow=None, event_type="nobody-listens",
                          timeout_s=600, poll=POLL, clock=synced_clock)
    assert github_emulator.count(LIST_OP) == 30  # bounded: exactly the configured polls
    assert github_emulator.count(DISPATCH_OP) == 1


def test_id_that_contains_another_runs_id_matches_only_its_own(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock) -> None:
    long_cid = CID + "-99"
    github_emulator.create_run(infra_repo, display_title=f"Benchmark v1.2.3 {CID}", status="completed",
                               conclusion="failure")
    github_emulator.on_dispatch(complete("success"))
    result = run(github_client, infra_repo, synced_clock, correlation=long_cid)
    mine = [r for r in github_emulator.runs(infra_repo) if r.display_title.endswith(long_cid)]
    assert [result.run_id] == [r.id for r in mine]


def test_duplicate_delivery_fails(github_emulator: GitHubEmulator, github_client: Any, infra_repo: str,
                                  synced_clock: SyncedClock) -> None:
    github_emulator.dispatch_copies = 2  # GitHub delivered the event twice
    github_emulator.on_dispatch(complete("success"))
    with pytest.raises(CheckFailed, match=r"2 workflow runs .* match correlation"):
        run(github_client, infra_repo, synced_clock)
    assert github_emulator.count(DISPATCH_OP) == 1


def test_duplicate_that_appears_while_waiting_fails(github_emulator: GitHubEmulator, github_client: Any,
                                                    infra_repo: str, synced_clock: SyncedClock) -> None:
    def callback(handle: RunHandle, event: DispatchEvent) -> None:
        handle.start()
        later = synced_clock.now() + timedelta(seconds=12)
        github_emulator.create_run(infra_repo, display_title=handle.run.display_title, status="queued",
                                   created_at=synced_clock.now(), visible_at=later)

    github_emulator.on_dispatch(callback)
    with pytest.raises(CheckFailed, match="2 workflow runs"):
        run(github_client, infra_repo, synced_clock)


@pytest.mark.parametrize("conclusion", ["failure", "cancelled", "timed_out", "skipped", "neutral"])
def test_run_that_does_not_succeed_fails(github_emulator: GitHubEmulator, github_client: Any, infra_repo: str,
                                         synced_clock: SyncedClock, conclusion: str) -> None:
    github_emulator.on_dispatch(complete(conclusion))
    with pytest.raises(CheckFailed, match=f"concluded '{conclusion}'"):
        run(github_client, infra_repo, synced_clock)


def test_run_that_never_completes_times_out(github_emulator: GitHubEmulator, github_client: Any, infra_repo: str,
                                            synced_clock: SyncedClock) -> None:
    github_emulator.on_dispatch(lambda handle, event: handle.start())
    with pytest.raises(CheckFailed, match="did not complete before the timeout"):
        run(github_client, infra_repo, synced_clock, timeout_s=60)
    assert sum(synced_clock.slept) <= 65


def test_old_runs_before_the_skew_window_are_ignored(github_emulator: GitHubEmulator, github_client: Any,
                                                     infra_repo: str, synced_clock: SyncedClock) -> None:
    # A run with our exact title, but from before the dispatch (minus skew): a stale id reuse.
    github_emulator.create_run(infra_repo, display_title=f"Benchmark v1.2.3 {CID}", status="completed",
                               conclusion="success", created_at=synced_clock.now() - timedelta(hours=1))
    with pytest.raises(CheckFailed, match="no run of"):
        dispatch_and_wait(github_client, infra_repo, payload(), workflow=None, event_type="nobody-listens",
                          timeout_s=600, poll=PollConfig(attempts=3, interval_s=5), clock=synced_clock)


def test_busy_repository_needs_one_list_request_per_poll(github_emulator: GitHubEmulator, infra_repo: str,
                                                         synced_clock: SyncedClock) -> None:
    from pipeline.dispatch.client import make_client

    # The client's own page size is small; the listing asks for GitHub's maximum anyway.
    small_pages = make_client(base_url=github_emulator.base_url, token=github_emulator.token, per_page=10,
                              backoff_factor=0)
    github_emulator.add_workflow(infra_repo, ".github/workflows/ci.yml", name="CI")
    for i in range(35):
        github_emulator.create_run(infra_repo, display_title=f"Benchmark v0.{i} other-{i:04d}-correlation",
                                   status="completed", conclusion="success",
                                   created_at=synced_clock.now() + timedelta(seconds=1 + i))
        github_emulator.create_run(infra_repo, display_title=f"CI {i}", workflow="ci.yml",
                                   created_at=synced_clock.now() + timedelta(seconds=1 + i))
    # ours is the OLDEST in the window
    github_emulator.on_dispatch(complete("success"))
    result = run(small_pages, infra_repo, synced_clock)
    assert result.conclusion == "success"
    polls = len(synced_clock.slept) + 1
    assert (polls, github_emulator.count(LIST_OP)) == (2, 2)  # found, confirmed: one request each


def test_more_runs_than_one_page_reads_the_pages_total_count_announces(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock) -> None:
    for i in range(130):  # more runs of the workflow in the window than one page (100) holds
        github_emulator.create_run(infra_repo, display_title=f"Benchmark v0.{i} other-{i:04d}-correlation",
                                   status="completed", conclusion="success",
                                   created_at=synced_clock.now() + timedelta(seconds=1 + i % 50))
    github_emulator.on_dispatch(complete("success"))  # ours is the oldest: on page 2
    result = run(github_client, infra_repo, synced_clock)
    assert result.conclusion == "success"
    assert github_emulator.count(LIST_OP) == 4  # 2 polls x 2 pages, as total_count (131) said
    # a duplicate on the second page is found as well
    github_emulator.dispatch_copies = 2
    with pytest.raises(CheckFailed, match="2 workflow runs"):
        run(github_client, infra_repo, synced_clock, correlation=CID + "-2")


def test_more_runs_than_the_bound_fails(github_emulator: GitHubEmulator, github_client: Any, infra_repo: str,
                                        synced_clock: SyncedClock) -> None:
    for i in range(12):
        github_emulator.create_run(infra_repo, display_title=f"Benchmark v0.{i} other-{i:04d}-correlation",
                                   created_at=synced_clock.now())
    github_emulator.on_dispatch(complete("success"))
    with pytest.raises(CheckFailed, match=r"13 runs of .* \(more than 10\); refusing"):
        run(github_client, infra_repo, synced_clock, poll=PollConfig(attempts=3, interval_s=5, max_runs=10,
                                                                     page_size=5))
    assert github_emulator.count(LIST_OP) == 1  # decided from total_count, before reading more pages


def test_5xx_during_polling_backs_off_and_recovers(github_emulator: GitHubEmulator, github_client: Any,
                                                   infra_repo: str, synced_clock: SyncedClock) -> None:
    # 8 x 500: the transport retries each GET 3 times (4 requests), so two polls fail.
    github_emulator.inject_fault(LIST_OP, [500] * 8)
    github_emulator.on_dispatch(complete("success"))
    result = run(github_client, infra_repo, synced_clock)
    assert result.conclusion == "success"
    assert synced_clock.slept[:2] == [5.0, 10.0]  # exponential backoff from the interval
    assert github_emulator.count(DISPATCH_OP) == 1


@pytest.mark.parametrize("status", [403, 429])
def test_secondary_rate_limit_during_polling_waits_retry_after(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock,
        status: int) -> None:
    github_emulator.secondary_rate_limit(LIST_OP, count=2, status=status, retry_after=45)
    github_emulator.on_dispatch(complete("success"))
    result = run(github_client, infra_repo, synced_clock)
    assert result.conclusion == "success"
    assert synced_clock.slept[:2] == [45.0, 45.0]
    # rate-limited requests are not retried by the transport: one request per poll (2 limited, found, confirmed)
    assert github_emulator.count(LIST_OP) == 4


def test_persistent_5xx_is_an_infrastructure_error(github_emulator: GitHubEmulator, github_client: Any,
                                                   infra_repo: str, synced_clock: SyncedClock) -> None:
    github_emulator.inject_fault(LIST_OP, [503] * 400)
    with pytest.raises(InfrastructureError, match="kept failing"):
        run(github_client, infra_repo, synced_clock, poll=PollConfig(attempts=30, interval_s=5, max_transient_errors=3))


def test_retry_error_from_the_transport_is_an_infrastructure_error(
        github_emulator: GitHubEmulator, infra_repo: str, synced_clock: SyncedClock) -> None:
    import github
    from urllib3.util.retry import Retry

    # A transport that raises once its status retries are spent: requests' RetryError, not a GithubException.
    retry = Retry(total=1, status=1, allowed_methods=frozenset({"GET"}), status_forcelist=(503,),
                  backoff_factor=0, raise_on_status=True, respect_retry_after_header=False)
    strict = github.Github(base_url=github_emulator.base_url, auth=github.Auth.Token(github_emulator.token),
                           retry=retry, seconds_between_requests=0, seconds_between_writes=0)
    github_emulator.inject_fault("repos/get", [503] * 2)
    with pytest.raises(InfrastructureError, match=r"reading repository acme/bench-infra: GitHub API failed \(RetryError\)"):
        run(strict, infra_repo, synced_clock)
    github_emulator.inject_fault(LIST_OP, [503] * 400)
    github_emulator.on_dispatch(complete("success"))
    with pytest.raises(InfrastructureError, match=r"kept failing .*RetryError"):
        run(strict, infra_repo, synced_clock, poll=PollConfig(attempts=30, interval_s=5, max_transient_errors=3))
    assert github_emulator.count(DISPATCH_OP) == 1


def test_dispatch_5xx_is_never_resent(github_emulator: GitHubEmulator, github_client: Any, infra_repo: str,
                                      synced_clock: SyncedClock) -> None:
    github_emulator.inject_fault(DISPATCH_OP, [502])
    github_emulator.on_dispatch(complete("success"))
    with pytest.raises(CheckFailed, match="was not re-sent"):
        run(github_client, infra_repo, synced_clock, poll=PollConfig(attempts=5, interval_s=5))
    assert github_emulator.count(DISPATCH_OP) == 1
    assert github_emulator.runs(infra_repo) == []


def test_dispatch_accepted_but_answer_lost_finds_the_run_without_resending(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock) -> None:
    github_emulator.inject_fault(DISPATCH_OP, [504], after=True)
    github_emulator.on_dispatch(complete("success"))
    result = run(github_client, infra_repo, synced_clock)
    assert result.conclusion == "success"
    assert github_emulator.count(DISPATCH_OP) == 1
    assert len(github_emulator.runs(infra_repo)) == 1


def test_dispatch_rejected_422_fails_without_polling(github_emulator: GitHubEmulator, github_client: Any,
                                                     infra_repo: str, synced_clock: SyncedClock) -> None:
    github_emulator.inject_fault(DISPATCH_OP, [422])
    with pytest.raises(CheckFailed, match="rejected: HTTP 422"):
        run(github_client, infra_repo, synced_clock)
    assert github_emulator.count(LIST_OP) == 0


def test_workflow_dispatch_with_run_details_watches_that_run(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock) -> None:
    seen: list[DispatchEvent] = []

    def callback(handle: RunHandle, event: DispatchEvent) -> None:
        seen.append(event)
        handle.complete("success")

    github_emulator.on_dispatch(callback)
    result = run(github_client, infra_repo, synced_clock, workflow="benchmark.yml")
    [created] = github_emulator.runs(infra_repo)
    assert (result.run_id, result.mode) == (created.id, "workflow_dispatch")
    assert created.event == "workflow_dispatch" and created.display_title == f"Benchmark v1.2.3 {CID}"
    assert seen[0].inputs is not None and set(seen[0].inputs) == {"payload", "tag", "correlation_id"}
    assert seen[0].benchseal_payload() == payload().to_json_dict()
    assert github_emulator.count("actions/create-workflow-dispatch") == 1
    # the returned run is read once and checked, then followed through the workflow's listing
    assert github_emulator.count("actions/get-workflow-run") == 1
    assert github_emulator.count(LIST_OP) == 2


def test_ghes_rejecting_return_run_details_falls_back_to_run_name(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock) -> None:
    github_emulator.reject_return_run_details = True
    github_emulator.on_dispatch(complete("success"))
    result = run(github_client, infra_repo, synced_clock, workflow="benchmark.yml")
    [created] = github_emulator.runs(infra_repo)
    assert (result.run_id, result.mode) == (created.id, "workflow_dispatch+run-name")
    # one rejected POST (nothing ran), one accepted: exactly one run
    assert github_emulator.count("actions/create-workflow-dispatch") == 2
    assert github_emulator.count("actions/list-workflow-runs") >= 1


def test_workflow_run_with_foreign_title_is_refused(github_emulator: GitHubEmulator, github_client: Any,
                                                    infra_repo: str, synced_clock: SyncedClock) -> None:
    github_emulator.add_workflow(infra_repo, ".github/workflows/other.yml",
                                 "name: other\non:\n  workflow_dispatch:\n    inputs:\n"
                                 "      payload: {type: string}\n      tag: {type: string}\n"
                                 "      correlation_id: {type: string}\njobs: {}\n")
    github_emulator.on_dispatch(complete("success"))
    with pytest.raises(CheckFailed, match="does not end in"):
        run(github_client, infra_repo, synced_clock, workflow="other.yml")


def test_missing_workflow_or_repository_fails(github_emulator: GitHubEmulator, github_client: Any, infra_repo: str,
                                              synced_clock: SyncedClock) -> None:
    with pytest.raises(CheckFailed, match=r"workflow 'nope\.yml'"):
        run(github_client, infra_repo, synced_clock, workflow="nope.yml")
    with pytest.raises(CheckFailed, match="repository acme/missing"):
        run(github_client, "acme/missing", synced_clock)


# --- the workflow file's ref in the run's path (issue 22) ----------------------------------------

BENCHMARK_PATH = ".github/workflows/benchmark.yml"
# Each names benchmark.yml, on a run whose head_branch is main, taken from a ref that is not main.
OTHER_REFS = ["refs/heads/evil", "refs/heads/main/evil", "refs/heads/mainx", "refs/heads/Main", "refs/tags/main",
              "refs/pull/1/merge", "refs/heads/main@refs/heads/evil", "refs/remotes/origin/main", "heads/main",
              "evil", "MAIN", "refs/heads/main/", "refs/heads//main", "main\u200b", "refs/heads/ma%69n"]


def _with_path(path: str, conclusion: str = "success") -> Any:
    def callback(handle: RunHandle, event: DispatchEvent) -> None:
        handle.set(path=path)
        handle.complete(conclusion)

    return callback


@pytest.mark.parametrize("ref", OTHER_REFS)
@pytest.mark.parametrize("mode", ["repository_dispatch", "workflow_dispatch"])
def test_a_run_of_the_workflow_file_at_another_ref_is_refused(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock,
        ref: str, mode: str) -> None:
    """`.../benchmark.yml@refs/heads/evil` with head_branch main was adopted before: the workflow
    that ran is the evil branch's file, whatever the branch the run is filed under."""
    github_emulator.on_dispatch(_with_path(f"{BENCHMARK_PATH}@{ref}"))
    with pytest.raises(CheckFailed, match=r"ran the workflow file at .*not at refs/heads/main"):
        run(github_client, infra_repo, synced_clock, workflow="benchmark.yml" if mode == "workflow_dispatch" else None)
    [created] = github_emulator.runs(infra_repo)
    assert created.head_branch == "main"  # the branch alone would have passed


@pytest.mark.parametrize("suffix", ["", "@refs/heads/main", "@main"])
def test_a_run_of_the_workflow_file_at_the_default_branch_is_adopted(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock,
        suffix: str) -> None:
    github_emulator.on_dispatch(_with_path(BENCHMARK_PATH + suffix))
    assert run(github_client, infra_repo, synced_clock).conclusion == "success"


@pytest.mark.parametrize("prefix", ["acme/bench-infra/", "ACME/bench-infra/"])
def test_a_repository_prefixed_path_at_another_ref_is_refused(
        github_emulator: GitHubEmulator, github_client: Any, infra_repo: str, synced_clock: SyncedClock,
        prefix: str) -> None:
    assert infra_repo == "acme/bench-infra"
    github_emulator.on_dispatch(_with_path(f"{prefix}{BENCHMARK_PATH}@refs/heads/evil"))
    with pytest.raises(CheckFailed, match=r"ran the workflow file at 'refs/heads/evil'"):
        run(github_client, infra_repo, synced_clock)
