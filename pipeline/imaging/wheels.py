"""Hash-pinned wheels: lock files, host-side download, offline install into a layer tree.

Containers here cannot reach PyPI over TLS, so wheels are downloaded on the
host (``pip download --only-binary=:all: --require-hashes``) into a cache and
installed with the PyPI ``installer`` library into a staging tree: no pip, no
temp paths, no bytecode, so the tree is a pure function of the wheels.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from installer import install as run_install
from installer.destinations import SchemeDictionaryDestination
from installer.sources import WheelFile

from pipeline.core import paths
from pipeline.core.contracts import pep503_name
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.core.fsutil import atomic_write_json, atomic_write_text, sha256_file

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


def install(wheels: Sequence[Path], root: Path, site_packages: str, scripts: str, interpreter: str, *,
            data: str = "/usr/local", headers: str = "/usr/local/include/python3") -> None:
    """Install ``wheels`` (sorted by file name) into ``root`` as if it were ``/``."""

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
        with WheelFile.open(wheel) as source:
            run_install(source, destination, {"INSTALLER": b"benchseal\n"})


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
