"""Deterministic bytecode for an image layer, compiled by the image's own interpreter.

A layer's ``.py`` files are compiled inside the base image (``docker run`` of the
base BY DIGEST, no network), so the ``.pyc`` files match the interpreter that
will load them. Each file's ``.pyc`` is a pure function of its source, its in-image
path and that interpreter, whatever else the compiling process compiled before:

* unchecked-hash pycs (PEP 552): the header holds a hash of the source, never an
  mtime, and Python loads the file without checking the source (the image is
  immutable); optimisation level 0, fixed;
* the embedded file name is the in-image path, never the staging dir;
* ``PYTHONHASHSEED=0``, so set iteration (a frozenset constant's order) is fixed;
* frozenset constants are written unshared. CPython's marshal output depends on
  the process: identifiers a process has parsed stay interned, and a frozenset
  constant whose strings were interned before is rebuilt per code object (two
  objects, written twice) where a fresh process keeps one shared object (written
  once, then referenced). Replacing every frozenset constant by its own copy
  (:data:`DRIVER`'s ``unshare``) gives the same bytes in any process. (A rebuilt
  set may iterate in another order; marshal writes a set's elements sorted by
  their own bytes since CPython 3.10, so that does not reach the pyc.) Checked
  on the runner's 9,738 modules: one process in sorted order, the same in
  reverse order, three children over a shuffled list and a fresh process per
  file give identical pycs (a fresh process per file without ``unshare`` differs
  from one process in 664 of them).

So every file of a layer is compiled in one interpreter: a few children forked
from one clean parent share the files out (the split does not change any byte).
Because a pyc depends only on (source, path, interpreter, this compiler), pycs
are kept in a content-addressed cache (``<state>/cache/bytecode``) that a later
build reads instead of compiling again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from pipeline.core import paths
from pipeline.core.digests import ImageRef
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.imaging.base import ensure_local

STAGE = "/stage"
# The pyc cache tag of the images' interpreter (Debian trixie's python3, images/base/spec.toml).
CACHE_TAG = "cpython-313"

# Runs as ``python3 -S -c DRIVER STAGE JOBS`` inside the base image (stdlib only); reads the
# in-image paths to compile, NUL-separated, on stdin; prints "<compiled> <failed>".
DRIVER = r'''
import importlib.util, marshal, os, sys, types
stage, jobs = sys.argv[1], int(sys.argv[2])
files = [p for p in sys.stdin.read().split("\0") if p]
HEADER = importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little")  # hash-based, unchecked

def unshare(code):
    consts, changed = [], False
    for const in code.co_consts:
        if type(const) is types.CodeType:
            new = unshare(const)
        elif type(const) is frozenset:
            new = frozenset(tuple(const))
        else:
            new = const
        changed = changed or new is not const
        consts.append(new)
    return code.replace(co_consts=tuple(consts)) if changed else code

def compile_one(path):
    full = stage + path
    with open(full, "rb") as handle:
        source = handle.read()
    code = compile(source, path, "exec", dont_inherit=True, optimize=0)
    # Both trees stay referenced while marshalling (marshal marks an object it may share by its
    # reference count): the same source gives the same references, so the same bytes, in any process.
    canonical = unshare(code)
    data = HEADER + importlib.util.source_hash(source) + marshal.dumps(canonical)
    del canonical, code
    target = importlib.util.cache_from_source(full, optimization="")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as handle:
        handle.write(data)

children = {}
for k in range(min(jobs, len(files))):
    pid = os.fork()
    if pid == 0:
        failed = 0
        for path in files[k::jobs]:
            try:
                compile_one(path)
            except Exception as exc:
                sys.stderr.write("%s: %s: %s\n" % (path, type(exc).__name__, exc))
                failed += 1
        sys.stderr.flush()
        os._exit(min(failed, 100))
    children[pid] = k
failed = 0
while children:
    pid, status = os.wait()
    children.pop(pid)
    failed += os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1
print(len(files), failed, sys.implementation.cache_tag)
sys.exit(1 if failed else 0)
'''

# Part of every cache key that holds bytecode: a new driver means new bytes.
COMPILER_ID = "benchseal-bytecode/2:" + hashlib.sha256(DRIVER.encode()).hexdigest()


def clear_bytecode(root: Path) -> None:
    """Remove ``__pycache__`` dirs and stray ``.pyc``/``.pyo`` files (wheels may ship them)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [d for d in dirnames if d == "__pycache__"]:
            shutil.rmtree(Path(dirpath) / name)
            dirnames.remove(name)
        for name in filenames:
            if name.endswith((".pyc", ".pyo")):
                (Path(dirpath) / name).unlink()


def pyc_path(source: str) -> str:
    """Where the interpreter looks for ``source``'s bytecode (``__pycache__/NAME.cpython-313.pyc``)."""
    directory, name = os.path.split(source)
    return os.path.join(directory, "__pycache__", f"{name.removesuffix('.py')}.{CACHE_TAG}.pyc")


def sources(stage: Path, dirs: Sequence[str]) -> list[str]:
    """The in-image paths of every ``.py`` below ``stage/<dir>``, sorted as they are walked."""
    found: list[str] = []
    root = str(stage)
    for top in dirs:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top.lstrip("/"))):
            dirnames.sort()
            base = dirpath[len(root):]
            found += [f"{base}/{name}" for name in sorted(filenames) if name.endswith(".py")]
    return found


