"""The wheel of a ``python`` agent, built from the release commit and checked against the release's version.

``build_wheel`` exports the tree of the exact commit with ``git archive`` (the work tree, its
uncommitted edits and untracked files, never count), builds it offline with this interpreter's pip
and setuptools (``--no-build-isolation --no-index``), and checks that the wheel's METADATA version
equals the release's (PEP 440 equality: ``1.0`` equals ``1.0.0``).

The build is reproducible: the same commit gives the same wheel bytes, so its sha256 (recorded as
SRI) names it. What would vary is pinned: every zip entry's time is ``SOURCE_DATE_EPOCH`` (the
commit's committer time; the wheel writer setuptools vendors honours it), entries are written
sorted, file modes are normalised after the export (0644, 0755 for executables and directories)
and the build runs with umask 022 (modes go into the zip), in a clean environment (no ``PIP_*``,
``PYTHONPATH`` or user configuration: ``pip --isolated``; ``PYTHONHASHSEED=0``). Measured: two
builds of ``examples/hello-agent`` in different temporary directories give one sha256.
"""

from __future__ import annotations

import email.parser
import hashlib
import importlib.metadata
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from pipeline.core.contracts import COMMIT_RE
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.fsutil import atomic_write_bytes, atomic_write_text, name_problem
from pipeline.core.project import sri_of

BUILD_TIMEOUT_SEC = 600
GIT_TIMEOUT_SEC = 120
# Variables that point git somewhere other than ``git -C repo`` says.
_GIT_LOCATION_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                     "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_NAMESPACE")


@dataclass(frozen=True)
class PythonWheel:
    """A built and checked wheel in the output directory."""

    path: Path
    distribution: str  # the METADATA Name, e.g. hello-agent
    version: str  # the METADATA Version
    integrity: str  # SRI sha256 of the file
    sha256: str  # hex of the same digest


def build_wheel(repo: Path, commit: str, project_dir: str, expected_version: str, out_dir: Path) -> PythonWheel:
    """Build the wheel of ``project_dir`` (relative to the repository, ``.`` for its root) at ``commit``.

    ValidationError (exit 2) for a malformed commit, project_dir or version; CheckFailed (exit 1) when
    the commit is not in the repository, the build fails or the wheel's version is not ``expected_version``.
    """
    if not COMMIT_RE.match(commit):
        raise ValidationError("commit", "must be a full 40-character lowercase hex commit SHA", commit)
    subdir = _subdir(project_dir)
    try:
        expected = Version(expected_version)
    except InvalidVersion:
        raise ValidationError("version", "must be a PEP 440 version for a python agent's wheel "
                              "(the tag without its 'v', e.g. v1.2.3 -> 1.2.3)", expected_version) from None
    epoch = _commit_time(repo, commit)
    key = _build_key(commit, subdir)
    cached = _cached(out_dir, key, expected_version)
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory(prefix="benchseal-wheel-") as tmp:
        source = Path(tmp) / "source"
        _export(repo, commit, subdir, source)
        project = source / subdir if subdir else source
        if not (project / "pyproject.toml").is_file() and not (project / "setup.py").is_file():
            raise CheckFailed(f"{project_dir} at commit {commit} has no pyproject.toml or setup.py: no Python package to build")
        built = _pip_wheel(project, Path(tmp) / "wheel", Path(tmp) / "home", epoch)
        distribution, version = _metadata(built)
        try:
            matches = Version(version) == expected
        except InvalidVersion:
            matches = False
        if not matches:
            raise CheckFailed(f"the wheel of {distribution} built from {commit} has version {version}, "
                              f"not the release's {expected_version} (set it in {project_dir}/pyproject.toml)")
        data = built.read_bytes()
        name = built.name
    digest = hashlib.sha256(data)
    path = out_dir / name
    atomic_write_bytes(path, data)
    atomic_write_text(_record_path(out_dir, key), json.dumps({"key": key, "name": name, "sha256": digest.hexdigest()}))
    return PythonWheel(path=path, distribution=distribution, version=version,
                       integrity=sri_of("sha256", digest.digest()), sha256=digest.hexdigest())


def _build_key(commit: str, subdir: str) -> str:
    """What the wheel's bytes are a function of: the commit (its tree and its time), the project's
    directory, this interpreter and its pip and setuptools (the build is reproducible: docstring)."""
    tools = {name: _installed_version(name) for name in ("pip", "setuptools", "wheel")}
    inputs = {"commit": commit, "subdir": subdir, "python": sys.version, "executable": sys.executable, "tools": tools}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode("utf-8")).hexdigest()


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _record_path(out_dir: Path, key: str) -> Path:
    return out_dir / ".built" / f"{key}.json"


