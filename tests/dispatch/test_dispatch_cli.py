"""The CLI verbs as real processes against the emulator (real clock, short poll interval)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.testing.github import DispatchEvent, GitHubEmulator, RunHandle, SystemClock

pytestmark = pytest.mark.slow  # real processes, ~1-2 s each

BENCHSEAL = [sys.executable, "-m", "pipeline"]
CID = "widget-900-1-feedface0001"


@pytest.fixture
def github_clock() -> Any:  # overrides the fake clock: the CLI sleeps for real
    return SystemClock()


def cli(args: list[str], emulator: GitHubEmulator, *, token: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_TOKEN", "GH_TOKEN")}
    env["GITHUB_API_URL"] = emulator.base_url
    if token:
        env["GH_TOKEN"] = emulator.token
    proc = subprocess.run([*BENCHSEAL, *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert emulator.token not in proc.stdout + proc.stderr  # never echoed
    return proc


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

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "benchseal.digests/v1"}))
    proc = cli(["dispatch", "--repo", infra_repo, "--digests", str(bad)], github_emulator)
    assert proc.returncode == 2 and "invalid" in proc.stderr
    proc = cli(["dispatch", "--repo", infra_repo, "--digests", str(digests_file), "--correlation", "has space"],
               github_emulator)
    assert proc.returncode == 2 and "correlation" in proc.stderr
    assert len(github_emulator.runs(infra_repo)) == 1  # nothing was dispatched by the failed calls


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