class BytecodeCache:
    """pyc bytes by (source sha256, in-image path, interpreter digest, compiler), under ``<state>/cache/bytecode``.

    ``read=False`` (a ``--no-cache`` build) compiles everything and only writes.
    """

    def __init__(self, interpreter: ImageRef, root: Path | None = None, read: bool = True) -> None:
        self.interpreter = interpreter
        self.root = str(root or paths.state_dir("cache", "bytecode"))
        self.read = read
        self._writers: list[threading.Thread] = []

    def path(self, source: bytes, in_image: str) -> str:
        material = "\n".join([COMPILER_ID, self.interpreter.digest, in_image, hashlib.sha256(source).hexdigest()])
        key = hashlib.sha256(material.encode()).hexdigest()
        return os.path.join(self.root, key[:2], f"{key}.pyc")

    def get(self, source: bytes, in_image: str) -> bytes | None:
        if not self.read:
            return None
        try:
            with open(self.path(source, in_image), "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def put(self, source: bytes, in_image: str, pyc: bytes) -> None:
        target = self.path(source, in_image)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        temporary = f"{target}.{os.getpid()}-{threading.get_ident()}.tmp"
        with open(temporary, "wb") as handle:
            handle.write(pyc)
        os.replace(temporary, target)

    def put_later(self, items: Sequence[tuple[bytes, str, bytes]]) -> None:
        """``put`` every (source, in-image path, pyc) on a thread of its own: 9,738 small files take
        about 2 s, off the build's path. Not a daemon: the interpreter waits for it before it exits."""

        def write() -> None:
            for source, in_image, pyc in items:
                try:
                    self.put(source, in_image, pyc)
                except OSError:  # a cache: a file not written is compiled again next time
                    continue

        thread = threading.Thread(target=write, name="bytecode-cache")
        thread.start()
        self._writers.append(thread)

    def wait(self) -> None:
        """Until every ``put_later`` has written its files."""
        for thread in self._writers:
            thread.join()


def compile_tree(stage: Path, dirs: Sequence[str], interpreter: ImageRef, cache: BytecodeCache | None = None,
                 jobs: int | None = None) -> int:
    """Compile every ``.py`` below ``stage/<dir>`` for each in-image ``dir``; return how many.

    ``stage`` is a staging tree laid out as the image (``stage/usr/...``). Any file
    that does not compile fails the build (the message names it). ``cache``: pycs
    found there are written as they are; the others are compiled and added to it.
    """

    for top in dirs:
        if not top.startswith("/") or ".." in Path(top).parts:
            raise ValidationError("layers.bytecode", "must be absolute in-image directories without '..'", top)
        clear_bytecode(stage / top.lstrip("/"))
    root = str(stage)
    files = sources(stage, dirs)
    todo: list[str] = []
    texts: dict[str, bytes] = {}
    for path in files:
        full = root + path
        hit = None
        if cache is not None:
            with open(full, "rb") as handle:
                texts[path] = handle.read()
            hit = cache.get(texts[path], path)
        if hit is None:
            todo.append(path)
            continue
        target = pyc_path(full)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as handle:
            handle.write(hit)
    if todo:
        _run_driver(stage, todo, interpreter, jobs or max(1, min(8, os.cpu_count() or 1)))
        if cache is not None:
            fresh = []
            for path in todo:
                with open(pyc_path(root + path), "rb") as handle:
                    fresh.append((texts[path], path, handle.read()))
            cache.put_later(fresh)
    found = sum(1 for top in dirs for dirpath, _, names in os.walk(os.path.join(root, top.lstrip("/")))
                if os.path.basename(dirpath) == "__pycache__" for name in names if name.endswith(".pyc"))
    if found != len(files):
        raise CheckFailed(f"bytecode compilation: {len(files)} sources but {found} .pyc files under {', '.join(dirs)}")
    return len(files)


def _run_driver(stage: Path, files: Sequence[str], interpreter: ImageRef, jobs: int) -> None:
    ensure_local(interpreter)
    argv = [
        "docker", "run", "--rm", "-i", "--network", "none",
        "--user", f"{os.getuid()}:{os.getgid()}",
        "-e", "PYTHONHASHSEED=0", "-e", "PYTHONDONTWRITEBYTECODE=1",
        "-v", f"{stage.resolve()}:{STAGE}",
        "--entrypoint", "python3", interpreter.ref, "-S", "-c", DRIVER, STAGE, str(jobs),
    ]
    try:
        proc = subprocess.run(argv, input="\0".join(files), capture_output=True, text=True, check=False)
    except OSError as exc:
        raise InfrastructureError(f"cannot run the docker CLI to compile bytecode: {exc}") from exc
    if proc.returncode != 0:
        raise CheckFailed(
            f"bytecode compilation in {interpreter.ref} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
        )
    fields = proc.stdout.split()
    if len(fields) != 3 or fields[:2] != [str(len(files)), "0"]:
        raise CheckFailed(f"bytecode compilation in {interpreter.ref}: unexpected report {proc.stdout.strip()[-200:]!r}")
    if fields[2] != CACHE_TAG:
        raise CheckFailed(f"bytecode compilation in {interpreter.ref}: its interpreter writes {fields[2]} bytecode, "
                          f"the images are built for {CACHE_TAG}")
