"""Issue 38.2: ``benchseal release TAG --local`` in an adopter's own git checkout refuses, before anything is
built or started, each mistake it can see in the repository and the policy: one line, exit 2, no traceback,
within seconds (pipeline/local/precheck.py). The repository's name is stated, with where it came from.

The adopter is a copy of examples/hello-agent (and of examples/qwen-code for npm) in a git checkout of its
own whose origin is newcomer/widget, which the local world's policy admits (pipeline/local/admission.py). "Before anything":
the release's state directory (made by the first stage), the private Sigstore instance's directory and
the dist directory do not exist afterwards, and no stage line ("Building ...") was printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.cli.app import run
from pipeline.cli.main import app
from pipeline.core.errors import UsageError, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.core.project import load_project
from pipeline.infra.intake.policy import ReleaseAgentPolicy, load_policy
from pipeline.local import precheck, sources

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
KEY_ENV = "BENCHSEAL_AGENT_API_KEY"
_GIT_ID = ["-c", "user.name=adopter", "-c", "user.email=adopter@example.invalid", "-c", "commit.gpgsign=false"]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *_GIT_ID, *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def _adopter(tmp_path: Path, example: str = "hello-agent", origin: str | None = "https://github.com/newcomer/widget.git",
             name: str = "widget") -> Path:
    repo = tmp_path / name
    shutil.copytree(REPO_ROOT / "examples" / example, repo,
                    ignore=shutil.ignore_patterns("__pycache__", ".github"))
    _git(repo, "init", "-q", "-b", "main")
    if origin is not None:
        _git(repo, "remote", "add", "origin", origin)
    _commit(repo, "the agent")
    return repo


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _env(home: Path, key: bool) -> dict[str, str]:
    """No model key unless asked: a check that went missing then still stops at the key check, in seconds,
    with another message (never a build)."""
    env = {k: v for k, v in os.environ.items() if k not in (KEY_ENV, "GITHUB_REPOSITORY", "BENCHSEAL_PROJECT_DIR")}
    env.update(BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0")
    if key:
        env[KEY_ENV] = "test-key-never-used"
    return env


def _release_process(repo: Path, tag: str, home: Path, *extra: str, key: bool = False) -> Done:
    """The installed command in a process of its own, from the adopter's checkout, without --project."""
    done = subprocess.run([BENCHSEAL, "release", tag, "--local", "--dist", str(home / "dist"), *extra], cwd=repo,
                          capture_output=True, text=True, env=_env(home, key), check=False, timeout=120)
    return Done(done.returncode, done.stdout, done.stderr)


@pytest.fixture()
def release(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Done]:
    """The same command in this process (``pipeline.cli.app.run`` of the installed app, as the entry point
    runs it): seconds saved per case; the first test runs the real process too."""

    def invoke(repo: Path, tag: str, home: Path, *extra: str, key: bool = False) -> Done:
        capsys.readouterr()
        with monkeypatch.context() as patched:
            for name in (KEY_ENV, "GITHUB_REPOSITORY", "BENCHSEAL_PROJECT_DIR"):
                patched.delenv(name, raising=False)
            for name, value in _env(home, key).items():
                patched.setenv(name, value)
            patched.chdir(repo)
            patched.setattr("sys.argv", ["benchseal", "release", tag, "--local", "--dist", str(home / "dist"), *extra])
            with pytest.raises(SystemExit) as ended:
                run(app)
        out, err = capsys.readouterr()
        return Done(ended.value.code if isinstance(ended.value.code, int) else 1, out, err)

    return invoke


