"""The wheel of a ``python`` agent, built from the release commit and checked against the release's version.

``build_wheel`` exports the tree of the exact commit with ``git archive`` (the work tree, its
uncommitted edits and untracked files, never count), builds it offline in an isolated build and
checks, on benchseal's side, that the wheel's METADATA version equals the release's (PEP 440
equality: ``1.0`` equals ``1.0.0``).

The adopter's build code (``setup.py``, a build backend's hooks) runs isolated from benchseal's
privileges (``_isolated_build``): as the dedicated unprivileged user ``benchseal-build`` (no
groups, no capabilities, no new privileges), in network, mount, PID, IPC and UTS namespaces of its
own (loopback only, down), with an environment of fixed values only (no token, no secret, no
registry credential, no ``DOCKER_CONFIG``), a private ``/tmp``, ``/root``, ``/home`` and state home
hidden, on the base interpreter without any site-packages and with the build backend installed from
``images/agent-build.lock`` (wheels checked by sha256), never benchseal's environment. It can write
only its copy of the source, its HOME and its output directory. Root sets this up (``unshare``,
then ``setpriv``); a caller that is not root goes through ``sudo -n`` (GitHub's runners).

The build is reproducible: the same commit gives the same wheel bytes, so its sha256 (recorded as
SRI) names it. What would vary is pinned: every zip entry's time is ``SOURCE_DATE_EPOCH`` (the
commit's committer time; the wheel writer setuptools vendors honours it), entries are written
sorted, file modes are normalised after the export (0644, 0755 for executables and directories)
and the build runs with umask 022 (modes go into the zip), at fixed paths, with
``PYTHONHASHSEED=0``. Measured: two builds of ``examples/hello-agent`` in different temporary
directories give one sha256.
"""

from __future__ import annotations

import email.parser
import fcntl
import hashlib
import io
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from installer import install as run_install
from installer.destinations import SchemeDictionaryDestination
from installer.sources import WheelFile
from packaging.version import InvalidVersion, Version

from pipeline.core import paths
from pipeline.core.contracts import COMMIT_RE
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.core.fsutil import atomic_write_bytes, atomic_write_text, name_problem
from pipeline.core.project import sri_of

BUILD_TIMEOUT_SEC = 600
BUILD_USER = "benchseal-build"  # the dedicated unprivileged user the adopter's build code runs as
BACKEND_LOCK = paths.REPO_ROOT / "images" / "agent-build.lock"
# Where the build sees its files, inside its own mount namespace (fixed: the wheel cannot vary with it).
JAIL = "/run/benchseal-build"
ISOLATION = "1"  # bump when the isolated build changes what it produces (part of the reuse key)
_LOCK_LINE = re.compile(r"\A([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s+--hash=sha256:([0-9a-f]{64})\Z")
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
    backend, backend_hash = _backend()
    key = _build_key(commit, subdir, backend_hash)
    cached = _cached(out_dir, key, expected_version)
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory(prefix="benchseal-wheel-") as tmp:
        source = Path(tmp) / "source"
        _export(repo, commit, subdir, source)
        project = source / subdir if subdir else source
        if not (project / "pyproject.toml").is_file() and not (project / "setup.py").is_file():
            raise CheckFailed(f"{project_dir} at commit {commit} has no pyproject.toml or setup.py: no Python package to build")
        name, data = _isolated_build(Path(tmp), subdir, backend, epoch)
        distribution, version = _metadata_of(name, data)
        try:
            matches = Version(version) == expected
        except InvalidVersion:
            matches = False
        if not matches:
            raise CheckFailed(f"the wheel of {distribution} built from {commit} has version {version}, "
                              f"not the release's {expected_version} (set it in {project_dir}/pyproject.toml)")
    digest = hashlib.sha256(data)
    path = out_dir / name
    atomic_write_bytes(path, data)
    atomic_write_text(_record_path(out_dir, key), json.dumps({"key": key, "name": name, "sha256": digest.hexdigest()}))
    return PythonWheel(path=path, distribution=distribution, version=version,
                       integrity=sri_of("sha256", digest.digest()), sha256=digest.hexdigest())


def _build_key(commit: str, subdir: str, backend_hash: str) -> str:
    """What the wheel's bytes are a function of: the commit (its tree and its time), the project's
    directory, the base interpreter the build runs on, the backend's lock and the isolated build
    itself (the build is reproducible: docstring)."""
    inputs = {"commit": commit, "subdir": subdir, "python": sys.version, "executable": _base_python()[1],
              "backend": backend_hash, "isolation": ISOLATION}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode("utf-8")).hexdigest()


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
    distribution, version = _metadata_of(name, data)
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


