"""Bundles the project data into the wheel as package data (``pipeline/_project``).

An installed benchseal then finds images/, policies/, suites/, deploy/ and the Node
package files (package.json, package-lock.json) inside its own package, never
through site-packages' parent. Editable installs keep reading the checkout.
Metadata lives in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DATA = ("images", "policies", "suites", "deploy", "package.json", "package-lock.json")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules", ".*")


class BuildPyWithProject(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the checkout itself is the project directory
        target = Path(self.build_lib) / "pipeline" / "_project"
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for name in DATA:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, target / name, ignore=SKIP)
            elif source.is_file():
                shutil.copy2(source, target / name)
            else:
                raise SystemExit(f"setup.py: {name} is missing from {ROOT}; cannot bundle the project data")


setup(cmdclass={"build_py": BuildPyWithProject})
