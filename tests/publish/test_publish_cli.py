"""``benchseal publish`` and ``benchseal release`` as a user runs them: exit codes and messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fixtures.github import tag_release_commit

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BENCHSEAL, *args], capture_output=True, text=True, check=False, timeout=120,
                          env=env or dict(os.environ))


def test_manual_local_publication(make_artifacts: Any, tmp_path: Path) -> None:
    art = make_artifacts()
    done = _run("publish", str(art), "--tag", "v1.0.0", "--root", str(tmp_path / "rel"), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["location"] == str(tmp_path / "rel" / "v1.0.0") and (tmp_path / "rel" / "v1.0.0" / "body.md").is_file()
    again = _run("publish", str(art), "--tag", "v1.0.0", "--root", str(tmp_path / "rel"))
    assert again.returncode == 0 and "0 asset(s) changed, body unchanged" in again.stdout


def test_usage_errors_exit_2(make_artifacts: Any) -> None:
    art = make_artifacts()
    cases = [
        (["publish"], "give --pending, or ARTIFACTS and --tag"),
        (["publish", "--pending", str(art)], "do not combine"),
        (["publish", "--pending", "--attempts", "3"], "do not combine"),
        (["publish", str(art), "--tag", "v1.0.0", "--attempts", "0"], "--attempts"),
        (["publish", str(art), "--tag", "v1.0.0", "--target", "github"], "--repo OWNER/NAME"),
        (["publish", str(art), "--tag", "v1.0.0", "--target", "s3"], "must be local or github"),
        (["release", "v1.0.0"], "only --local"),
        (["release", "1.0", "--local"], "must look like vX.Y.Z"),
        (["publish", str(art.parent / "no-such-dir"), "--tag", "v1.0.0"], "invalid ARTIFACTS"),
    ]
    for argv, message in cases:
        done = _run(*argv)
        assert done.returncode == 2 and message in done.stderr, (argv, done.stderr)


def test_manual_github_publication_needs_a_prerelease(make_artifacts: Any, github_env: Any) -> None:
    from pipeline.dispatch.client import make_client

    github_env.add_repo("acme/widget")
    tag_release_commit(github_env, "acme/widget", "v1.0.0")  # the run's commit (summary.json)
    repo = make_client(base_url=github_env.base_url, token=github_env.token).get_repo("acme/widget")
    repo.create_git_release(tag="v1.0.0", name="v1.0.0", message="notes")
    art = make_artifacts()
    done = _run("publish", str(art), "--tag", "v1.0.0", "--target", "github", "--repo", "acme/widget",
                env=dict(os.environ))
    assert done.returncode == 1 and "not a prerelease" in done.stderr
    assert "ghs_" not in done.stderr + done.stdout  # the token never shows
    assert github_env.release("acme/widget", "v1.0.0").assets == []
    allowed = _run("publish", str(art), "--tag", "v1.0.0", "--target", "github", "--repo", "acme/widget",
                   "--allow-full-release", env=dict(os.environ))
    assert allowed.returncode == 0, allowed.stderr
    assert sorted(a.name for a in github_env.release("acme/widget", "v1.0.0").assets) == sorted(
        p.name for p in art.iterdir())


def _release_with_notes(github_env: Any, *, prerelease: bool = True) -> None:
    from pipeline.dispatch.client import make_client

    github_env.add_repo("acme/widget")
    tag_release_commit(github_env, "acme/widget", "v1.0.0")
    repo = make_client(base_url=github_env.base_url, token=github_env.token).get_repo("acme/widget")
    repo.create_git_release(tag="v1.0.0", name="v1.0.0", message="notes", prerelease=prerelease)


def test_seal_job_publication_retries_retryable_failures(make_artifacts: Any, github_env: Any) -> None:
    """What benchmark.yml's seal job runs (--attempts 5): a 5xx is retried with the outbox's
    backoff, and the release converges on exactly one correct publication."""
    _release_with_notes(github_env)
    art = make_artifacts()
    github_env.inject_fault("repos/upload-release-asset", [502, 503])
    done = _run("publish", str(art), "--tag", "v1.0.0", "--target", "github", "--repo", "acme/widget",
                "--trigger", "tag", "--attempts", "5", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "attempt 1 of 5 failed, retrying" in done.stderr
    assets = github_env.release("acme/widget", "v1.0.0").assets
    assert sorted(a.name for a in assets) == sorted(p.name for p in art.iterdir())
    assert {a.name: a.data for a in assets} == {p.name: p.read_bytes() for p in art.iterdir()}


def test_publication_gives_up_after_its_attempts(make_artifacts: Any, github_env: Any) -> None:
    _release_with_notes(github_env)
    art = make_artifacts()
    github_env.inject_fault("repos/update-release", [500, 500])
    done = _run("publish", str(art), "--tag", "v1.0.0", "--target", "github", "--repo", "acme/widget",
                "--trigger", "tag", "--attempts", "2", env=dict(os.environ))
    assert done.returncode == 1 and "(attempt 2 of 2)" in done.stderr, done.stderr
    assert "ghs_" not in done.stderr + done.stdout


def test_a_refusal_is_never_retried(make_artifacts: Any, github_env: Any) -> None:
    _release_with_notes(github_env, prerelease=False)  # a manual publication may not touch it
    art = make_artifacts()
    refused = _run("publish", str(art), "--tag", "v1.0.0", "--target", "github", "--repo", "acme/widget",
                   "--attempts", "5", env=dict(os.environ))
    assert refused.returncode == 1 and "not a prerelease" in refused.stderr
    assert "retrying" not in refused.stderr and "(attempt 1 of 5)" in refused.stderr
    assert github_env.release("acme/widget", "v1.0.0").assets == []


def test_an_unreachable_github_is_one_line_and_evidence_is_checked_first(make_artifacts: Any, tmp_path: Path) -> None:
    """Nothing listens at the API URL: a retried publication failure on one line (exit 1), never a
    traceback; an incomplete evidence directory is refused before GitHub is asked anything."""
    env = {**os.environ, "GITHUB_TOKEN": "t", "GITHUB_API_URL": "http://127.0.0.1:9"}
    argv = ["--tag", "v1.0.0", "--target", "github", "--trigger", "tag", "--repo", "acme/widget", "--attempts", "2"]
    done = _run("publish", str(make_artifacts()), *argv, env=env)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.splitlines()[-1].startswith("benchseal: error: looking up acme/widget: ConnectionError")
    assert "attempt 1 of 2 failed" in done.stderr and done.stderr.rstrip().endswith("(attempt 2 of 2)")
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _run("publish", str(empty), *argv, env=env)
    assert done.returncode == 1 and done.stderr.strip() == f"benchseal: error: cannot publish {empty}: SHA256SUMS is missing"
