"""Deterministic bytecode for an image layer, compiled by the image's own interpreter.

A layer's ``.py`` files are compiled inside the base image (``docker run`` of the
base BY DIGEST, no network), so the ``.pyc`` files match the interpreter that
will load them. Each file's ``.pyc`` is a pure function of its source and that
interpreter:

* ``--invalidation-mode unchecked-hash`` (PEP 552): the header holds a hash of
  the source, never an mtime, and Python loads the file without checking the
  source (the image is immutable);
* the embedded file name is the in-image path (``dfile``), never the staging dir;
* every file is compiled in a process forked from one clean parent. CPython's
  marshal output depends on the process state (a constant shared by two code
  objects gets a back-reference only when a string in it was not interned
  before), so a long-lived compiler such as ``compileall -j0`` gives different
  bytes depending on which files a worker compiled earlier; a fresh fork per
  file does not;
* ``PYTHONHASHSEED=0``, so set/dict order in the compiler is fixed too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pipeline.core.digests import ImageRef
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.imaging.base import ensure_local

STAGE = "/stage"

# Runs as ``python3 -S - STAGE DIR...`` inside the base image (stdlib only).
DRIVER = r'''
import gc, os, py_compile, sys
stage, dirs = sys.argv[1], sys.argv[2:]
files = []
for top in dirs:
    for dirpath, dirnames, filenames in os.walk(stage + top):
        dirnames.sort()
        files += [os.path.join(dirpath, n) for n in sorted(filenames) if n.endswith(".py")]
mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
jobs = max(1, min(8, os.cpu_count() or 1))
running = {}
failed = []

def reap():
    pid, status = os.wait()
    path = running.pop(pid)
    if status != 0:
        failed.append(path)

gc.freeze()
for path in files:
    while len(running) >= jobs:
        reap()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            py_compile.compile(path, dfile=path[len(stage):], doraise=True, invalidation_mode=mode)
        except BaseException as exc:
            sys.stderr.write("%s: %s\n" % (path[len(stage):], exc))
            code = 3
        sys.stderr.flush()
        os._exit(code)
    running[pid] = path
while running:
    reap()
print(len(files), len(failed))
sys.exit(1 if failed else 0)
'''

# Part of every layer cache key that holds bytecode: a new driver means new bytes.
COMPILER_ID = "benchseal-bytecode/1:" + hashlib.sha256(DRIVER.encode()).hexdigest()


def clear_bytecode(root: Path) -> None:
    """Remove ``__pycache__`` dirs and stray ``.pyc``/``.pyo`` files (wheels may ship them)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [d for d in dirnames if d == "__pycache__"]:
            shutil.rmtree(Path(dirpath) / name)
            dirnames.remove(name)
        for name in filenames:
            if name.endswith((".pyc", ".pyo")):
                (Path(dirpath) / name).unlink()


def compile_tree(stage: Path, dirs: Sequence[str], interpreter: ImageRef) -> int:
    """Compile every ``.py`` below ``stage/<dir>`` for each in-image ``dir``; return how many.

    ``stage`` is a staging tree laid out as the image (``stage/usr/...``). Any file
    that does not compile fails the build (the message names it).
    """

    for top in dirs:
        if not top.startswith("/") or ".." in Path(top).parts:
            raise ValidationError("layers.bytecode", "must be absolute in-image directories without '..'", top)
        clear_bytecode(stage / top.lstrip("/"))
    ensure_local(interpreter)
    argv = [
        "docker", "run", "--rm", "-i", "--network", "none",
        "--user", f"{os.getuid()}:{os.getgid()}",
        "-e", "PYTHONHASHSEED=0", "-e", "PYTHONDONTWRITEBYTECODE=1",
        "-v", f"{stage.resolve()}:{STAGE}",
        "--entrypoint", "python3", interpreter.ref, "-S", "-", STAGE, *dirs,
    ]
    try:
        proc = subprocess.run(argv, input=DRIVER, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise InfrastructureError(f"cannot run the docker CLI to compile bytecode: {exc}") from exc
    if proc.returncode != 0:
        raise CheckFailed(
            f"bytecode compilation in {interpreter.ref} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
        )
    fields = proc.stdout.split()
    if len(fields) != 2 or not all(f.isdigit() for f in fields) or fields[1] != "0":
        raise CheckFailed(f"bytecode compilation in {interpreter.ref}: unexpected report {proc.stdout.strip()[-200:]!r}")
    compiled = int(fields[0])
    found = sum(1 for top in dirs for _ in (stage / top.lstrip("/")).rglob("__pycache__/*.pyc"))
    if found != compiled:
        raise CheckFailed(f"bytecode compilation: {compiled} sources but {found} .pyc files under {', '.join(dirs)}")
    return compiled
