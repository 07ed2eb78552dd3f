"""pipeline.agent.wheel: the agent's wheel is built from the commit, reproducibly, and carries the release's version.

Every build here is real (git archive, the isolated build, setuptools) on a throwaway repository holding a copy of
examples/hello-agent under agent/.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from pipeline.agent.wheel import build_wheel
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.project import sri_of

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hello-agent"
COMMIT_TIME = 1_700_000_000  # 2023-11-14T22:13:20Z


def _git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_DATE=f"@{COMMIT_TIME} +0000", GIT_COMMITTER_DATE=f"@{COMMIT_TIME} +0000")
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
                           "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True, env=env).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository with the example under agent/, committed; (its path, the commit)."""
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    shutil.copytree(EXAMPLE, root / "agent", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "hello-agent")
    return root, _git(root, "rev-parse", "HEAD")


def _one_line(exc: pytest.ExceptionInfo[Exception]) -> str:
    text = exc.value.diagnostics() if hasattr(exc.value, "diagnostics") else str(exc.value)
    assert "\n" not in text and "\n" not in str(exc.value)
    return text


def test_two_builds_give_the_same_bytes(repo: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, commit = repo
    started = time.monotonic()
    first = build_wheel(root, commit, "agent", "0.1.0", tmp_path / "out1")
    elapsed = time.monotonic() - started
    time.sleep(1.1)  # a clock that leaked into the zip would now differ
    # Nor does the caller's environment count: its SOURCE_DATE_EPOCH (the commit's time is the one),
    # pip settings, PYTHONPATH, hash seed or umask (modes go into the zip).
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "400000000")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("PYTHONHASHSEED", "12345")
    old_umask = os.umask(0o077)
    try:
        second = build_wheel(root, commit, "./agent", "0.1.0", tmp_path / "out2")
    finally:
        os.umask(old_umask)
    data = first.path.read_bytes()
    assert second.path.read_bytes() == data
    assert first.sha256 == second.sha256 == hashlib.sha256(data).hexdigest()
    assert first.integrity == sri_of("sha256", hashlib.sha256(data).digest())
    assert (first.distribution, first.version) == ("hello-agent", "0.1.0")
    assert first.path == tmp_path / "out1" / "hello_agent-0.1.0-py3-none-any.whl"
    # No temp file left; .built holds the record of the build's inputs (the next test).
    assert sorted(p.name for p in (tmp_path / "out1").iterdir()) == [".built", first.path.name]
    with zipfile.ZipFile(first.path) as wheel:
        infos = wheel.infolist()
        names = [i.filename for i in infos]
        assert "hello_agent/agent.py" in names and "hello_agent-0.1.0.dist-info/RECORD" in names
        assert {i.date_time for i in infos} == {time.gmtime(COMMIT_TIME)[:6]}  # SOURCE_DATE_EPOCH = commit time
        assert wheel.testzip() is None
        record = wheel.read("hello_agent-0.1.0.dist-info/RECORD").decode()
        for line in record.splitlines():  # RECORD names each other file with its hash and size
            name, digest, size = line.rsplit(",", 2)
            if name.endswith("/RECORD"):
                continue
            content = wheel.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
            assert (digest, size) == (f"sha256={expected}", str(len(content)))
    print(f"wheel build: {elapsed:.2f} s, sha256 {first.sha256}")


