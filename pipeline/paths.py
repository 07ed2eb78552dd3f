"""Where benchseal keeps its local state (registry data, caches, tools, runs).

Everything lives under one directory, ``$BENCHSEAL_HOME`` or ``<repo>/.benchseal``,
so a clone is self-contained and ``rm -rf .benchseal`` resets the machine state
that benchseal owns (never anything it did not create).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def home() -> Path:
    configured = os.environ.get("BENCHSEAL_HOME")
    return Path(configured).resolve() if configured else REPO_ROOT / ".benchseal"


def state_dir(*parts: str) -> Path:
    path = home().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
