"""Issue 38.1: ``benchseal init`` in an adopter's git checkout writes benchseal.toml (a Python or an npm agent,
detected) and .github/workflows/benchseal.yml pinned to benchseal's 40-hex commit, and prints what to set on
GitHub; it overwrites nothing without --force and refuses, in one line (exit 2), what it cannot do.
Run as the installed command runs (``pipeline.cli.app.run`` of the installed app) in this process."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline.cli.init import CALLER_WORKFLOW, PLACEHOLDER_COMMIT, WORKFLOW_PATH
from pipeline.core.paths import REPO_ROOT
from pipeline.core.project import NpmAgent, PythonAgent, load_project
from pipeline.local import precheck
from tests.fixtures.cli import run_benchseal

_GIT_ID = ["-c", "user.name=adopter", "-c", "user.email=adopter@example.invalid", "-c", "commit.gpgsign=false"]
HEX40 = re.compile(r"\A[0-9a-f]{40}\Z")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *_GIT_ID, *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def _checkout(path: Path, origin: str | None = "https://github.com/Acme/Widget.git") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q", "-b", "main")
    if origin is not None:
        _git(path, "remote", "add", "origin", origin)
    return path


def _python_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "widget"
    shutil.copytree(REPO_ROOT / "examples" / "hello-agent", repo,
                    ignore=shutil.ignore_patterns("__pycache__", ".github", "benchseal.toml"))
    return _checkout(repo)


def _init(where: Path, *args: str, monkeypatch: pytest.MonkeyPatch,
          capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return run_benchseal(where, "init", *args, monkeypatch=monkeypatch, capsys=capsys)


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("benchseal: error: init: "), err
    return lines[0]


def _pinned(repo: Path) -> str:
    workflow = yaml.safe_load((repo / WORKFLOW_PATH).read_text())
    uses = workflow["jobs"]["release"]["uses"]
    assert uses.startswith("benchseal/benchseal/.github/workflows/release.yml@")
    commit = uses.rpartition("@")[2]
    assert HEX40.match(commit), uses
    return str(commit)


def test_a_python_package_gets_a_project_file_that_loads_and_a_pinned_workflow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    repo = _python_repo(tmp_path)
    code, out, err = _init(repo, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    project = load_project(repo / "benchseal.toml")  # the loader every release uses
    assert isinstance(project.agent, PythonAgent)
    assert (project.agent.name, project.agent.path) == ("hello-agent", ".")
    assert project.agent.import_path == "hello_agent.agent:HelloAgent"  # found by reading, not importing
    # Pinned to the commit of the benchseal this runs from (its checkout's HEAD).
    assert _pinned(repo) == _git(REPO_ROOT, "rev-parse", "HEAD")
    # What to set on GitHub, one list, for the repository the remote names.
    items = [line for line in out.splitlines() if line.startswith("  - ")]
    assert any("variable BENCHSEAL_INFRA_REPOSITORY" in i for i in items)
    assert any("variable BENCHSEAL_IMAGE_PREFIX = ghcr.io/acme/widget-" in i for i in items)
    assert any("secret BENCHSEAL_INFRA_DISPATCH_TOKEN" in i for i in items)
    assert any("sources entry Acme/Widget" in i and "name: hello-agent, kind: python" in i for i in items)
    # Committed and tagged as the output says, the release's pre-build checks pass on it.
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "benchseal")
    _git(repo, "tag", "v0.1.0")
    precheck.check_project(repo / "benchseal.toml", project, "v0.1.0", adopter_checkout=repo.resolve())


def test_an_npm_package_gets_an_npm_project_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    repo = _checkout(tmp_path / "cli", origin="git@github.com:acme/cli.git")
    (repo / "package.json").write_text(json.dumps({"name": "@acme/coder-cli", "version": "1.2.3",
                                                   "bin": {"coder-cli": "./dist/cli.js", "other": "x.js"}}))
    code, out, err = _init(repo, "--benchseal-commit", "a" * 40, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    agent = load_project(repo / "benchseal.toml").agent
    assert isinstance(agent, NpmAgent)
    assert (agent.name, agent.package, agent.bin) == ("coder-cli", "@acme/coder-cli", "dist/cli.js")
    assert "{instruction}" in agent.args and agent.env["OPENAI_API_KEY"] == "{model_key}"
    assert _pinned(repo) == "a" * 40
    assert "check [agent].args" in out and "ghcr.io/acme/cli-" in out


def test_existing_files_are_not_overwritten_without_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    repo = _python_repo(tmp_path)
    (repo / "benchseal.toml").write_text("# mine\n")
    code, out, err = _init(repo, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and out == ""
    assert "benchseal.toml already exists" in _one_line(err) and "--force" in err
    assert (repo / "benchseal.toml").read_text() == "# mine\n" and not (repo / WORKFLOW_PATH).exists()
    code, _, err = _init(repo, "--force", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert load_project(repo / "benchseal.toml").agent.name == "hello-agent"
    # The workflow alone is also kept.
    (repo / "benchseal.toml").unlink()
    (repo / WORKFLOW_PATH).write_text("# mine\n")
    code, _, err = _init(repo, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and f"{WORKFLOW_PATH} already exists" in _one_line(err)
    assert (repo / WORKFLOW_PATH).read_text() == "# mine\n" and not (repo / "benchseal.toml").exists()


def test_nothing_to_detect_names_what_was_looked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    repo = _checkout(tmp_path / "empty")
    (repo / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")  # no [project]: not a package
    code, out, err = _init(repo, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and out == ""
    line = _one_line(err)
    assert "found no agent package" in line and "pyproject.toml with [project] name and version" in line
    assert "package.json with name and version" in line
    assert not (repo / "benchseal.toml").exists() and not (repo / ".github").exists()


def test_two_packages_need_a_kind_and_a_directory_must_be_a_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    repo = _python_repo(tmp_path)
    (repo / "package.json").write_text(json.dumps({"name": "widget-cli", "version": "0.1.0", "bin": "cli.js"}))
    code, _, err = _init(repo, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and "pass --kind python or --kind npm" in _one_line(err)
    code, _, err = _init(repo, "--kind", "npm", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert load_project(repo / "benchseal.toml").agent.kind == "npm"
    plain = tmp_path / "plain"
    plain.mkdir()
    code, _, err = _init(plain, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and "is not the top of a git checkout" in _one_line(err)


def test_the_pin_is_a_commit_never_a_branch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    repo = _python_repo(tmp_path)
    code, _, err = _init(repo, "--benchseal-commit", "main", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and "--benchseal-commit: must be a 40-hex commit" in err and len(err.splitlines()) == 1
    assert not (repo / "benchseal.toml").exists()


def test_the_written_workflow_is_the_example_caller() -> None:
    """One caller workflow: what init writes is examples/hello-agent's (which tests/workflows run), pinned."""
    example = REPO_ROOT / "examples" / "hello-agent" / ".github" / "workflows" / "release.yml"
    assert CALLER_WORKFLOW == example.read_text(encoding="utf-8")
    assert CALLER_WORKFLOW.count(PLACEHOLDER_COMMIT) == 1
