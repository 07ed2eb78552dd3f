"""Run the emulator for the local demo: ``python -m tests.doubles.github --state FILE [--repo OWNER/NAME]...``

Writes ``{"base_url", "token", "pid"}`` to FILE (mode 0600, atomically) and
serves until SIGTERM/SIGINT. The token is the emulator's own, valid nowhere else.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path

from pipeline.core.fsutil import atomic_write_text, canonical_json
from tests.doubles.github.emulator import GitHubEmulator


def _write_private(path: Path, data: dict[str, object]) -> None:
    # It holds the emulator's token: 0600 from creation (mkstemp) to the final name.
    atomic_write_text(path, canonical_json(data), mode=0o600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.doubles.github")
    parser.add_argument("--state", type=Path, required=True, help="where to write base_url/token/pid")
    parser.add_argument("--repo", action="append", default=[], help="repository to create (repeatable)")
    parser.add_argument("--workflow", action="append", default=[], metavar="OWNER/NAME=FILE",
                        help="register a workflow file in a repository (repeatable)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with GitHubEmulator() as emulator:
        for repo in args.repo:
            emulator.add_repo(repo)
        for item in args.workflow:
            repo, _, file = item.partition("=")
            path = Path(file)
            emulator.add_workflow(repo, f".github/workflows/{path.name}", path.read_text(encoding="utf-8"))
        _write_private(args.state, {"base_url": emulator.base_url, "token": emulator.token, "pid": os.getpid()})
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
