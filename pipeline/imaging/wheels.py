"""Hash-pinned wheels: lock files, host-side download, offline install into a layer tree.

Containers here cannot reach PyPI over TLS, so wheels are downloaded on the
host (``pip download --only-binary=:all: --require-hashes``) into a cache and
installed with the PyPI ``installer`` library into a staging tree: no pip, no
temp paths, no bytecode, so the tree is a pure function of the wheels.

``install`` checks every wheel's members first (``wheel_problem``; the agent's wheel is the adopter's
build): plain relative names (``fsutil.name_problem``), no link or device, and no two members, scripts
or benchseal's own metadata landing on one path or a file where a directory goes (``fsutil.NameTree``
over where each one is written). A wheel that breaks a rule is refused in one line before anything is
written, and what ``installer`` itself refuses is one line too (``CheckFailed``), never a traceback.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import posixpath
import re
import stat
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from installer import install as run_install
from installer.destinations import SchemeDictionaryDestination
from installer.exceptions import InstallerError
from installer.sources import WheelFile
from installer.utils import parse_entrypoints

from pipeline.core import paths
from pipeline.core.contracts import pep503_name
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.core.fsutil import NameTree, atomic_write_json, atomic_write_text, name_problem, sha256_file

_LINE = re.compile(r"\A(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!-]+)(?P<hashes>(?:\s+--hash=sha256:[0-9a-f]{64})+)\s*\Z")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Requirement:
    name: str
    version: str
    hashes: tuple[str, ...]




def parse_lock(path: Path) -> list[Requirement]:
    """``name==version --hash=sha256:... [--hash=...]`` per logical line; comments allowed."""
    text = path.read_text().replace("\\\n", " ")
    reqs: list[Requirement] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m:
            raise ValidationError(f"{path}:{number}", "must be 'name==version --hash=sha256:<64 hex>' (every requirement pinned and hashed)", line)
        reqs.append(Requirement(pep503_name(m["name"]), m["version"], tuple(_HASH.findall(m["hashes"]))))
    if not reqs:
        raise ValidationError(str(path), "lock lists no requirements")
    return reqs


def _platform_args(platforms: Sequence[str]) -> list[str]:
    return [arg for p in platforms for arg in ("--platform", p)]


def _resolve(reqs: Sequence[Requirement], dest: Path, index: dict[str, str], binary: bool) -> dict[str, Path] | None:
    """``{sha256: path}`` of one indexed file per requirement, or None when any is missing (nothing hashed)."""
    found: dict[str, Path] = {}
    for req in reqs:
        hit = next(
            (h for h in req.hashes if h in index and (dest / index[h]).is_file() and index[h].endswith(".whl") == binary),
            None,
        )
        if hit is None:
            return None
        found[hit] = dest / index[hit]
    return found


def _read_index(dest: Path) -> dict[str, str]:
    index_path = dest / "index.json"
    index: dict[str, str] = json.loads(index_path.read_text()) if index_path.is_file() else {}
    return index


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    """One pip at a time per wheel cache (threads of one build, and other builds)."""
    dest.mkdir(parents=True, exist_ok=True)
    with (dest / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def missing(lock: Path, dest: Path, binary: bool = True) -> bool:
    """Whether ``download`` would run pip for ``lock`` (by the cache's index: nothing is hashed)."""
    return _resolve(parse_lock(lock), dest, _read_index(dest), binary) is None


def download(lock: Path, dest: Path, python_version: str, platforms: Sequence[str], binary: bool = True) -> dict[str, Path]:
    """Every distribution of ``lock`` in ``dest``, verified; ``{sha256: path}``.

    pip runs only when something is missing, so a warm build needs no index.
    """
    reqs = parse_lock(lock)
    with _locked(dest):
        index = _read_index(dest)
        found = _resolve(reqs, dest, index, binary)
        if found is None:
            argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes", "-r", str(lock),
                    "-d", str(dest)]
            if binary:
                argv += ["--only-binary=:all:", *_platform_args(platforms), "--python-version", python_version,
                         "--implementation", "cp"]
            else:
                argv += ["--no-binary=:all:"]
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise InfrastructureError(f"pip download -r {lock} failed: {proc.stderr[-2000:]}")
            known = set(index.values())
            for item in dest.iterdir():
                if item.suffix in (".whl", ".gz", ".zip") and item.name not in known:
                    index[sha256_file(item)] = item.name
            atomic_write_json(dest / "index.json", index)
            found = _resolve(reqs, dest, index, binary)
            if found is None:
                raise CheckFailed(f"pip download -r {lock}: some files matching the locked hashes are missing")
    for digest, path in found.items():
        if sha256_file(path) != digest:
            raise CheckFailed(f"{path}: sha256 differs from the lock {lock}")
    return found


_INSTALLER_METADATA = {"INSTALLER": b"benchseal\n"}  # what install adds to every dist-info
_PLAIN_KINDS = (0, stat.S_IFREG, stat.S_IFDIR)  # 0: a zip writer that records no Unix mode


def _member_kind_problem(info: zipfile.ZipInfo) -> str | None:
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind == stat.S_IFLNK:
        return "is a link: only files and directories are installed"
    if kind not in _PLAIN_KINDS:
        return "is a device, FIFO or other special entry: only files and directories are installed"
    return None


