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
        (["publish", str(art), "--tag", "v1.0.0", "--target", "github"], "--repo OWNER/NAME"),
        (["publish", str(art), "--tag", "v1.0.0", "--target", "s3"], "must be local or github"),
        (["release", "v1.0.0"], "only --local"),
        (["release", "1.0", "--local"], "must look like vX.Y.Z"),
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
