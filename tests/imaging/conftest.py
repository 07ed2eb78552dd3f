"""Fixtures local to the build tests: a frozen snapshot of the app sources.

Other helpers edit and commit the shared tree while tests run, so tests that
compare two builds build both from one snapshot, one SourceInfo and one epoch.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from pipeline.core import paths
from pipeline.core.contracts import SourceInfo
from pipeline.imaging.images import APP_DIRS, source_info
from tests.registry.helpers import serve_http

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


class _LyingRegistry(BaseHTTPRequestHandler):
    """Has every blob, accepts every manifest, and answers another digest for it (what a broken mirror or
    proxy could do): the push must fail on the digest it was not given."""

    def _answer(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._answer(200)

    def do_HEAD(self) -> None:
        self._answer(200)

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(201, {"Docker-Content-Digest": "sha256:" + "0" * 64})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def lying_registry() -> Iterator[str]:
    with serve_http(_LyingRegistry) as address:
        yield address
