"""The emulator itself: layout, pagination, headers, auth, releases (immutable), checks, validation."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import github
import pytest
import requests

from tests.doubles.github import SPEC_CORRECTIONS, FakeClock, GitHubEmulator, client
from tests.doubles.github.actions import WorkflowSpec, render_run_name
from tests.doubles.github.emulator import IMMUTABLE_UPLOAD_MESSAGE

REPO = "acme/widget"


@pytest.fixture
def repo(github_emulator: GitHubEmulator) -> str:
    github_emulator.add_repo(REPO)
    return REPO


def test_enterprise_layout_and_pagination_stay_on_one_host(github_emulator: GitHubEmulator, github_client: Any,
                                                           repo: str) -> None:
    for i in range(7):
        github_emulator.create_run(repo, display_title=f"run {i}")
    origin = urlparse(github_emulator.base_url)
    assert origin.path == "/api/v3" and origin.hostname == "127.0.0.1"
    response = requests.get(f"{github_emulator.base_url}/repos/{REPO}/actions/runs", params={"per_page": 3, "page": 2},
                            headers={"Authorization": f"token {github_emulator.token}"}, timeout=10)
    links = requests.utils.parse_header_links(response.headers["link"])
    assert {link["rel"] for link in links} == {"next", "last", "first", "prev"}
    for link in links:
        parsed = urlparse(link["url"])
        assert (parsed.hostname, parsed.port) == (origin.hostname, origin.port)
    assert [r["display_title"] for r in response.json()["workflow_runs"]] == ["run 3", "run 2", "run 1"]
    from pipeline.dispatch.client import make_client

    paged = make_client(base_url=github_emulator.base_url, token=github_emulator.token, per_page=2, backoff_factor=0)
    before = github_emulator.count("actions/list-workflow-runs-for-repo")
    titles = [run.display_title for run in paged.get_repo(repo).get_workflow_runs()]
    assert titles == [f"run {i}" for i in reversed(range(7))]
    assert github_emulator.count("actions/list-workflow-runs-for-repo") - before == 4  # followed every Link


def test_rate_limit_headers_and_endpoint(github_emulator: GitHubEmulator, github_client: Any, repo: str) -> None:
    first = requests.get(f"{github_emulator.base_url}/repos/{REPO}",
                         headers={"Authorization": f"Bearer {github_emulator.token}"}, timeout=10)
    second = requests.get(f"{github_emulator.base_url}/repos/{REPO}",
                          headers={"Authorization": f"Bearer {github_emulator.token}"}, timeout=10)
    assert int(second.headers["x-ratelimit-remaining"]) == int(first.headers["x-ratelimit-remaining"]) - 1
    assert first.headers["x-ratelimit-limit"] == "5000" and "x-ratelimit-reset" in first.headers
    assert github_client.get_rate_limit().resources.core.limit == 5000


def test_bad_token_is_401(github_emulator: GitHubEmulator, repo: str) -> None:
    with pytest.raises(github.BadCredentialsException):
        client(github_emulator.base_url, "ghs_wrong").get_repo(repo)


def test_release_assets_carry_sha256_digests_and_download(github_client: Any, repo: str, tmp_path: Path) -> None:
    release = github_client.get_repo(repo).create_git_release("v1.0.0", "v1.0.0", "notes", draft=True)
    asset = release.upload_asset_from_memory(b"evidence", len(b"evidence"), "SHA256SUMS")
    assert asset.digest == "sha256:" + hashlib.sha256(b"evidence").hexdigest()
    target = tmp_path / "SHA256SUMS"
    asset.download_asset(str(target))
    assert target.read_bytes() == b"evidence"
    with pytest.raises(github.GithubException) as dup:
        release.upload_asset_from_memory(b"x", 1, "SHA256SUMS")
    assert dup.value.status == 422


def test_immutable_release_refuses_asset_changes_after_publication(github_emulator: GitHubEmulator,
                                                                  github_client: Any, repo: str) -> None:
    github_emulator.set_immutable_releases(repo)
    gh_repo = github_client.get_repo(repo)
    draft = gh_repo.create_git_release("v2.0.0", "v2.0.0", "notes", draft=True)
    kept = draft.upload_asset_from_memory(b"a", 1, "a.txt")  # drafts are still mutable
    published = draft.update_release("v2.0.0", "notes, edited", draft=False)
    assert published.raw_data["immutable"] is True
    with pytest.raises(github.GithubException) as upload:
        published.upload_asset_from_memory(b"b", 1, "b.txt")
    assert upload.value.status == 422 and upload.value.data["message"] == IMMUTABLE_UPLOAD_MESSAGE
    with pytest.raises(github.GithubException) as delete:
        kept.delete_asset()
    assert delete.value.status == 422
    assert published.update_release("v2.0.0 final", "notes stay editable").name == "v2.0.0 final"
    published.delete_release()
    with pytest.raises(github.GithubException) as reuse:
        gh_repo.create_git_release("v2.0.0", "again", "notes")
    assert reuse.value.status == 422 and "immutable release" in str(reuse.value.data)


def test_check_runs(github_emulator: GitHubEmulator, github_client: Any, repo: str) -> None:
    gh_repo = github_client.get_repo(repo)
    check = gh_repo.create_check_run("benchseal/benchmark", github_emulator.head(repo), status="in_progress")
    check.edit(conclusion="success", output={"title": "score 1.0", "summary": "3/3 resolved"})
    fetched = gh_repo.get_check_run(check.id)
    assert (fetched.status, fetched.conclusion, fetched.output.title) == ("completed", "success", "score 1.0")


def test_dispatch_callback_and_custom_render(github_emulator: GitHubEmulator, github_client: Any, repo: str) -> None:
    github_emulator.add_workflow(repo, ".github/workflows/x.yml", render=lambda ctx: "custom " +
                                 ctx["github"]["event"]["client_payload"]["id"])
    handled: list[int] = []
    github_emulator.on_dispatch(lambda handle, event: handled.append(handle.run_id))
    assert github_client.get_repo(repo).create_repository_dispatch("anything", {"id": "abc"}) is True
    github_emulator.wait_callbacks()
    [run] = github_emulator.runs(repo)
    assert handled == [run.id] and run.display_title == "custom abc" and run.event == "repository_dispatch"


def test_workflow_runs_listing_filters_counts_and_pages(github_emulator: GitHubEmulator, repo: str) -> None:
    from datetime import timedelta

    github_emulator.add_workflow(repo, ".github/workflows/sub/benchmark.yml", name="elsewhere")  # listed first
    github_emulator.add_workflow(repo, ".github/workflows/sub/only.yml", name="elsewhere too")
    github_emulator.add_workflow(repo, ".github/workflows/benchmark.yml", name="benchmark")
    github_emulator.add_workflow(repo, ".github/workflows/ci.yml", name="CI")
    now = github_emulator.clock.now()
    for i in range(5):
        github_emulator.create_run(repo, display_title=f"b{i}", workflow="benchmark.yml",
                                   created_at=now - timedelta(seconds=10 * i))
        github_emulator.create_run(repo, display_title=f"c{i}", workflow="ci.yml", created_at=now)
    github_emulator.create_run(repo, display_title="push", workflow="benchmark.yml", event="push", created_at=now)
    headers = {"Authorization": f"token {github_emulator.token}"}
    url = f"{github_emulator.base_url}/repos/{REPO}/actions/workflows/benchmark.yml/runs"
    params = {"event": "repository_dispatch", "created": ">=" + (now - timedelta(seconds=25)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"), "per_page": 2}
    first = requests.get(url, params=params, headers=headers, timeout=10).json()
    assert first["total_count"] == 3  # the workflow's own runs, filtered by event and created, all pages
    assert [r["display_title"] for r in first["workflow_runs"]] == ["b0", "b1"]
    assert {r["path"] for r in first["workflow_runs"]} == {".github/workflows/benchmark.yml"}
    second = requests.get(url, params={**params, "page": 2}, headers=headers, timeout=10).json()
    assert (second["total_count"], [r["display_title"] for r in second["workflow_runs"]]) == (3, ["b2"])
    # a workflow is found by id or by its file name in .github/workflows, never by a file elsewhere
    assert requests.get(f"{github_emulator.base_url}/repos/{REPO}/actions/workflows/only.yml",
                        headers=headers, timeout=10).status_code == 404
    found = requests.get(f"{github_emulator.base_url}/repos/{REPO}/actions/workflows/benchmark.yml",
                         headers=headers, timeout=10).json()
    assert found["path"] == ".github/workflows/benchmark.yml"


def test_hostile_run_knobs(github_emulator: GitHubEmulator, github_client: Any, repo: str) -> None:
    from datetime import timedelta

    github_emulator.add_repo("evil/widget")
    github_emulator.add_workflow(repo, ".github/workflows/a.yml", "name: a\non:\n  workflow_dispatch: {}\njobs: {}\n")
    github_emulator.add_workflow(repo, ".github/workflows/b.yml", "name: b\non:\n  workflow_dispatch: {}\njobs: {}\n")
    decoy = github_emulator.create_run(repo, display_title="decoy", workflow="b.yml")
    github_emulator.set_run(repo, decoy.id, head_repository="evil/widget")
    github_emulator.return_run_details_id = lambda started: decoy.id
    github_emulator.workflow_appearance_delay[".github/workflows/a.yml"] = timedelta(seconds=30)
    answer = github_client.get_repo(repo).get_workflow("a.yml").create_dispatch("main", return_run_details=True)
    assert answer.id == decoy.id  # a hostile answer: another workflow's run
    [_, started] = github_emulator.runs(repo)
    assert started.visible_at == started.created_at + timedelta(seconds=30)
    fetched = github_client.get_repo(repo).get_workflow_run(decoy.id)
    assert fetched.head_repository.full_name == "evil/widget" and fetched.repository.full_name == REPO


def test_run_name_rendering() -> None:
    text = (Path(__file__).resolve().parents[2] / "examples/bench-infra/.github/workflows/benchmark.yml").read_text()
    spec = WorkflowSpec.parse("benchmark.yml", text)
    assert spec.accepts_repository_dispatch("benchseal-benchmark") and not spec.accepts_repository_dispatch("other")
    assert spec.run_name is not None
    rd = {"github": {"event": {"client_payload": {"source": {"tag": "v1"}, "correlation_id": "cid-12345678"}}}}
    wd = {"inputs": {"tag": "v2", "correlation_id": "cid-87654321"}, "github": {"event": {}}}
    assert render_run_name(spec.run_name, rd) == "Benchmark v1 cid-12345678"
    assert render_run_name(spec.run_name, wd) == "Benchmark v2 cid-87654321"
    assert render_run_name("${{ format('{0}-{1}', 'a', inputs.x) }} tail", {"inputs": {"x": 3}}) == "a-3 tail"


def test_violations_are_recorded_not_hidden() -> None:
    with GitHubEmulator(clock=FakeClock()) as emulator:
        emulator.add_repo(REPO)
        original = emulator._release_json

        def broken(ctx: Any, repo: Any, release: Any) -> dict[str, Any]:
            data = original(ctx, repo, release)
            del data["upload_url"]  # a required field
            return data

        emulator._release_json = broken  # type: ignore[method-assign]
        gh = client(emulator.base_url, emulator.token)
        gh.get_repo(REPO).create_git_release("v1", "v1", "notes")
        requests.get(f"{emulator.base_url}/repos/{REPO}/not-in-the-subset",
                     headers={"Authorization": f"token {emulator.token}"}, timeout=10)
        kinds = sorted((v.kind, v.operation) for v in emulator.violations)
    assert kinds == [("response", "repos/create-release"), ("unrouted", "-")]
    assert "upload_url" in str(emulator.violations)


def test_spec_copy_and_corrections_are_documented() -> None:
    root = Path(__file__).resolve().parents[2]
    openapi = root / "tests/doubles/github/openapi"
    assert (openapi / "PROVENANCE.md").is_file() and (openapi / "github-rest-subset.json").is_file()
    docs = (root / "docs/github.md").read_text()
    for name, _why, _fn in SPEC_CORRECTIONS:
        assert f"`{name}`" in docs


def test_emulator_serves_standalone_for_the_demo(tmp_path: Path) -> None:
    import json
    import signal
    import subprocess
    import sys
    import time

    state = tmp_path / "emulator.json"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "tests.doubles.github", "--state", str(state),
                             "--repo", REPO, "--workflow", f"{REPO}={root / '.github/workflows/benchmark.yml'}"],
                            cwd=root)
    try:
        for _ in range(200):
            if state.exists():
                break
            time.sleep(0.05)
        info = json.loads(state.read_text())
        assert info["pid"] == proc.pid and state.stat().st_mode & 0o077 == 0
        workflows = client(info["base_url"], info["token"]).get_repo(REPO).get_workflows()
        assert [w.path for w in workflows] == [".github/workflows/benchmark.yml"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
