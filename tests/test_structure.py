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


@pytest.mark.parametrize("module", ["contracts.py", "documents.py", "layout.py"])
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