def _refused(done: Done, home: Path, *expected: str) -> str:
    """The one error line of a refusal before anything ran; the stated repository line is the only other."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("benchseal: error: ")]
    others = [line for line in done.stderr.splitlines() if not line.startswith("benchseal: error: ")]
    assert len(errors) == 1, done.stderr
    # no stage ran ("Building ..."): only the stated repository and what the local policy added to admit it
    assert all(line.startswith(("Releasing ", "Local infra policy (")) for line in others), done.stderr
    assert "Building" not in done.stderr
    for part in expected:
        assert part in errors[0], errors[0]
    # Nothing was made: the release's state dir (the first stage's), the Sigstore instance, the dist dir.
    assert not (home / "release").is_dir() and not (home / "sigstore").exists() and not (home / "dist").exists()
    return errors[0]


def _tripwire(home: Path) -> None:
    """A file where the first stage makes its directory: a release that got past every check (the key given) stops
    there (exit 1, another message) before it could start or build anything."""
    home.mkdir(exist_ok=True)
    (home / "release").write_text("tripwire\n")


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.mark.slow  # the installed command in a process of its own: 2-6 s on a busy 2-core machine
def test_a_missing_tag_is_reported_missing_not_as_a_version_mismatch(tmp_path: Path, home: Path) -> None:
    repo = _adopter(tmp_path)
    started = time.monotonic()
    done = _release_process(repo, "v0.1.0", home)
    line = _refused(done, home, "tag v0.1.0 does not exist in", "git tag v0.1.0")
    assert "version" not in line
    assert time.monotonic() - started < 30
    # The repository is stated, with where its name came from.
    assert "Releasing newcomer/widget v0.1.0 (repository name from git remote origin)" in done.stderr
    # A tag of a version the package does not carry, also missing: still reported as missing.
    with pytest.raises(UsageError, match=re.escape("tag v7.0.0 does not exist")):
        precheck.check_project(repo / "benchseal.toml", load_project(repo / "benchseal.toml"), "v7.0.0",
                               adopter_checkout=repo.resolve())


def test_a_tag_on_another_commit_is_refused(tmp_path: Path, home: Path,
                                            release: Callable[..., Done]) -> None:
    repo = _adopter(tmp_path)
    tagged = _git(repo, "rev-parse", "HEAD")
    _git(repo, "tag", "v0.1.0")
    head = _commit(repo, "after the tag")
    _refused(release(repo, "v0.1.0", home), home, f"tag v0.1.0 names commit {tagged[:12]}",
             f"HEAD of {repo.resolve()} is {head[:12]}")
    # An annotated tag is followed to its commit.
    _git(repo, "tag", "-a", "-m", "release", "v0.1.1", tagged)
    with pytest.raises(UsageError, match=re.escape(f"tag v0.1.1 names commit {tagged[:12]}")):
        precheck.check_tag(repo.resolve(), "v0.1.1")


def test_a_package_version_other_than_the_tags_is_refused(tmp_path: Path, home: Path,
                                                          release: Callable[..., Done]) -> None:
    repo = _adopter(tmp_path)
    _git(repo, "tag", "v0.2.0")
    _refused(release(repo, "v0.2.0", home), home, "pyproject.toml: project.version: must be 0.2.0",
             "tag v0.2.0", "(got '0.1.0')")


def test_an_npm_package_json_with_another_version_is_refused(tmp_path: Path, home: Path,
                                                             release: Callable[..., Done]) -> None:
    repo = _adopter(tmp_path, "qwen-code")
    (repo / "package.json").write_text(json.dumps({"name": "@qwen-code/qwen-code", "version": "0.24.3"}))
    _commit(repo, "the package")
    _git(repo, "tag", "v0.24.4")
    _refused(release(repo, "v0.24.4", home), home, "package.json: version: must be 0.24.4", "(got '0.24.3')")


def test_a_repository_an_explicit_policy_does_not_admit_is_refused_and_named(tmp_path: Path, home: Path,
                                                                              release: Callable[..., Done]) -> None:
    """``--policy FILE`` is taken as it is (the adopter rehearses its infra's own policy): nothing is admitted."""
    name = "my-agent-with-a-long-directory-name"  # the stated line is longer than a terminal: one line still
    repo = _adopter(tmp_path, origin=None, name=name)
    _git(repo, "tag", "v0.1.0")
    shipped = REPO_ROOT / "policies" / "infra.yaml"
    done = release(repo, "v0.1.0", home, "--policy", str(shipped))
    _refused(done, home, f"repository local/{name} (from the directory's name) is not a source of {shipped}")
    assert f"Releasing local/{name} v0.1.0 (repository name from the directory's name)" in done.stderr.splitlines()
    assert "Local infra policy" not in done.stderr
    policy = load_policy()
    with pytest.raises(UsageError, match=r"repository acme/unlisted \(from --repository\) is not a source"):
        precheck.check_admitted(policy, "acme/unlisted", "--repository", "hello-agent", "smoke", "agent.name")
    # Admitted as a source, but its agent is admitted for other repositories only.
    with pytest.raises(UsageError, match=r"agent hello-agent is admitted by the infra policy for .*not local/bench"):
        precheck.check_admitted(policy, "local/benchseal", "--repository", "hello-agent", "smoke", "agent.name")


def test_an_import_path_the_package_does_not_hold_is_refused(tmp_path: Path, home: Path,
                                                             release: Callable[..., Done]) -> None:
    repo = _adopter(tmp_path)
    project = repo / "benchseal.toml"
    text = project.read_text()
    project.write_text(text.replace("hello_agent.agent:HelloAgent", "hello_agent.agents:HelloAgent"))
    _commit(repo, "a typo in the module")
    _git(repo, "tag", "v0.1.0")
    _refused(release(repo, "v0.1.0", home), home, "benchseal.toml: agent.import_path: module hello_agent.agents "
             "is not in the release's tree", "hello_agent/agents.py")
    project.write_text(text.replace("hello_agent.agent:HelloAgent", "hello_agent.agent:HelloAgnet"))
    _commit(repo, "a typo in the class")
    _git(repo, "tag", "-f", "v0.1.0")
    with pytest.raises(UsageError, match=re.escape("hello_agent/agent.py defines no HelloAgnet at its top level")):
        precheck.check_project(project, load_project(project), "v0.1.0", adopter_checkout=repo.resolve())


def test_the_model_key_or_the_scripted_model_is_required(tmp_path: Path, home: Path,
                                                         release: Callable[..., Done]) -> None:
    repo = _adopter(tmp_path)
    _git(repo, "tag", "v0.1.0")
    # Every other check passes; a tripwire where the first stage makes its directory stops a release that
    # got past the key check (exit 1, another message) before it could build.
    home.mkdir()
    (home / "release").write_text("tripwire\n")
    _refused(release(repo, "v0.1.0", home), home, f"set {KEY_ENV}, or pass --scripted-model")


def test_the_checks_read_the_commit_never_the_work_tree(tmp_path: Path) -> None:
    """What the build takes is the tagged commit: a fix only in the work tree does not pass, and a good
    commit passes every check of pipeline.local.precheck (in process: nothing is built here)."""
    repo = _adopter(tmp_path)
    _git(repo, "tag", "v0.1.0")
    project = repo / "benchseal.toml"
    good = load_project(project)
    precheck.check_project(project, good, "v0.1.0", adopter_checkout=repo.resolve())
    precheck.check_admitted(load_policy(), "benchseal-examples/hello-agent", "an example", "hello-agent", "smoke", "agent.name")
    (repo / "hello_agent" / "agent.py").unlink()  # removed in the work tree only: the commit still has it
    precheck.check_project(project, good, "v0.1.0", adopter_checkout=repo.resolve())
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.2.0"'))
    with pytest.raises(UsageError, match=re.escape("tag v0.2.0 does not exist")):
        precheck.check_project(project, good, "v0.2.0", adopter_checkout=repo.resolve())
    _git(repo, "tag", "v0.2.0")  # on the commit whose pyproject still says 0.1.0
    with pytest.raises(UsageError, match=re.escape("must be 0.2.0")):
        precheck.check_project(project, good, "v0.2.0", adopter_checkout=repo.resolve())


@pytest.mark.parametrize(("url", "expected"), [
    ("https://github.com/acme/widget.git", "acme/widget"),
    ("https://github.com/acme/widget", "acme/widget"),
    ("git@github.com:Acme/my.agent.git", "Acme/my.agent"),
    ("ssh://git@github.com/acme/widget.git", "acme/widget"),
    ("/srv/git/widget.git", None),
    ("https://gitlab.example/group/sub/widget.git", None),
    ("", None),
])
def test_the_repository_name_from_a_git_remote(url: str, expected: str | None) -> None:
    assert sources.remote_repository(url) == expected


def test_the_repository_name_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    repo = _adopter(tmp_path, origin="git@github.com:acme/widget.git", name="Some Dir")
    project = repo / "benchseal.toml"
    assert sources.release_repository_origin(project) == ("acme/widget", "git remote origin")
    assert sources.release_repository_origin(project, "acme/other") == ("acme/other", "--repository")
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/from-env")
    assert sources.release_repository_origin(project) == ("acme/from-env", "$GITHUB_REPOSITORY")
    monkeypatch.delenv("GITHUB_REPOSITORY")
    _git(repo, "remote", "remove", "origin")
    assert sources.release_repository_origin(project) == ("local/Some-Dir", "the directory's name")
    # An example's name and benchseal's own are fixed: --repository names an adopter's checkout only.
    with pytest.raises(UsageError, match="--repository: names the repository of a --project"):
        sources.release_repository_origin(REPO_ROOT / "examples" / "hello-agent" / "benchseal.toml", "acme/x")
    with pytest.raises(UsageError, match="--repository"):
        sources.release_repository_origin(None, "acme/x")


def test_an_agent_the_policy_does_not_know_is_named_by_the_project_file(tmp_path: Path, home: Path,
                                                                        release: Callable[..., Done]) -> None:
    """The refusal names the key the user wrote (benchseal.toml's agent.name), never an --agent not passed."""
    repo = _adopter(tmp_path, origin="https://github.com/benchseal-examples/hello-agent.git")  # a listed source
    project = repo / "benchseal.toml"
    project.write_text(project.read_text().replace('name = "hello-agent"', 'name = "widget-agent"'))
    _commit(repo, "our own agent's name")
    _git(repo, "tag", "v0.1.0")
    line = _refused(release(repo, "v0.1.0", home, "--policy", str(REPO_ROOT / "policies" / "infra.yaml")), home,
                    "invalid benchseal.toml: agent.name: agent not allowed by policy", "(got 'widget-agent')")
    assert "--agent" not in line


def test_an_adopter_repository_is_admitted_by_the_local_policy_with_nothing_copied(
        tmp_path: Path, home: Path, release: Callable[..., Done]) -> None:
    """Without --policy, the local world admits the checkout's own repository and benchseal.toml's agent (issue
    38.2): stated line by line, under the embedded policy plus those two entries, which is written where the
    release report points; production's policy is not changed by it."""
    from pipeline.imaging.names import resolve_image_names
    from pipeline.local.admission import POLICY_FILE, admit_adopter

    repo = _adopter(tmp_path, origin=None, name="newcomer")
    project = repo / "benchseal.toml"
    project.write_text(project.read_text().replace('name = "hello-agent"', 'name = "widget-agent"'))
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('name = "hello-agent"', 'name = "widget-dist"'))
    commit = _commit(repo, "our own agent")
    _git(repo, "tag", "v0.1.0")
    # Every check passes up to the model key (this agent is model-backed): admitted, not refused as unlisted.
    done = release(repo, "v0.1.0", home)
    _refused(done, home, f"set {KEY_ENV}, or pass --scripted-model")
    stated = [line for line in done.stderr.splitlines() if line.startswith("Local infra policy (")]
    assert len(stated) == 2, done.stderr
    assert stated[0].endswith("added sources: local/newcomer (from the directory's name), images "
                              "127.0.0.1:5055/benchseal/runner and 127.0.0.1:5055/benchseal/api signed by "
                              "local/benchseal/.github/workflows/release.yml@refs/heads/main"), stated
    assert stated[1].endswith("added agents: widget-agent (python package widget-dist, from benchseal.toml's agent) "
                              "for local/newcomer, model-backed"), stated

    admission = admit_adopter("local/newcomer", "the directory's name", project, load_project(project), repo.resolve(),
                              commit, resolve_image_names())
    entry, model = admission.policy.agent("widget-agent", "smoke")
    assert isinstance(entry, ReleaseAgentPolicy) and model is not None
    assert entry.package == "widget-dist"  # the wheel's distribution name
    assert admission.policy.source("local/newcomer").repository == "local/newcomer"
    # The written document is the policy the run uses, loaded as any policy file is.
    written = admission.write(tmp_path)
    assert written.name == POLICY_FILE and load_policy(written) == admission.policy
    assert admission.to_json_dict(written)["sha256"] == admission.sha256
    # The embedded policy itself admits neither (production admission is not loosened).
    with pytest.raises(ValidationError, match="not allowed by the infra policy"):
        load_policy().source("local/newcomer")
    with pytest.raises(ValidationError, match="agent not allowed by policy"):
        load_policy().agent("widget-agent", "smoke")


