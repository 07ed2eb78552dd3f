"""Imports run one way along the chain (docs/architecture.md): checked on the source, function bodies included."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parent.parent / "pipeline"

# Each folder of pipeline/ is one stage or one concern (docs/architecture.md), with what it may import.
# The chain runs one way; the local world (pipeline/local/) is imported by nothing but itself and the CLI.
_PRODUCTION = {"core", "agent", "imaging", "attest", "dispatch", "infra.intake", "infra.queue", "infra.sandbox",
               "infra.worker", "runner", "evidence", "publish", "verify", "api", "host", "datasets"}
LAYERS: dict[str, set[str]] = {
    "core": set(),
    "agent": {"core"},
    "imaging": {"core", "agent"},
    "dispatch": {"core"},
    "evidence": {"core"},
    "datasets": {"core"},  # importers of public datasets into Harbor tasks
    "verify": {"core", "dispatch"},  # the GitHub client (dispatch.client) fetches a release to verify
    "attest": {"core", "evidence", "verify"},
    "api": {"core", "infra.queue"},  # the queue database, opened read-only (infra.queue.reader)
    "infra.queue": {"core"},
    "infra.intake": {"core", "infra.queue"},
    "infra.sandbox": {"core", "infra.intake"},
    "runner": {"core", "infra.sandbox"},
    "infra.worker": {"core", "attest", "imaging", "infra.intake", "infra.queue", "infra.sandbox", "runner"},
    "publish": {"core", "dispatch", "evidence", "verify", "infra.intake", "infra.queue", "infra.worker"},
    "host": {"core", "infra.sandbox", "infra.intake", "infra.queue"},  # doctor: the policy as the worker parses it, the workers' heartbeats
    "local": _PRODUCTION,
    "cli": _PRODUCTION | {"local"},
}


def _imports(module: Path) -> set[str]:
    """Every ``pipeline.*`` module a file imports, at module level or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipeline"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("pipeline"))
    return found


