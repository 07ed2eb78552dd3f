"""Host tools the suite needs. Every one is installed by `make setup` (scripts/setup.sh), so a
missing tool fails the test that needs it, naming the package; it never turns into a silent skip."""

from __future__ import annotations

import shutil

import pytest


def require(command: str, package: str) -> str:
    path = shutil.which(command)
    if path is None:
        pytest.fail(f"{command} is not installed: `make setup` (scripts/setup.sh) installs it "
                    f"(Debian package {package})", pytrace=False)
    return path