def test_an_agent_name_the_policy_gives_another_agent_is_refused(tmp_path: Path, home: Path,
                                                                 release: Callable[..., Done]) -> None:
    """The local policy adds to an entry of the same kind and package only; another agent's name is never taken over."""
    repo = _adopter(tmp_path, origin=None, name="newcomer")
    project = repo / "benchseal.toml"
    project.write_text(project.read_text().replace('name = "hello-agent"', 'name = "terminus-2"'))
    _commit(repo, "a name Harbor's agent has")
    _git(repo, "tag", "v0.1.0")
    _tripwire(home)
    _refused(release(repo, "v0.1.0", home, key=True), home,
             "benchseal.toml: agent.name terminus-2 is the infra policy's name for another agent",
             "give your agent a name of its own")


def test_an_npm_agent_the_release_cannot_resolve_is_refused_before_the_build(
        tmp_path: Path, home: Path, release: Callable[..., Done], monkeypatch: pytest.MonkeyPatch) -> None:
    """No registry holds the version: refused in one line, never a wait (a rehearsal does not wait for a publish)."""
    monkeypatch.delenv("BENCHSEAL_NPM_REGISTRY", raising=False)
    repo = _adopter(tmp_path, "qwen-code", origin=None, name="cli-agent")
    _git(repo, "tag", "v0.24.4")
    _tripwire(home)
    # The local registry: neither running in this home nor fed from its cache.
    done = release(repo, "v0.24.4", home, key=True)
    _refused(done, home, "npm: @qwen-code/qwen-code@0.24.4 is not in the local npm registry",
             "set $BENCHSEAL_NPM_REGISTRY")
    assert "added agents: qwen-code (npm package @qwen-code/qwen-code) also for local/cli-agent" in done.stderr
    # A configured registry that does not answer.
    monkeypatch.setenv("BENCHSEAL_NPM_REGISTRY", "http://127.0.0.1:9/")
    _refused(release(repo, "v0.24.4", home, key=True), home,
             "npm: http://127.0.0.1:9/ does not answer (", "($BENCHSEAL_NPM_REGISTRY; a private registry's read token: "
             "$BENCHSEAL_NPM_TOKEN)")


