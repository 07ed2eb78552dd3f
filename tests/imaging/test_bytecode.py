"""Deterministic bytecode compiled by the base image's interpreter (real engine, real base image)."""

from __future__ import annotations

import marshal
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.digests import ImageRef
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.imaging.bytecode import compile_tree

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SITE = "/usr/local/lib/python3.13/dist-packages"

# A frozenset constant shared by two functions gets a marshal back-reference, or
# is written twice, depending on whether its strings were interned before, i.e.
# on what else the compiling process saw: a long-lived compiler (compileall)
# writes different bytes for shared.py depending on whether it compiled
# a_names.py first. Found in Harbor 0.26 (harbor/agents/installed/pi.py).
NAMES = "from pkg.compaction import x\n"
SHARED = (
    "def a(e):\n    if e in {'compaction', 'branch_summary'}:\n        return 1\n\n"
    "def b(e):\n    if e in {'compaction', 'branch_summary'}:\n        return 2\n"
)


def _stage(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / SITE.lstrip("/") / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _pyc(root: Path, name: str) -> bytes:
    return (root / SITE.lstrip("/") / "pkg" / "__pycache__" / f"{name}.cpython-313.pyc").read_bytes()


def _compileall(root: Path, interpreter: ImageRef) -> None:
    """What a long-lived compiler writes: compileall in one process over the whole tree."""
    subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--user", f"{os.getuid()}:{os.getgid()}", "-v", f"{root}:/stage",
         "--entrypoint", "python3", interpreter.ref, "-m", "compileall", "-q", "--invalidation-mode", "unchecked-hash",
         "-s", "/stage", "-p", "/", f"/stage{SITE}"],
        check=True, capture_output=True,
    )


def test_a_pyc_depends_only_on_its_source(tmp_path: Path, base_refs: dict[str, ImageRef]) -> None:
    interpreter = base_refs["base"]
    # The input is hostile: one compiling process gives shared.py two different pycs.
    naive_alone = _stage(tmp_path / "naive-alone", {"shared.py": SHARED})
    naive_together = _stage(tmp_path / "naive-together", {"a_names.py": NAMES, "shared.py": SHARED})
    _compileall(naive_alone, interpreter)
    _compileall(naive_together, interpreter)
    assert _pyc(naive_alone, "shared") != _pyc(naive_together, "shared"), "the test input no longer triggers the CPython behaviour"

    alone = _stage(tmp_path / "alone", {"shared.py": SHARED})
    together = _stage(tmp_path / "together", {"a_names.py": NAMES, "shared.py": SHARED, "z_names.py": NAMES})
    again = _stage(tmp_path / "again", {"a_names.py": NAMES, "shared.py": SHARED, "z_names.py": NAMES})
    assert compile_tree(alone, [SITE], interpreter) == 1
    assert compile_tree(together, [SITE], interpreter) == 3
    assert compile_tree(again, [SITE], interpreter) == 3
    assert _pyc(alone, "shared") == _pyc(together, "shared") == _pyc(again, "shared")
    for name in ("a_names", "shared", "z_names"):
        assert _pyc(together, name) == _pyc(again, name)


def test_pyc_is_unchecked_hash_with_the_in_image_path(tmp_path: Path, base_refs: dict[str, ImageRef]) -> None:
    stage = _stage(tmp_path / "stage", {"__init__.py": "VALUE = 1\n", "mod.py": SHARED})
    # Bytecode the wheel shipped (or left from an earlier run) is replaced, never kept.
    stale = stage / SITE.lstrip("/") / "pkg" / "__pycache__" / "old.cpython-313.pyc"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale")
    assert compile_tree(stage, [SITE], base_refs["base"]) == 2
    assert not stale.exists()
    for name in ("__init__", "mod"):
        data = _pyc(stage, name)
        (flags,) = struct.unpack("<I", data[4:8])
        assert flags == 0b01, "hash-based (bit 0) and unchecked (bit 1 clear)"
        assert str(tmp_path).encode() not in data
        assert b"/stage" not in data
        if sys.version_info[:2] == (3, 13):  # same marshal format as the image's interpreter
            code = marshal.loads(data[16:])
            assert code.co_filename == f"{SITE}/pkg/{name}.py"


def test_a_source_that_does_not_compile_fails_the_build_naming_it(tmp_path: Path, base_refs: dict[str, ImageRef]) -> None:
    stage = _stage(tmp_path / "stage", {"good.py": "X = 1\n", "broken.py": "def (:\n"})
    with pytest.raises(CheckFailed, match=r"pkg/broken\.py"):
        compile_tree(stage, [SITE], base_refs["base"])


@pytest.mark.parametrize("bad", ["usr/lib", "/usr/../etc", ""])
def test_compile_dirs_must_be_absolute_in_image_paths(tmp_path: Path, base_refs: dict[str, ImageRef], bad: str) -> None:
    with pytest.raises(ValidationError, match=r"layers\.bytecode"):
        compile_tree(tmp_path, [bad], base_refs["base"])
