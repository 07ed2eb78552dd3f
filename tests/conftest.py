"""Shared fixtures. Stage fixtures live in tests/<stage>/conftest.py."""

from __future__ import annotations

import os

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("no_proxy", "127.0.0.1,localhost")
os.environ.setdefault("HARBOR_TELEMETRY", "0")
