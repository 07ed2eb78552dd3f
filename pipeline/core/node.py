"""The Node helpers' packages: found through an explicit setting, never the script's location.

The private Sigstore server (``pipeline/local/sigstore_server.js``) and the
sigstore-js verifier (``pipeline/verify/sigstore_js_verify.js``) ship inside the Python
package; an installed wheel has no ``node_modules`` beside them. Their packages come from:

1. ``$BENCHSEAL_NODE_MODULES``: a ``node_modules`` directory (``npm ci`` of package-lock.json);
2. ``<project>/node_modules``: the project directory (a checkout, ``--project-dir`` /
   ``$BENCHSEAL_PROJECT_DIR``).

The launcher hands the directory to node as ``NODE_PATH``, after checking that every package
the script needs is there: a missing directory or package is a clear error, before node runs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from pipeline.core import paths
from pipeline.core.errors import InfrastructureError, UsageError

NODE_MODULES_ENV = "BENCHSEAL_NODE_MODULES"


def node_modules() -> Path:
    """The configured node_modules directory (see the module docstring); UsageError when it is missing."""
    configured = os.environ.get(NODE_MODULES_ENV)
    if configured is not None:
        path = Path(configured)
        if not configured or not path.is_absolute() or not path.is_dir():
            raise UsageError(f"${NODE_MODULES_ENV} must name an existing node_modules directory by absolute path "
                             f"(got {configured!r})")
        return path.resolve()
    path = paths.REPO_ROOT / "node_modules"
    if not path.is_dir():
        raise UsageError(
            f"no node_modules for benchseal's Node helpers at {path} ({paths.PROJECT_SOURCE}): run `npm ci` "
            f"in the project directory, or set ${NODE_MODULES_ENV} (or --project-dir CHECKOUT)"
        )
    return path.resolve()


def node_env(packages: Sequence[str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a Node helper needing ``packages``: NODE_PATH = the configured node_modules only."""
    directory = node_modules()
    missing = [name for name in packages if not (directory / name / "package.json").is_file()]
    if missing:
        raise UsageError(f"{directory} lacks the Node packages {', '.join(missing)}: run `npm ci` there "
                         f"(package-lock.json), or point ${NODE_MODULES_ENV} at a complete node_modules")
    env = dict(os.environ if base is None else base)
    env["NODE_PATH"] = str(directory)
    return env


def node_binary() -> str:
    node = shutil.which("node")
    if node is None:
        raise InfrastructureError("node is not installed (run `make setup`)")
    return node