def wheel_problem(source: WheelFile, schemes: Mapping[str, str]) -> str | None:
    """Why ``source`` cannot be installed into ``schemes`` (a phrase naming the member), or None.

    Every member is judged by its name (``fsutil.name_problem``) and kind (no link or device), then by
    where installer writes it (the root scheme, or ``<name>-<version>.data/<scheme>/...``) together with
    the entry points' scripts and the INSTALLER file install adds: ``fsutil.NameTree`` over those paths
    refuses two things on one path and a file where a directory goes (``f``, then ``f/g``), which would
    otherwise fail half-way through writing (NotADirectoryError, FileExistsError)."""
    tree = NameTree()
    root = schemes["purelib"]  # purelib and platlib are one directory here (``install``)

    def landed(scheme_dir: str, path: str) -> str:
        return posixpath.join(scheme_dir, path).lstrip("/")

    try:
        for info in source._zipfile.infolist():
            is_dir = info.filename.endswith("/")
            name = info.filename.removesuffix("/") if is_dir else info.filename
            problem = name_problem(name) or _member_kind_problem(info)
            if problem is None:
                scheme_dir, path = root, name
                data, _, rest = name.partition("/")
                if data == source.data_dir:
                    scheme, _, path = rest.partition("/")
                    if scheme not in schemes or not path:
                        problem = "is in no .data scheme directory (purelib, platlib, headers, scripts, data)"
                    scheme_dir = schemes.get(scheme, "")
                problem = problem or tree.problem(landed(scheme_dir, path), is_dir=is_dir)
            if problem:
                return f"holds {name[:200]!r}, which {problem}"
        for name in _INSTALLER_METADATA:
            problem = tree.problem(landed(root, f"{source.dist_info_dir}/{name}"))
            if problem:
                return f"holds {source.dist_info_dir}/{name}, which benchseal writes itself"
        if "entry_points.txt" in source.dist_info_filenames:
            for script, _module, _attr, _section in parse_entrypoints(source.read_dist_info("entry_points.txt")):
                problem = name_problem(script) or ("has a '/'" if "/" in script else None) or \
                    tree.problem(landed(schemes["scripts"], script))
                if problem:
                    return f"names the entry point script {script[:200]!r}, which {problem}"
    except (InstallerError, ValueError, KeyError, UnicodeDecodeError) as exc:
        return f"has unreadable metadata ({' '.join(str(exc).split())[:300]})"
    return None


def install(wheels: Sequence[Path], root: Path, site_packages: str, scripts: str, interpreter: str, *,
            data: str = "/usr/local", headers: str = "/usr/local/include/python3") -> None:
    """Install ``wheels`` (sorted by file name) into ``root`` as if it were ``/``.

    A wheel ``wheel_problem`` refuses, or one installer refuses, is a one-line CheckFailed before that
    wheel writes anything (the caller installs into a staging tree and removes it on failure)."""

    schemes = {
        "purelib": site_packages,
        "platlib": site_packages,
        "headers": headers,
        "scripts": scripts,
        "data": data,
    }
    for wheel in sorted(wheels, key=lambda p: p.name):
        destination = SchemeDictionaryDestination(
            schemes,
            interpreter=interpreter,
            script_kind="posix",
            bytecode_optimization_levels=(),
            destdir=str(root),
        )
        try:
            with WheelFile.open(wheel) as source:
                problem = wheel_problem(source, schemes)
                if problem:
                    raise CheckFailed(f"{wheel.name} {problem}: refused")
                run_install(source, destination, _INSTALLER_METADATA)
        except (InstallerError, ValueError, KeyError, AssertionError, zipfile.BadZipFile,
                FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
            # What the checks above leave to installer (RECORD hashes, WHEEL metadata): one line.
            raise CheckFailed(f"{wheel.name} cannot be installed ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:300]})") from None


def extract_member(archive: Path, member: str, out: Path) -> None:
    """Copy one file out of a (hash-verified) sdist tarball."""
    with tarfile.open(archive) as tar:
        handle = tar.extractfile(member)
        if handle is None:
            raise CheckFailed(f"{archive}: no file {member}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(handle.read())


def write_lock(requirements: Sequence[str], out: Path, python_version: str, platforms: Sequence[str], constraints: Path | None = None, binary: bool = True, no_deps: bool = False) -> None:
    """Resolve ``requirements`` for the target interpreter and write a hash-pinned lock.

    Maintenance only (``python images/relock.py``): the lock, not this resolution, is what builds trust.
    """
    work = paths.state_dir("cache", "relock", hashlib.sha256(str(out).encode()).hexdigest()[:12])
    for old in work.iterdir():
        old.unlink()
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "-d", str(work), *requirements]
    if binary:
        argv += ["--only-binary=:all:", *_platform_args(platforms), "--python-version", python_version, "--implementation", "cp"]
    else:
        argv += ["--no-binary=:all:"]
    if no_deps:
        argv.append("--no-deps")
    if constraints is not None:
        argv += ["-c", str(constraints)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise InfrastructureError(f"pip download {' '.join(requirements)} failed: {proc.stderr[-2000:]}")
    lines: dict[str, list[str]] = {}
    for item in sorted(work.iterdir()):
        stem = item.name.removesuffix(".whl").removesuffix(".tar.gz").removesuffix(".zip")
        name, version = stem.split("-")[:2]
        lines.setdefault(f"{pep503_name(name)}=={version}", []).append(sha256_file(item))
    header = (
        f"# Generated by images/relock.py for CPython {python_version} ({'wheels' if binary else 'sdists'}): {' '.join(requirements)}\n"
        "# Every distribution is pinned by version and sha256; pip download --require-hashes enforces it.\n"
    )
    body = "".join(f"{spec} " + " ".join(f"--hash=sha256:{h}" for h in sorted(hashes)) + "\n" for spec, hashes in sorted(lines.items()))
    atomic_write_text(out, header + body)
