"""Fixtures local to the build tests: a frozen snapshot of the app sources.

Other helpers edit and commit the shared tree while tests run, so tests that
compare two builds build both from one snapshot, one SourceInfo and one epoch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.core import paths
from pipeline.core.contracts import SourceInfo
from pipeline.imaging.images import APP_DIRS, source_info

FROZEN_EPOCH = 1767225600


@pytest.fixture(scope="session")
def app_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("app-snapshot")
    for name in APP_DIRS:
        if (paths.REPO_ROOT / name).is_dir():
            shutil.copytree(paths.REPO_ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


@pytest.fixture(scope="session")
def frozen_source() -> SourceInfo:
    return source_info()
