"""Shared test setup. Stage fixtures live in tests/fixtures/*.py (loaded below)
and tests/<stage>/conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("no_proxy", "127.0.0.1,localhost")
os.environ.setdefault("HARBOR_TELEMETRY", "0")

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}" for p in (Path(__file__).parent / "fixtures").glob("*.py") if p.stem != "__init__"
)