def _cached(out_dir: Path, key: str, expected_version: str) -> PythonWheel | None:
    """The wheel an earlier build with the same inputs left in ``out_dir``, when its bytes are still the
    ones recorded and its METADATA still passes the release's checks; None otherwise (build again)."""
    try:
        record = json.loads(_record_path(out_dir, key).read_text("utf-8"))
        name, sha256 = record["name"], record["sha256"]
        if record.get("key") != key or not isinstance(name, str) or name_problem(name) or "/" in name:
            return None
        data = (out_dir / name).read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    digest = hashlib.sha256(data)
    if digest.hexdigest() != sha256:
        return None
    distribution, version = _metadata(out_dir / name)
    try:
        if Version(version) != Version(expected_version):
            return None  # the build's own check then says why
    except InvalidVersion:
        return None
    return PythonWheel(path=out_dir / name, distribution=distribution, version=version,
                       integrity=sri_of("sha256", digest.digest()), sha256=digest.hexdigest())


def _subdir(project_dir: str) -> str:
    """``project_dir`` as a git path: '' for the root ('.'), else a plain relative name."""
    relative = "/".join(part for part in project_dir.split("/") if part != ".")
    if not project_dir or project_dir.startswith("/") or (relative and name_problem(relative)):
        raise ValidationError("project_dir", "must be '.' or a plain relative path inside the repository "
                              "(no '..', no absolute path)", project_dir)
    return relative


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {key: value for key, value in os.environ.items() if key not in _GIT_LOCATION_ENV}
    try:
        return subprocess.run(["git", "-C", str(repo), "-c", "log.showSignature=false", *args],
                              capture_output=True, env=env, timeout=GIT_TIMEOUT_SEC, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CheckFailed(f"git {args[0]} in {repo} did not run: {exc}") from None


def _last_line(output: bytes) -> str:
    lines = [line.strip() for line in output.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _commit_time(repo: Path, commit: str) -> int:
    """The committer time of ``commit``, which must be a commit of ``repo``."""
    found = _git(repo, "cat-file", "-e", f"{commit}^{{commit}}")
    if found.returncode != 0:
        raise CheckFailed(f"commit {commit} is not in the repository {repo} ({_last_line(found.stderr)})")
    shown = _git(repo, "log", "-1", "--format=%ct", commit, "--")
    value = shown.stdout.decode("ascii", "replace").strip()
    if shown.returncode != 0 or not value.isdigit():
        raise CheckFailed(f"commit {commit} in {repo}: no committer time ({_last_line(shown.stderr)})")
    return int(value)


def _export(repo: Path, commit: str, subdir: str, dest: Path) -> None:
    """The files of ``subdir`` at ``commit`` under ``dest`` (same relative paths), modes normalised."""
    archived = _git(repo, "archive", "--format=tar", commit, "--", subdir or ".")
    if archived.returncode != 0:
        raise CheckFailed(f"{subdir or '.'} at commit {commit} cannot be exported ({_last_line(archived.stderr)})")
    dest.mkdir()
    try:
        with tarfile.open(fileobj=io.BytesIO(archived.stdout), mode="r:") as tar:
            tar.extractall(dest, filter="data")  # refuses links and names that leave dest
    except (tarfile.TarError, OSError) as exc:
        raise CheckFailed(f"{subdir or '.'} at commit {commit} cannot be unpacked: {exc}") from None
    for root, _dirs, files in os.walk(dest):
        os.chmod(root, 0o755)  # noqa: S103 -- a build tree's usual mode; modes are recorded in the wheel
        for name in files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                os.chmod(path, 0o755 if mode & 0o111 else 0o644)


def _pip_wheel(project: Path, wheel_dir: Path, home: Path, epoch: int) -> Path:
    """Build ``project``'s wheel offline into ``wheel_dir``; the one .whl it made."""
    home.mkdir()
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "TMPDIR": str(home),
        "SOURCE_DATE_EPOCH": str(epoch),
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
    }
    command = [sys.executable, "-m", "pip", "--isolated", "--no-input", "--disable-pip-version-check",
               "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--no-cache-dir",
               "-w", str(wheel_dir), str(project)]
    try:
        proc = subprocess.run(command, capture_output=True, env=env, cwd=home, umask=0o022,
                              timeout=BUILD_TIMEOUT_SEC, check=False)
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"building the wheel of {project.name} took more than {BUILD_TIMEOUT_SEC} s") from None
    if proc.returncode != 0:
        raise CheckFailed(f"building the wheel failed (pip exit {proc.returncode}): {_last_line(proc.stderr + proc.stdout)}")
    wheels = sorted(wheel_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise CheckFailed(f"building the wheel made {len(wheels)} .whl files, not one")
    return wheels[0]


def _metadata(wheel: Path) -> tuple[str, str]:
    """Name and Version of the wheel's ``*.dist-info/METADATA``."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(names) != 1:
                raise CheckFailed(f"{wheel.name}: has {len(names)} .dist-info/METADATA files, not one")
            raw = archive.read(names[0])
    except (zipfile.BadZipFile, OSError) as exc:
        raise CheckFailed(f"{wheel.name}: not a readable wheel: {exc}") from None
    message = email.parser.BytesHeaderParser().parsebytes(raw)
    name, version = message.get("Name"), message.get("Version")
    if not name or not version:
        raise CheckFailed(f"{wheel.name}: METADATA names no Name and Version")
    return str(name).strip(), str(version).strip()