# What the isolated build runs as root, in mount, network, PID, IPC and UTS namespaces of its own (this
# shell is PID 1 there): the work dir at JAIL, the interpreter and the backend read-only, a private /tmp,
# the caller's homes and benchseal's state home hidden, then the build command as BUILD_USER without
# groups, capabilities or a way back to privileges. Every value is a positional parameter, never text of
# the script. Exit 125: the isolation itself could not be set up.
_JAIL_SCRIPT = r"""
fail() { echo "isolation: $*" >&2; exit 125; }
work=$1 prefix=$2 backend=$3 uid=$4 gid=$5 caller=$6 limit=$7 jail=$8
shift 8
umask 022
mkdir -p "$jail" || fail "mkdir $jail"
mount --bind "$work" "$jail" || fail "bind $work"
mount --bind "$prefix" "$jail/python" && mount -o remount,bind,ro "$jail/python" || fail "bind $prefix"
mount --bind "$backend" "$jail/backend" && mount -o remount,bind,ro "$jail/backend" || fail "bind $backend"
chown -R "$uid:$gid" "$jail/source" "$jail/out" "$jail/home" || fail "chown"
for dir in /tmp /var/tmp /dev/shm; do
  if [ -d "$dir" ]; then mount -t tmpfs -o mode=1777,nosuid,nodev,size=256m tmpfs "$dir" || fail "tmpfs $dir"; fi
done
while [ "$1" != -- ]; do
  if [ -d "$1" ]; then mount -t tmpfs -o mode=0755,nosuid,nodev,size=1m tmpfs "$1" || fail "hide $1"; fi
  shift
done
shift
# The interpreter again at its own path (its runpath names it), read-only, where a hidden dir held it.
mkdir -p "$prefix" && mount --bind "$jail/python" "$prefix" || fail "rebind $prefix"
timeout --signal=KILL "$limit" setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs \
  --inh-caps=-all --bounding-set=-all -- "$@"
status=$?
kill -KILL -1 2>/dev/null  # anything the build left running
if [ "$caller" != 0 ]; then chown -R -P "$caller" "$jail/source" "$jail/out" "$jail/home"; fi
exit "$status"
"""

# The PEP 517 frontend inside the isolated build (no pip): the project's build-system table, its
# backend-path, then the locked backend; the backend's build_wheel writes into the output dir.
_FRONTEND = r"""
import importlib, os, sys, tomllib
project, backend_dir, out = sys.argv[1:4]
os.chdir(project)
system = {}
if os.path.isfile("pyproject.toml"):
    with open("pyproject.toml", "rb") as handle:
        system = tomllib.load(handle).get("build-system", {})
spec = system.get("build-backend", "setuptools.build_meta:__legacy__")
sys.path[:0] = [os.path.abspath(p) for p in system.get("backend-path", [])] + [backend_dir]
module, _, attribute = spec.partition(":")
try:
    backend = importlib.import_module(module)
except ImportError as exc:
    sys.exit(f"the build backend {spec} is not in the isolated build, which offers setuptools only ({exc})")
for part in filter(None, attribute.split(".")):
    backend = getattr(backend, part)
print(backend.build_wheel(out))
"""
_MAX_WHEEL_BYTES = 512 * 1024 * 1024


def _privileged() -> list[str]:
    """The prefix that runs a command as root: none for root, else ``sudo -n`` (GitHub's runners)."""
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") is None:
        raise InfrastructureError("building a python agent's wheel isolates it as root (a dedicated user, "
                                  "namespaces): run as root or with passwordless sudo")
    return ["sudo", "-n", "--"]


def _build_account() -> pwd.struct_passwd:
    """BUILD_USER, created (a system account, no home, no login) when missing; never root."""
    try:
        account = pwd.getpwnam(BUILD_USER)
    except KeyError:
        done = subprocess.run([*_privileged(), "useradd", "--system", "--user-group", "--no-create-home",
                               "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", BUILD_USER],
                              capture_output=True, timeout=GIT_TIMEOUT_SEC, check=False)
        try:  # another build may have created it meanwhile
            account = pwd.getpwnam(BUILD_USER)
        except KeyError:
            raise InfrastructureError(f"the build user {BUILD_USER} cannot be created "
                                      f"(useradd: {_last_line(done.stderr)})") from None
    if account.pw_uid == 0 or account.pw_gid == 0 or account.pw_uid == os.geteuid():
        raise InfrastructureError(f"the build user {BUILD_USER} has uid {account.pw_uid}, gid {account.pw_gid}: "
                                  "it must be an unprivileged account of its own")
    return account


