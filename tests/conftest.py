"""Shared test setup. Stage fixtures live in tests/fixtures/*.py (loaded below)
and tests/<stage>/conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import settings

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("no_proxy", "127.0.0.1,localhost")
os.environ.setdefault("HARBOR_TELEMETRY", "0")

# One Hypothesis profile for every module (loaded before any test module is imported, so
# each @settings(...) inherits it): no per-example deadline, which a busy 2-core machine
# would trip at random; more examples than Hypothesis' default.
settings.register_profile("benchseal", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("BENCHSEAL_HYPOTHESIS_PROFILE", "benchseal"))

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}" for p in (Path(__file__).parent / "fixtures").glob("*.py") if p.stem != "__init__"
)
