"""Imports run one way along the chain (docs/architecture.md): checked on the source, function bodies included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parent.parent / "pipeline"
STAGES = ("build", "dispatch", "infra", "evidence", "publish", "verify", "release", "attest", "cli")


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


def _package_imports(package: str) -> set[str]:
    root = PIPELINE / package
    files = [root] if root.suffix == ".py" else sorted(root.rglob("*.py"))
    return set().union(*(_imports(f) for f in files))


@pytest.mark.parametrize("module", ["contracts.py", "documents.py", "layout.py", "scoring.py", "strictjson.py"])
def test_the_document_layer_imports_no_stage(module: str) -> None:
    stages = {name for name in _imports(PIPELINE / module) if name.count(".") >= 1 and name.split(".")[1] in STAGES}
    assert stages == set(), f"{module} must not depend on a stage: {sorted(stages)}"


@pytest.mark.parametrize(("package", "forbidden"), [
    ("evidence", ("pipeline.verify", "pipeline.publish", "pipeline.release")),
    ("verify", ("pipeline.publish", "pipeline.release", "pipeline.evidence.artifacts")),
])
def test_no_import_runs_back_up_the_chain(package: str, forbidden: tuple[str, ...]) -> None:
    back = sorted(name for name in _package_imports(package) if name.startswith(forbidden))
    assert back == [], f"pipeline/{package} imports {back}"


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