def _base_python() -> tuple[str, str]:
    """(prefix, executable) of the base interpreter under benchseal's venv: the build runs it without
    any site-packages (``-S -s``), so nothing installed in benchseal's environment is importable."""
    prefix = os.path.realpath(sys.base_prefix)
    executable = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if os.path.commonpath([prefix, executable]) != prefix:
        raise InfrastructureError(f"the interpreter {executable} is not under its prefix {prefix}: "
                                  "the isolated build cannot mount it")
    return prefix, executable


def _backend() -> tuple[Path, str]:
    """The build backend installed from BACKEND_LOCK's wheels (each checked by sha256) into a cached tree
    named by the lock's hash; (that tree, the lock's sha256)."""
    try:
        text = BACKEND_LOCK.read_text("utf-8")
    except OSError as exc:
        raise InfrastructureError(f"{BACKEND_LOCK}: cannot be read ({exc.strerror})") from None
    pins: list[tuple[str, str, str]] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            found = _LOCK_LINE.match(line)
            if found is None:
                raise InfrastructureError(f"{BACKEND_LOCK}: not 'name==version --hash=sha256:<hex>': {line}")
            pins.append((found[1], found[2], found[3]))
    lock_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
    cache = paths.state_dir("cache", "agent-build")
    tree = cache / f"backend-{lock_hash[:20]}"
    if (tree / ".complete").is_file():
        return tree, lock_hash
    with (cache / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # one installer per cache (other builds, test workers)
        if (tree / ".complete").is_file():
            return tree, lock_hash
        wheels = _backend_wheels(cache / "wheels", pins)
        staging = Path(tempfile.mkdtemp(prefix=".backend-", dir=cache))
        try:
            schemes = {"purelib": str(staging), "platlib": str(staging), "headers": str(staging / "include"),
                       "scripts": str(staging / "bin"), "data": str(staging / "data")}
            for wheel in wheels:
                destination = SchemeDictionaryDestination(schemes, interpreter=_base_python()[1], script_kind="posix",
                                                          bytecode_optimization_levels=())
                with WheelFile.open(wheel) as source:
                    run_install(source, destination, {"INSTALLER": b"benchseal\n"})
            for root, _dirs, files in os.walk(staging):  # readable by the build user, writable by none
                os.chmod(root, 0o755)  # noqa: S103 -- read-only to everyone but root
                for name in files:
                    os.chmod(os.path.join(root, name), 0o644)
            (staging / ".complete").write_text(lock_hash + "\n", "utf-8")
            shutil.rmtree(tree, ignore_errors=True)  # a half-made tree of an interrupted install
            os.replace(staging, tree)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return tree, lock_hash


def _backend_wheels(dest: Path, pins: list[tuple[str, str, str]]) -> list[Path]:
    """The locked wheels in ``dest`` (downloaded once, ``--require-hashes``), each re-hashed."""
    dest.mkdir(parents=True, exist_ok=True)

    def present() -> dict[str, Path]:
        found: dict[str, Path] = {}
        for item in dest.glob("*.whl"):
            digest = hashlib.sha256(item.read_bytes()).hexdigest()
            found[digest] = item
        return found

    found = present()
    if not all(digest in found for _name, _version, digest in pins):
        argv = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "download", "--quiet",
                "--no-deps", "--only-binary=:all:", "--require-hashes", "-r", str(BACKEND_LOCK), "-d", str(dest)]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=BUILD_TIMEOUT_SEC, check=False)
        except subprocess.TimeoutExpired:
            raise InfrastructureError(f"pip download -r {BACKEND_LOCK} took more than {BUILD_TIMEOUT_SEC} s") from None
        if done.returncode != 0:
            raise InfrastructureError(f"pip download -r {BACKEND_LOCK} failed: {_last_line(done.stderr)}")
        found = present()
    missing = [f"{name}=={version}" for name, version, digest in pins if digest not in found]
    if missing:
        raise CheckFailed(f"{BACKEND_LOCK}: no wheel with the locked sha256 for {', '.join(missing)}")
    return [found[digest] for _name, _version, digest in pins]