def _is_module(dotted: str) -> bool:
    path = PIPELINE.parent / Path(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _layer(dotted: str) -> str | None:
    """The folder a ``pipeline.*`` module belongs to (None: the package root, ``pipeline.__version__``)."""
    parts = dotted.split(".")[1:]
    if not parts or not (PIPELINE / parts[0]).is_dir():
        return None
    return ".".join(parts[:2]) if parts[0] == "infra" and len(parts) > 1 else parts[0]


def _layer_imports(layer: str) -> set[str]:
    root = PIPELINE / Path(*layer.split("."))
    found: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        found.update(_imports(path))
    return {target for name in found if _is_module(name) and (target := _layer(name)) not in (None, layer)}


def test_every_folder_is_a_known_layer() -> None:
    folders = {p.relative_to(PIPELINE).as_posix().replace("/", ".") for p in PIPELINE.rglob("*")
               if p.is_dir() and (p / "__init__.py").is_file()}
    layers = {f for f in folders if "." not in f and f != "infra"} | {f for f in folders if f.startswith("infra.")}
    assert layers == set(LAYERS), f"folders without a declared layer or layers without a folder: {layers ^ set(LAYERS)}"
    loose = sorted(p.name for p in (PIPELINE / "infra").glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"pipeline/infra/ holds only its concerns' folders, not {loose}"
    top = sorted(p.name for p in PIPELINE.glob("*.py"))
    assert top == ["__init__.py", "__main__.py"], f"pipeline/ holds folders only, not {top}"


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_imports_run_one_way(layer: str) -> None:
    extra = sorted(_layer_imports(layer) - LAYERS[layer])
    assert extra == [], f"pipeline/{layer.replace('.', '/')} imports {extra}, which its layer may not"


def test_the_layer_check_sees_what_it_should() -> None:
    # Guards the check itself: the names it resolves are real modules in the layers named.
    assert _layer("pipeline.local.sigstore") == "local" and _is_module("pipeline.local.sigstore")
    assert _layer("pipeline.infra.worker.loop") == "infra.worker" and _layer("pipeline.__version__") is None
    assert "local" in _layer_imports("cli") and "infra.sandbox" in _layer_imports("infra.worker")


def _module_level_imports(path: Path) -> set[str]:
    """The ``pipeline.*`` modules ``path`` imports when it is imported (not inside functions)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipeline"):
            found.update(n for n in [node.module, *(f"{node.module}.{a.name}" for a in node.names)] if _is_module(n))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("pipeline") and _is_module(a.name))
    return found


def test_no_module_level_import_cycle() -> None:
    modules = {".".join(p.relative_to(PIPELINE.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PIPELINE.rglob("*.py")}
    graph = {name: {m for m in _module_level_imports(path) if m != name and not name.startswith(m + ".")}
             for name, path in modules.items()}
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for nxt in sorted(graph.get(name, ())):
            if state.get(nxt) == 1:
                raise AssertionError(f"import cycle: {' -> '.join([*trail[trail.index(nxt):], nxt])}")
            if nxt not in state:
                visit(nxt, [*trail, nxt])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_package_inits_hold_no_implementation() -> None:
    """An ``__init__`` is a docstring and at most a few re-exports: importing one submodule costs only it."""
    heavy = []
    for path in sorted(PIPELINE.rglob("__init__.py")):
        if path.parent == PIPELINE or path.parent.name == "cli":
            continue  # the version; the CLI's project-dir hook that runs before any verb imports
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for n in tree.body):
            heavy.append(path.relative_to(PIPELINE).as_posix())
    assert heavy == [], f"package __init__ files with code in them: {heavy}"


# Another change rewrites these three now; their function-local imports are checked once it lands.
UNCHECKED_FOR_LAZY_IMPORTS: frozenset[str] = frozenset()
LAZY = "# lazy:"


def _in_import_run(line: str) -> bool:
    """An import line, a parenthesised import's continuation, or a blank line between imports."""
    text = line.strip()
    return text.startswith(("import ", "from ")) or text in ("", ")") or (text.endswith(",") and " " not in text)


def _lazy_reason(lines: list[str], lineno: int) -> bool:
    """A ``# lazy:`` comment on the import's line, or heading the run of imports it belongs to."""
    if LAZY in lines[lineno - 1]:
        return True
    index = lineno - 2
    while index >= 0 and _in_import_run(lines[index]) and LAZY not in lines[index]:
        index -= 1
    return index >= 0 and lines[index].strip().startswith(LAZY)


def _unexplained_local_imports(source: str) -> list[int]:
    lines = source.splitlines()
    found = []
    for function in ast.walk(ast.parse(source)):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom) and not _lazy_reason(lines, node.lineno):
                    found.append(node.lineno)
    return sorted(set(found))


def test_function_local_imports_carry_a_measured_reason() -> None:
    """Module-level imports everywhere; a lazy one says what it saves (``# lazy: X costs N ms ...``)."""
    unexplained = [
        f"pipeline/{path.relative_to(PIPELINE)}:{line}"
        for path in sorted(PIPELINE.rglob("*.py"))
        if path.relative_to(PIPELINE).as_posix() not in UNCHECKED_FOR_LAZY_IMPORTS
        for line in _unexplained_local_imports(path.read_text(encoding="utf-8"))
    ]
    assert unexplained == [], f"function-local imports without a '{LAZY}' comment: {unexplained}"


def test_the_lazy_import_check_catches_what_it_should() -> None:
    bare = "def f():\n    import json\n    return json\n"
    assert _unexplained_local_imports(bare) == [2]
    explained = "def f():\n    # lazy: json costs 1 ms at CLI start\n    import json\n\n    from os import path\n    return json, path\n"
    assert _unexplained_local_imports(explained) == []
    trailing = "def f():\n    import json  # lazy: json costs 1 ms at CLI start\n    return json\n"
    assert _unexplained_local_imports(trailing) == []
    # A comment heads only the run of imports directly under it, not imports further down.
    later = "def f():\n    # lazy: json costs 1 ms\n    import json\n    x = 1\n    import os\n    return json, os, x\n"
    assert _unexplained_local_imports(later) == [5]
    # Another comment is no reason, and a lazy comment elsewhere in the function does not count.
    other = "def f():\n    # imported here to start fast\n    import json\n    return json\n"
    assert _unexplained_local_imports(other) == [3]
    nested = "class C:\n    def m(self):\n        def g():\n            import json\n            return json\n        return g\n"
    assert _unexplained_local_imports(nested) == [4]


def test_the_worker_and_the_local_chain_do_not_import_harbor() -> None:
    """Harbor runs inside the runner image only: the worker plans and grades trials with
    pipeline.runner.plan, so the infra host's processes never pay Harbor's import (about 0.2 s)."""
    probe = ("import sys, pipeline.infra.worker.loop, pipeline.local.release, pipeline.cli.main; "
             "print(sorted(m for m in sys.modules if m == 'harbor' or m.startswith(('harbor.', 'litellm'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          cwd=PIPELINE.parent)
    assert done.stdout.strip() == "[]", done.stdout