def test_a_checkout_without_a_commit_is_told_to_commit(tmp_path: Path, home: Path,
                                                       release: Callable[..., Done]) -> None:
    """A newcomer's first try: ``git init``, files written, nothing committed yet: one line saying what to do."""
    repo = tmp_path / "fresh"
    shutil.copytree(REPO_ROOT / "examples" / "hello-agent", repo, ignore=shutil.ignore_patterns("__pycache__", ".github"))
    _git(repo, "init", "-q", "-b", "main")
    _refused(release(repo, "v0.1.0", home, key=True), home, f"{repo.resolve()} has no commit: commit the agent, "
             "tag that commit v0.1.0, then release")


def test_a_source_whose_signers_the_local_builder_is_not_among_is_refused(tmp_path: Path, home: Path,
                                                                         release: Callable[..., Done]) -> None:
    """acme/widget is listed for the GitHub emulator, signed by its own tag.yml: the local chain's images (signed by
    the local builder) would be refused by the worker after the build; refused before it, naming the fix."""
    repo = _adopter(tmp_path, origin="https://github.com/acme/widget.git")
    _git(repo, "tag", "v0.1.0")
    _tripwire(home)
    _refused(release(repo, "v0.1.0", home, key=True), home,
             "repository acme/widget's sources entry in the infra policy admits images signed by tag.yml@tag only",
             "release --local signs them as local/benchseal/.github/workflows/release.yml@refs/heads/main at the tag")