def _isolated_build(work: Path, subdir: str, backend: Path, epoch: int) -> tuple[str, bytes]:
    """Build the wheel of ``work/source/subdir`` isolated (module docstring); (its file name, its bytes),
    read by benchseal from the output dir (one regular .whl, no link)."""
    missing = [tool for tool in ("unshare", "setpriv", "timeout", "mount", "env") if shutil.which(tool) is None]
    if missing:
        raise InfrastructureError(f"the isolated wheel build needs {', '.join(missing)} (util-linux, coreutils)")
    account = _build_account()
    prefix, python = _base_python()
    for name in ("out", "home", "python", "backend"):
        (work / name).mkdir()
    (work / "frontend.py").write_text(_FRONTEND, "utf-8")
    os.chmod(work, 0o755)  # noqa: S103 -- the build user enters it (at JAIL); its own dirs are chowned to it
    os.chmod(work / "frontend.py", 0o644)
    homes = ("/root", "/home", str(Path.home()), str(paths.home()), str(paths.REPO_ROOT / ".benchseal"))
    hidden = sorted({os.path.realpath(p) for p in homes})
    hidden = [p for p in hidden if p != "/" and not JAIL.startswith(p + "/")]
    env = {"HOME": f"{JAIL}/home", "TMPDIR": f"{JAIL}/home", "PATH": "/usr/bin:/bin", "SOURCE_DATE_EPOCH": str(epoch),
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8", "TZ": "UTC"}
    project = f"{JAIL}/source/{subdir}" if subdir else f"{JAIL}/source"
    command = [*_privileged(), "unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child",
               "--mount-proc", "--propagation", "private", "--",
               "sh", "-c", _JAIL_SCRIPT, BUILD_USER, str(work), prefix, str(backend), str(account.pw_uid),
               str(account.pw_gid), str(os.geteuid()), str(BUILD_TIMEOUT_SEC), JAIL, *hidden, "--",
               "env", "-i", *(f"{key}={value}" for key, value in sorted(env.items())),
               python, "-P", "-S", "-s", f"{JAIL}/frontend.py", project, f"{JAIL}/backend", f"{JAIL}/out"]
    try:
        proc = subprocess.run(command, capture_output=True, env={"PATH": os.environ.get("PATH", os.defpath)},
                              stdin=subprocess.DEVNULL, timeout=BUILD_TIMEOUT_SEC + 60, check=False)
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"building the wheel of {project} took more than {BUILD_TIMEOUT_SEC} s") from None
    except OSError as exc:
        raise InfrastructureError(f"the isolated wheel build did not start: {exc}") from None
    if proc.returncode == 125:
        raise InfrastructureError(f"the isolated wheel build could not be set up: {_last_line(proc.stderr)}")
    if proc.returncode == 137:
        raise CheckFailed(f"building the wheel of {project} took more than {BUILD_TIMEOUT_SEC} s")
    if proc.returncode != 0:
        raise CheckFailed(f"building the wheel failed (exit {proc.returncode}): {_last_line(proc.stderr + proc.stdout)}")
    return _read_built(work / "out")


def _read_built(out: Path) -> tuple[str, bytes]:
    """The one .whl the build left in ``out``: a regular file opened without following links."""
    wheels = sorted(entry.name for entry in os.scandir(out) if entry.name.endswith(".whl"))
    if len(wheels) != 1:
        raise CheckFailed(f"building the wheel made {len(wheels)} .whl files, not one")
    name = wheels[0]
    if name_problem(name):
        raise CheckFailed(f"building the wheel made a file with an unusable name: {name!r}")
    try:
        fd = os.open(out / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise CheckFailed(f"{name}: the built wheel cannot be opened as a file ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise CheckFailed(f"{name}: the built wheel is not a regular file of its own")
        data = handle.read(_MAX_WHEEL_BYTES + 1)
    if len(data) > _MAX_WHEEL_BYTES:
        raise CheckFailed(f"{name}: the built wheel is larger than {_MAX_WHEEL_BYTES} bytes")
    return name, data


def _metadata_of(wheel_name: str, data: bytes) -> tuple[str, str]:
    """Name and Version of the wheel's ``*.dist-info/METADATA`` (``data``: the wheel's bytes)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(names) != 1:
                raise CheckFailed(f"{wheel_name}: has {len(names)} .dist-info/METADATA files, not one")
            raw = archive.read(names[0])
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckFailed(f"{wheel_name}: not a readable wheel: {exc}") from None
    message = email.parser.BytesHeaderParser().parsebytes(raw)
    name, version = message.get("Name"), message.get("Version")
    if not name or not version:
        raise CheckFailed(f"{wheel_name}: METADATA names no Name and Version")
    return str(name).strip(), str(version).strip()