def test_the_same_inputs_reuse_the_checked_wheel(repo: tuple[Path, str], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A second build of the same commit into the same directory is the recorded wheel, re-hashed and
    re-checked, without building; a changed wheel file, another commit or another version builds (or refuses) again."""
    import pipeline.agent.wheel as wheel_module

    root, commit = repo
    out = tmp_path / "out"
    first = build_wheel(root, commit, "agent", "0.1.0", out)
    real_build = wheel_module._isolated_build
    builds: list[Path] = []

    def counting_build(work: Path, subdir: str, backend: Path, epoch: int) -> tuple[str, bytes]:
        builds.append(work)
        return real_build(work, subdir, backend, epoch)

    monkeypatch.setattr(wheel_module, "_isolated_build", counting_build)
    assert build_wheel(root, commit, "agent", "0.1.0", out) == first and builds == []
    assert build_wheel(root, commit, "agent", "0.1", out).sha256 == first.sha256 and builds == []  # PEP 440 equal
    with pytest.raises(CheckFailed):  # the record does not answer for another version: it builds and refuses it
        build_wheel(root, commit, "agent", "0.2.0", out)
    assert len(builds) == 1
    data = first.path.read_bytes()
    first.path.write_bytes(data + b"tampered")  # not the recorded bytes: built again
    again = build_wheel(root, commit, "agent", "0.1.0", out)
    assert again.path.read_bytes() == data and again.sha256 == first.sha256 and len(builds) == 2
    _git(root, "commit", "-q", "--allow-empty", "-m", "another commit")
    other = build_wheel(root, _git(root, "rev-parse", "HEAD").strip(), "agent", "0.1.0", out)
    assert len(builds) == 3 and other.path == first.path


def test_uncommitted_edits_do_not_count(repo: tuple[Path, str], tmp_path: Path) -> None:
    root, commit = repo
    clean = build_wheel(root, commit, "agent", "0.1.0", tmp_path / "clean")
    agent_py = root / "agent" / "hello_agent" / "agent.py"
    committed = agent_py.read_bytes()
    agent_py.write_text("raise SystemExit('the work tree, not the commit')\n")
    _git(root, "add", "agent/hello_agent/agent.py")  # staged, still not committed
    (root / "agent" / "hello_agent" / "extra.py").write_text("UNTRACKED = True\n")
    pyproject = root / "agent" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "9.9.9"'))
    dirty = build_wheel(root, commit, "agent", "0.1.0", tmp_path / "dirty")
    assert dirty.sha256 == clean.sha256
    with zipfile.ZipFile(dirty.path) as wheel:
        assert wheel.read("hello_agent/agent.py") == committed
        assert "hello_agent/extra.py" not in wheel.namelist()


def test_the_release_version_must_be_the_wheels(repo: tuple[Path, str], tmp_path: Path) -> None:
    root, commit = repo
    with pytest.raises(CheckFailed) as exc:
        build_wheel(root, commit, "agent", "0.2.0", tmp_path / "out")
    message = _one_line(exc)
    assert "0.1.0" in message and "0.2.0" in message and commit in message
    assert exc.value.exit_code == 1
    assert not (tmp_path / "out").exists()
    # PEP 440 equality, not string equality: tag v0.1 releases the wheel of 0.1.0.
    assert build_wheel(root, commit, "agent", "0.1", tmp_path / "out").version == "0.1.0"


def test_a_version_pep_440_cannot_carry_is_refused(repo: tuple[Path, str], tmp_path: Path) -> None:
    root, commit = repo
    with pytest.raises(ValidationError) as exc:
        build_wheel(root, commit, "agent", "0.0.0-demo", tmp_path / "out")
    assert "0.0.0-demo" in _one_line(exc) and exc.value.exit_code == 2


@pytest.mark.parametrize("project_dir", ["..", "../agent", "agent/../..", "/agent", "", "agent//x", "agent/", "a\\b"])
def test_a_project_dir_outside_the_repository_is_refused(tmp_path: Path, project_dir: str) -> None:
    # Refused before git runs: the repository need not even exist.
    with pytest.raises(ValidationError) as exc:
        build_wheel(tmp_path / "nowhere", "a" * 40, project_dir, "0.1.0", tmp_path / "out")
    assert exc.value.field == "project_dir" and exc.value.exit_code == 2
    _one_line(exc)


@pytest.mark.parametrize("commit", ["HEAD", "abc1234", "A" * 40, "a" * 39, "a" * 40 + "\n"])
def test_a_malformed_commit_is_refused(tmp_path: Path, commit: str) -> None:
    with pytest.raises(ValidationError) as exc:
        build_wheel(tmp_path, commit, "agent", "0.1.0", tmp_path / "out")
    assert exc.value.field == "commit"
    _one_line(exc)


def test_a_commit_not_in_the_repository_is_refused(repo: tuple[Path, str], tmp_path: Path) -> None:
    root, commit = repo
    unknown = "0123456789abcdef" * 2 + "01234567"
    with pytest.raises(CheckFailed) as exc:
        build_wheel(root, unknown, "agent", "0.1.0", tmp_path / "out")
    assert unknown in _one_line(exc)
    tree = _git(root, "rev-parse", "HEAD^{tree}")  # an object of the repository, but no commit
    with pytest.raises(CheckFailed) as exc:
        build_wheel(root, tree, "agent", "0.1.0", tmp_path / "out")
    _one_line(exc)
    with pytest.raises(CheckFailed) as exc:  # no repository at all
        build_wheel(tmp_path / "not-a-repo", commit, "agent", "0.1.0", tmp_path / "out")
    _one_line(exc)


def test_a_project_dir_the_commit_lacks_is_refused(repo: tuple[Path, str], tmp_path: Path) -> None:
    root, commit = repo
    with pytest.raises(CheckFailed) as exc:
        build_wheel(root, commit, "elsewhere", "0.1.0", tmp_path / "out")
    assert "elsewhere" in _one_line(exc)
    with pytest.raises(CheckFailed) as exc:  # the repository's root holds no Python package
        build_wheel(root, commit, ".", "0.1.0", tmp_path / "out")
    assert "pyproject.toml" in _one_line(exc)
