"""CLI verbs, one module per verb; entry points ``main`` (all verbs), ``runner_main``, ``api_main``.

``benchseal --project-dir DIR VERB ...`` sets BENCHSEAL_PROJECT_DIR here, before any verb module
(and so ``pipeline.core.paths``, which resolves its paths at import) is imported: every entry point
imports this package first.
"""

from __future__ import annotations

import os
import sys


def _apply_project_dir(argv: list[str]) -> None:
    for index, arg in enumerate(argv):
        if not arg.startswith("-"):
            return  # options after the verb belong to the verb
        if arg == "--project-dir" and index + 1 < len(argv):
            os.environ["BENCHSEAL_PROJECT_DIR"] = argv[index + 1]
            return
        if arg.startswith("--project-dir="):
            os.environ["BENCHSEAL_PROJECT_DIR"] = arg.split("=", 1)[1]
            return


if os.path.basename(sys.argv[0]) in ("benchseal", "__main__.py"):
    _apply_project_dir(sys.argv[1:])
