"""Regenerate the hash-pinned locks of images/runner and images/api (maintenance only).

    .venv/bin/python images/relock.py

Versions follow requirements/constraints.txt (what the host venv runs), so the
images and the host agree. Commit the resulting *.lock files.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.imaging.wheels import write_lock  # noqa: E402

CONSTRAINTS = ROOT / "requirements" / "constraints.txt"


def main() -> None:
    for image in ("runner", "api"):
        spec = tomllib.loads((ROOT / "images" / image / "image.toml").read_text())
        for layer in spec["layers"]:
            for lock in layer.get("locks", ()):
                out = ROOT / "images" / image / lock["lock"]
                source = out.with_suffix(".in")
                reqs = [line.strip() for line in source.read_text().splitlines() if line.strip() and not line.startswith("#")]
                if lock["lock"] == "compose.lock":
                    # wheel (Python part) and sdist (the binary) of the same release, both hashed
                    write_lock(reqs, out, lock["python_version"], lock["platforms"], no_deps=True)
                    sdist = out.with_suffix(".sdist.tmp")
                    write_lock(reqs, sdist, lock["python_version"], (), binary=False, no_deps=True)
                    _merge(out, sdist)
                else:
                    write_lock(reqs, out, lock["python_version"], lock["platforms"], constraints=CONSTRAINTS)
                print(f"wrote {out.relative_to(ROOT)}")


def _merge(lock: Path, extra: Path) -> None:
    lines = [line for line in lock.read_text().splitlines() if line and not line.startswith("#")]
    header = [line for line in lock.read_text().splitlines() if line.startswith("#")]
    more = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in extra.read_text().splitlines() if line and not line.startswith("#")}
    merged = [f"{line} {more.pop(line.split(' ', 1)[0], '')}".rstrip() for line in lines]
    if more:
        raise SystemExit(f"sdist and wheel versions differ: {sorted(more)}")
    lock.write_text("\n".join([*header, "# Each line carries the wheel hash and the sdist hash.", *merged]) + "\n")
    extra.unlink()


if __name__ == "__main__":
    main()
