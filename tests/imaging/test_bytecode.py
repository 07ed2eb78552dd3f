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
from pipeline.imaging import bytecode
from pipeline.imaging.bytecode import BytecodeCache, compile_tree

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
    # One process for the three files: shared.py is compiled after a_names.py interned its strings.
    assert compile_tree(together, [SITE], interpreter, jobs=1) == 3
    assert compile_tree(again, [SITE], interpreter, jobs=3) == 3
    assert _pyc(alone, "shared") == _pyc(together, "shared") == _pyc(again, "shared")
    for name in ("a_names", "shared", "z_names"):
        assert _pyc(together, name) == _pyc(again, name)


def _driver(stage: Path, order: list[str], interpreter: ImageRef, jobs: int) -> None:
    bytecode.clear_bytecode(stage)
    bytecode._run_driver(stage, order, interpreter, jobs)


def test_neither_order_nor_split_nor_history_changes_a_byte(tmp_path: Path, base_refs: dict[str, ImageRef]) -> None:
    """Every file compiled in one process, in either order, split over children, or each alone: same pycs."""
    interpreter = base_refs["base"]
    files = {"a_names.py": NAMES, "shared.py": SHARED, "z_names.py": NAMES,
             "sets.py": "S = {'compaction', 'x y', 1, (2, 'branch_summary')}\ndef f(v):\n    return v in S or v in {'usage', 'role'}\n",
             "nested.py": "def outer():\n    def inner(e):\n        return e in {'message', 'usage'}\n    return inner\n"}
    paths = [f"{SITE}/pkg/{name}" for name in sorted(files)]
    reference = _stage(tmp_path / "one-process", files)
    _driver(reference, paths, interpreter, 1)
    for label, order, jobs in (("reversed", paths[::-1], 1), ("split", paths, 3), ("interleaved", paths[1::2] + paths[::2], 2)):
        other = _stage(tmp_path / label, files)
        _driver(other, order, interpreter, jobs)
        for name in files:
            assert _pyc(other, name.removesuffix(".py")) == _pyc(reference, name.removesuffix(".py")), (label, name)
    for name in files:  # a fresh interpreter for that file alone, nothing compiled before it
        alone = _stage(tmp_path / f"alone-{name}", {name: files[name]})
        _driver(alone, [f"{SITE}/pkg/{name}"], interpreter, 1)
        assert _pyc(alone, name.removesuffix(".py")) == _pyc(reference, name.removesuffix(".py")), name


# Two names whose frozenset iterates in another order once rebuilt from its own iteration order
# (they collide at the end of the set's table, where CPython probes elsewhere): found in the image.
# The compiler's copy of a set rebuilt by an earlier interning then iterates in another order than
# a fresh process's; marshal writes a set's elements sorted (CPython >= 3.10), which this relies on.
_COLLIDING = r"""
import itertools, string
names = ["".join(p) for p in itertools.product(string.ascii_lowercase, repeat=3)]
ends = [n for n in names if hash(n) & 7 == 7][:40]
for a, b in itertools.combinations(ends, 2):
    first = frozenset((a, b))
    if list(frozenset(tuple(first))) != list(first):
        print(a, b)
        break
"""


def test_a_set_rebuilt_by_an_earlier_interning_gives_the_same_bytes(tmp_path: Path, base_refs: dict[str, ImageRef]) -> None:
    """A frozenset constant rebuilt because its strings were interned before iterates in another order
    (two colliding elements): the pyc is the same, alone or after a file that interned them."""
    interpreter = base_refs["base"]
    found = subprocess.run(["docker", "run", "--rm", "--network", "none", "-e", "PYTHONHASHSEED=0", "--entrypoint",
                            "python3", interpreter.ref, "-c", _COLLIDING], capture_output=True, text=True, check=True)
    a, b = found.stdout.split()
    files = {"a_interns.py": f"{a} = {b} = 1\n",
             "collide.py": f"def f(e):\n    return e in {{'{a}', '{b}'}}\n\ndef g(e):\n    return e in {{'{b}', '{a}'}}\n"}
    alone = _stage(tmp_path / "alone", {"collide.py": files["collide.py"]})
    together = _stage(tmp_path / "together", files)
    _driver(alone, [f"{SITE}/pkg/collide.py"], interpreter, 1)
    _driver(together, [f"{SITE}/pkg/a_interns.py", f"{SITE}/pkg/collide.py"], interpreter, 1)
    assert _pyc(alone, "collide") == _pyc(together, "collide")


def test_the_image_runs_the_pyc_it_was_given(tmp_path: Path, base_refs: dict[str, ImageRef]) -> None:
    """An unchecked pyc is what the interpreter runs (the source is not even read), and it behaves as the source."""
    stage = _stage(tmp_path / "stage", {"__init__.py": "", "shared.py": SHARED})
    assert compile_tree(stage, [SITE], base_refs["base"]) == 2
    (stage / SITE.lstrip("/") / "pkg" / "shared.py").write_text("def a(e):\n    return 'source'\n")
    run = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--user", f"{os.getuid()}:{os.getgid()}",
         "-e", "PYTHONDONTWRITEBYTECODE=1", "-v", f"{stage}{SITE}/pkg:{SITE}/pkg:ro", "--entrypoint", "python3",
         base_refs["base"].ref, "-c", "from pkg import shared; print(shared.a('compaction'), shared.b('branch_summary'), shared.a('x'))"],
        capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["1", "2", "None"]


def test_the_cache_gives_the_same_bytes_without_compiling(tmp_path: Path, base_refs: dict[str, ImageRef],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    interpreter = base_refs["base"]
    files = {"a_names.py": NAMES, "shared.py": SHARED}
    cache = BytecodeCache(interpreter, root=tmp_path / "cache")
    first = _stage(tmp_path / "first", files)
    assert compile_tree(first, [SITE], interpreter, cache) == 2
    cache.wait()
    assert len(list((tmp_path / "cache").rglob("*.pyc"))) == 2

    def no_compiler(*args: object) -> None:
        raise AssertionError("compiled although every pyc was cached")

    monkeypatch.setattr(bytecode, "_run_driver", no_compiler)
    second = _stage(tmp_path / "second", files)
    assert compile_tree(second, [SITE], interpreter, cache) == 2
    for name in ("a_names", "shared"):
        assert _pyc(second, name) == _pyc(first, name)
    # A key names the source, its in-image path, the interpreter and the compiler.
    assert cache.path(SHARED.encode(), f"{SITE}/pkg/shared.py") != cache.path(SHARED.encode(), f"{SITE}/other/shared.py")
    other = BytecodeCache(ImageRef(interpreter.name, "sha256:" + "0" * 64), root=tmp_path / "cache")
    assert other.path(SHARED.encode(), f"{SITE}/pkg/shared.py") != cache.path(SHARED.encode(), f"{SITE}/pkg/shared.py")
    # A --no-cache build does not read it.
    with pytest.raises(AssertionError, match="compiled although"):
        compile_tree(_stage(tmp_path / "third", files), [SITE], interpreter,
                     BytecodeCache(interpreter, root=tmp_path / "cache", read=False))


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
