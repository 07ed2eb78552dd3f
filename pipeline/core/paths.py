"""Where benchseal keeps its local state (registry data, caches, tools, runs).

Project data (image specs, policies, suites) is read from the project directory
(see ``_project_dir``). State lives under one directory, ``$BENCHSEAL_HOME`` or
``<project>/.benchseal`` (``~/.local/state/benchseal`` for an installed wheel's
bundled data), so a clone is self-contained and ``rm -rf .benchseal`` resets the machine state
that benchseal owns (never anything it did not create).
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # pipeline/, this file being pipeline/core/paths.py
# An installed wheel carries images/, policies/, suites/ and the Node package files here (setup.py).
BUNDLED_PROJECT = _PACKAGE_DIR / "_project"
DATA_DIRS = ("images", "policies", "suites")
PROJECT_DIR_ENV = "BENCHSEAL_PROJECT_DIR"


def _project_dir() -> tuple[Path, str]:
    """(project directory, where it came from).

    1. ``$BENCHSEAL_PROJECT_DIR`` (also set by ``benchseal --project-dir``);
    2. the data bundled in an installed wheel (``pipeline/_project``);
    3. the source checkout this package runs from (no bundle there: ``pip install -e`` or ``python -m``).
    The parent of an installed package (site-packages) is never looked at.
    """
    configured = os.environ.get(PROJECT_DIR_ENV)
    if configured:
        return Path(configured).resolve(), PROJECT_DIR_ENV
    if BUNDLED_PROJECT.is_dir():
        return BUNDLED_PROJECT, "package data"
    return _PACKAGE_DIR.parent, "source checkout"


# Named REPO_ROOT for history: the project directory (images/, policies/, suites/, package.json).
REPO_ROOT, PROJECT_SOURCE = _project_dir()


def project_problem() -> str | None:
    """Why REPO_ROOT cannot serve as the project directory, or None."""
    missing = [name for name in DATA_DIRS if not (REPO_ROOT / name).is_dir()]
    if missing:
        return f"{REPO_ROOT} ({PROJECT_SOURCE}) has no {', '.join(m + '/' for m in missing)}"
    return None


def home() -> Path:
    """``$BENCHSEAL_HOME``; else ``<project>/.benchseal`` for a checkout; else the user's state dir.

    Installed package data is read-only: state never goes inside site-packages.
    """
    configured = os.environ.get("BENCHSEAL_HOME")
    if configured:
        return Path(configured).resolve()
    if PROJECT_SOURCE == "package data":
        xdg = os.environ.get("XDG_STATE_HOME")
        return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "benchseal"
    return REPO_ROOT / ".benchseal"


def state_dir(*parts: str) -> Path:
    path = home().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def local_trusted_root() -> Path:
    """Where the private Sigstore instance of this state dir keeps its trusted root (pipeline/local/sigstore.py
    writes it there): the root a local-profile release's printed commands name when none was given."""
    return home() / "sigstore" / "trusted_root.json"
