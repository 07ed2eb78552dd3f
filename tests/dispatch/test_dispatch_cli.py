"""The CLI verbs as real processes against the emulator (real clock, short poll interval)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.github import DispatchEvent, GitHubEmulator, RunHandle, SystemClock
from tests.fixtures.github import API_REF, RUNNER_REF

pytestmark = pytest.mark.slow  # real processes, ~1-2 s each

BENCHSEAL = [sys.executable, "-m", "pipeline"]
CID = "widget-900-1-feedface0001"


@pytest.fixture
def github_clock() -> Any:  # overrides the fake clock: the CLI sleeps for real
    return SystemClock()


def cli(args: list[str], emulator: GitHubEmulator, *, token: bool | str = True,
        api_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_TOKEN", "GH_TOKEN")}
    env["GITHUB_API_URL"] = api_url or emulator.base_url
    secret = token if isinstance(token, str) else emulator.token
    if token:
        env["GH_TOKEN"] = secret
    proc = subprocess.run([*BENCHSEAL, *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert emulator.token not in proc.stdout + proc.stderr  # never echoed
    assert secret not in proc.stdout + proc.stderr
    return proc


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e]")


def json_failure(proc: subprocess.CompletedProcess[str], exit_code: int) -> dict[str, Any]:
    """``--json`` failed: exactly one JSON object on stdout, ok false, the error escaped, the exit code kept."""
    assert proc.returncode == exit_code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    body = json.loads(lines[0])
    assert isinstance(body, dict) and body["ok"] is False and body["exit_code"] == exit_code
    assert isinstance(body["error"], str) and body["error"]
    assert not CONTROL.search(body["error"]), body["error"]  # escaped, even inside the JSON string
    assert "Traceback" not in proc.stderr
    assert not CONTROL.search(proc.stderr.replace("\n", "")), proc.stderr
    return body


def test_resolve_ref_cli(github_emulator: GitHubEmulator) -> None:
    github_emulator.add_repo("acme/widget")
    commit = github_emulator.head("acme/widget")
    github_emulator.add_tag("acme/widget", "v1.2.3", commit, annotated=True)
    proc = cli(["resolve-ref", "--repo", "acme/widget", "--tag", "v1.2.3"], github_emulator)
    assert (proc.returncode, proc.stdout.strip()) == (0, commit)
    proc = cli(["resolve-ref", "--repo", "acme/widget", "--tag", "v1.2.3", "--json"], github_emulator)
    assert json.loads(proc.stdout) == {"repository": "acme/widget", "tag": "v1.2.3", "commit": commit}
    missing = cli(["resolve-ref", "--repo", "acme/widget", "--tag", "v0.0.1"], github_emulator)
    assert missing.returncode == 1 and "tag 'v0.0.1' not found in acme/widget" in missing.stderr
    no_token = cli(["resolve-ref", "--repo", "acme/widget", "--tag", "v1.2.3"], github_emulator, token=False)
    assert no_token.returncode == 2 and "GITHUB_TOKEN or GH_TOKEN" in no_token.stderr


def test_dispatch_cli_json_success_and_failure(github_emulator: GitHubEmulator, infra_repo: str,
                                               digests_file: Path) -> None:
    conclusions = ["success", "failure"]

    def callback(handle: RunHandle, event: DispatchEvent) -> None:
        handle.complete(conclusions.pop(0))

    github_emulator.on_dispatch(callback)
    args = ["dispatch", "--repo", infra_repo, "--digests", str(digests_file), "--poll-interval", "0.2", "--json"]
    ok = cli([*args, "--correlation", CID], github_emulator)
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    [run] = github_emulator.runs(infra_repo)
    assert result["ok"] is True and result["run_id"] == run.id and result["correlation_id"] == CID
    assert result["html_url"].endswith(f"/actions/runs/{run.id}") and result["conclusion"] == "success"
    # the refs actually dispatched, under the names the workflows read (and the older names)
    assert result["runner_ref"] == result["runner"] == RUNNER_REF
    assert result["api_ref"] == result["api"] == API_REF
    assert (result["mode"], result["workflow_path"]) == ("repository_dispatch", ".github/workflows/benchmark.yml")
    assert run.payload["runner"] == RUNNER_REF and run.payload["api"] == API_REF

    failed = cli(args, github_emulator)  # correlation generated
    assert failed.returncode == 1
    body = json.loads(failed.stdout)
    assert body["ok"] is False and "concluded 'failure'" in body["error"]
    assert github_emulator.runs(infra_repo)[-1].display_title.endswith(" " + body["correlation_id"])


def test_dispatch_cli_text_output_and_usage_errors(github_emulator: GitHubEmulator, infra_repo: str,
                                                   digests_file: Path, tmp_path: Path) -> None:
    github_emulator.on_dispatch(lambda handle, event: handle.complete("success"))
    ok = cli(["dispatch", "--repo", infra_repo, "--digests", str(digests_file), "--correlation", CID,
              "--workflow", "benchmark.yml", "--poll-interval", "0.2"], github_emulator)
    assert ok.returncode == 0, ok.stderr
    [run] = github_emulator.runs(infra_repo)
    assert ok.stdout.startswith(f"run {run.id} http://127.0.0.1:") and "concluded success" in ok.stdout

    ok = cli(["dispatch", "--repo", infra_repo, "--digests", str(digests_file), "--correlation", CID + "-2",
              "--workflow-file", "benchmark.yml", "--workflow-dispatch", "--poll-interval", "0.2", "--json"],
             github_emulator)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["mode"] == "workflow_dispatch"

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "benchseal.digests/v1"}))
    proc = cli(["dispatch", "--repo", infra_repo, "--digests", str(bad)], github_emulator)
    assert proc.returncode == 2 and "invalid" in proc.stderr
    proc = cli(["dispatch", "--repo", infra_repo, "--digests", str(digests_file), "--correlation", "has space"],
               github_emulator)
    assert proc.returncode == 2 and "correlation" in proc.stderr
    assert len(github_emulator.runs(infra_repo)) == 2  # nothing was dispatched by the failed calls


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_dispatch_cli_json_when_github_fails(github_emulator: GitHubEmulator, infra_repo: str,
                                             digests_file: Path) -> None:
    args = ["dispatch", "--repo", infra_repo, "--digests", str(digests_file), "--correlation", CID,
            "--poll-interval", "0.1", "--poll-attempts", "2", "--json"]
    unreachable = json_failure(cli(args, github_emulator, api_url=f"http://127.0.0.1:{_closed_port()}/api/v3"), 1)
    assert "unreachable" in unreachable["error"] and unreachable["correlation_id"] == CID
    bad_token = json_failure(cli(args, github_emulator, token="ghs_" + "0123456789abcdef" * 2), 1)
    assert "401" in bad_token["error"] and "bad credentials" in bad_token["error"]
    github_emulator.inject_fault("repos/get", [503] * 4)  # the transport's retries included
    assert "HTTP 503" in json_failure(cli(args, github_emulator), 1)["error"]
    github_emulator.inject_fault("repos/create-dispatch-event", [502])
    assert "was not re-sent" in json_failure(cli(args, github_emulator), 1)["error"]
    github_emulator.inject_fault("repos/create-dispatch-event", [422], message="no\x1b[2J\n::error::forged")
    rejected = json_failure(cli(args, github_emulator), 1)
    assert "rejected: HTTP 422 (no\\x1b[2J)" in rejected["error"]
    missing = json_failure(cli([*args[:2], "acme/missing", *args[3:]], github_emulator), 1)
    assert "repository acme/missing not found" in missing["error"]
    assert github_emulator.runs(infra_repo) == []


def test_dispatch_cli_json_on_usage_errors(github_emulator: GitHubEmulator, infra_repo: str, digests_file: Path,
                                           tmp_path: Path) -> None:
    base = ["dispatch", "--repo", infra_repo, "--digests", str(digests_file), "--json"]
    hostile = tmp_path / "digests\x1b[31m\n::error::forged.json"
    cases: list[tuple[list[str], str]] = [
        (["dispatch", "--digests", str(digests_file), "--json"], "--repo"),  # missing option, found by the parser
        ([*base, "--poll-attempts", "0"], "--poll-attempts"),
        ([*base, "--timeout", "soon"], "--timeout"),
        ([*base, "--bogus"], "--bogus"),
        ([*base, "--workflow-file", "../benchmark.yml"], "--workflow-file"),
        ([*base, "--workflow-file", "bench\x1bmark.yml"], "--workflow-file"),
        ([*base, "--workflow", "a.yml", "--workflow-file", "b.yml"], "disagree"),
        ([*base, "--correlation", "has space"], "correlation"),
        ([*base, "--correlation", "ok-id-but\n::error::forged"], "correlation"),
        (["dispatch", "--repo", "acme/x\n::error::forged", "--digests", str(digests_file), "--json"], "repo"),
        (["dispatch", "--repo", infra_repo, "--digests", str(tmp_path / "absent.json"), "--json"], "does not exist"),
        (["dispatch", "--repo", infra_repo, "--digests", str(hostile), "--json"], "does not exist"),
    ]
    (tmp_path / "garbage.json").write_text("{not json")
    cases.append((["dispatch", "--repo", infra_repo, "--digests", str(tmp_path / "garbage.json"), "--json"],
                  "readable JSON"))
    for args, needle in cases:
        body = json_failure(cli(args, github_emulator), 2)
        assert needle in body["error"], (args, body)
    hostile_body = json_failure(cli(cases[-2][0], github_emulator), 2)
    error = hostile_body["error"]  # escaped once (by the error hierarchy): no raw ESC or newline survives
    assert "\x1b" not in error and "\n" not in error and "digests\\x1b[31m" in error and "::error::forged.json" in error
    no_token = json_failure(cli(base, github_emulator, token=False), 2)
    assert "GITHUB_TOKEN or GH_TOKEN" in no_token["error"]
    assert github_emulator.count("repos/create-dispatch-event") == 0  # nothing was dispatched


def test_merge_digests_cli(tmp_path: Path, github_emulator: GitHubEmulator) -> None:
    from tests.fixtures.github import digests_data

    full = digests_data()
    for role in ("runner", "api"):
        part = {**full, "images": {role: full["images"][role]}}
        (tmp_path / f"digests-{role}.json").write_text(json.dumps(part))
    files = [str(tmp_path / "digests-runner.json"), str(tmp_path / "digests-api.json")]
    out = tmp_path / "digests.json"
    proc = cli(["merge-digests", "--out", str(out), "--expect-commit", "c" * 40, *files], github_emulator)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split("=", 1) for line in proc.stdout.splitlines())
    assert lines == {"runner_ref": full["images"]["runner"]["ref"], "api_ref": full["images"]["api"]["ref"],
                     "commit": "c" * 40}
    assert json.loads(out.read_text()) == full
    moved = cli(["merge-digests", "--out", str(out), "--expect-commit", "d" * 40, *files], github_emulator)
    assert moved.returncode == 1 and "tag resolves to" in moved.stderr
    one = cli(["merge-digests", "--out", str(out), files[0]], github_emulator)
    assert one.returncode == 1 and "lack image(s) api" in one.stderr


def test_merge_digests_keeps_the_adopters_own_images_once(tmp_path: Path) -> None:
    """The runner's build also made the project's own images (project_images): the merged file keeps
    them, and the same name from two files is refused rather than one silently winning."""
    from pipeline.core.errors import CheckFailed
    from pipeline.dispatch.merge import merge_digests
    from tests.fixtures.github import digests_data

    full = digests_data()
    own = {"coval-api": {**full["images"]["api"], "name": full["images"]["api"]["name"] + "-coval",
                         "ref": full["images"]["api"]["name"] + "-coval@" + full["images"]["api"]["digest"]}}
    runner = {**full, "images": {"runner": full["images"]["runner"]}, "project_images": own}
    api = {**full, "images": {"api": full["images"]["api"]}}
    paths = []
    for name, data in (("runner", runner), ("api", api)):
        paths.append(tmp_path / f"digests-{name}.json")
        paths[-1].write_text(json.dumps(data))
    merged = merge_digests(paths)
    assert {name: entry.ref for name, entry in merged.project_images.items()} == {"coval-api": own["coval-api"]["ref"]}
    paths[1].write_text(json.dumps({**api, "project_images": own}))
    with pytest.raises(CheckFailed, match="project image 'coval-api' appears in more than one"):
        merge_digests(paths)
