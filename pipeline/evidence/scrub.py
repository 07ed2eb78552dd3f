"""Nothing published carries an infra host's path or a secret: the one home of that rewrite.

Harbor's trial dirs and the runner's logs name the run directory on the host that ran them
(``/srv/benchseal/infra/runs/<run_id>/batches/.../suite/<task>`` in result.json, config.json,
lock.json, runner.log). Sealing rewrites every absolute path into the run directory, on whichever
host (the run id is one path component of it, unique to the run), as a path relative to the run
(``batches/.../suite/<task>``; the directory itself is ``.``); a path from a directory above the run
dir that those paths reveal (two components deep at least: ``/srv/benchseal``, as in an engine's
``mkdir /srv/benchseal: permission denied``) as ``[HOST]...``; and every secret value it is given as
``[REDACTED]``; in every evidence file, before trial-results.json, evidence-SHA256SUMS and the
evidence archive are written: the sums are over what is published. Bytes, not text: a binary file
(a .pyc) is rewritten too, so a secret never survives in one (such a file may no longer load; it is
evidence, never executed).

Then it fails closed: an evidence file that still names the run directory after a ``/`` (a path the
rewrite did not take, e.g. a relative ``runs/<run_id>``) or holds a secret is refused in one line
naming the file, and nothing is signed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from pipeline.core.errors import CheckFailed
from pipeline.core.fsutil import NotRegularFile, atomic_write_bytes, name_problem, open_regular
from pipeline.core.layout import nested_files

__all__ = ["HOST", "REDACTED", "host_ancestors", "host_path_pattern", "scrub_bytes", "scrub_evidence", "secret_values"]

REDACTED = b"[REDACTED]"
HOST = b"[HOST]"  # what an ancestor of the run dir (the host's state dir, its parents) becomes
# What a path component is made of when it is not the end of a path (a quote, space, comma ... ends it).
_COMPONENT = rb"[A-Za-z0-9._@+~%=-]+"


def host_path_pattern(run_id: str) -> re.Pattern[bytes]:
    """An absolute path whose last component so far is ``run_id`` (the run dir on any host), and the
    rest of the path below it (group 1, possibly empty)."""
    # grading.json's run id, one plain path component (contracts' run-<20 hex> for every real run).
    if not run_id or "/" in run_id or name_problem(run_id):
        raise CheckFailed(f"run_id: {run_id!r} is not one plain path component")
    run = re.escape(run_id.encode())
    return re.compile(rb"(?<![A-Za-z0-9._@+~%=-])(/(?:" + _COMPONENT + rb"/)*)" + run
                      + rb"(?![A-Za-z0-9._@+~%=-])((?:/" + _COMPONENT + rb")*/?)")


def _relative(match: re.Match[bytes]) -> bytes:
    rest = match.group(2).strip(b"/")
    return rest if rest else b"."


def host_ancestors(data: bytes, run_id: str) -> set[bytes]:
    """The directories above the run dir that ``data`` names in a path into it, at least two components
    deep (``/srv/benchseal/infra/runs`` gives it, ``/srv/benchseal/infra`` and ``/srv/benchseal``): a
    message naming one of them (an engine's ``mkdir /srv/benchseal: permission denied``) names the host."""
    found: set[bytes] = set()
    for match in host_path_pattern(run_id).finditer(data):
        parts = [p for p in match.group(1).split(b"/") if p]
        found.update(b"/" + b"/".join(parts[:depth]) for depth in range(2, len(parts) + 1))
    return found


def secret_values(names: Iterable[str], environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The values of the environment variables ``names`` that are set (the infra policy's secret_env)."""
    env = os.environ if environ is None else environ
    return tuple(sorted({env[name] for name in names if env.get(name)}))


def scrub_bytes(data: bytes, run_id: str, secrets: Iterable[str] = (), ancestors: Iterable[bytes] = ()) -> bytes:
    """``data`` with every secret redacted, every absolute path into the run dir made run-relative, and
    every path that starts at one of the run dir's ``ancestors`` (``host_ancestors``) starting at ``[HOST]``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):  # longest first: no partial leftovers
        data = data.replace(secret.encode(), REDACTED)
    data = host_path_pattern(run_id).sub(_relative, data)
    # Shortest first: [HOST] always stands for the topmost directory revealed (``/srv/benchseal``), so
    # ``/srv/benchseal/infra/sandbox`` reads ``[HOST]/infra/sandbox``.
    for ancestor in sorted(set(ancestors), key=lambda a: (len(a), a)):
        data = re.sub(rb"(?<![A-Za-z0-9._@+~%=-])" + re.escape(ancestor) + rb"(?![A-Za-z0-9._@+~%=-])", HOST, data)
    return data


def _leftover(data: bytes, run_id: str, secrets: Iterable[str]) -> str | None:
    if re.search(b"/" + re.escape(run_id.encode()) + rb"(?![A-Za-z0-9._@+~%=-])", data):
        return f"still names the run directory ({run_id}) in a path"
    if any(secret and secret.encode() in data for secret in secrets):
        return "still holds a secret value"
    return None


def _read(path: Path, name: str) -> bytes:
    try:
        handle, _ = open_regular(path)
    except NotRegularFile:
        raise CheckFailed(f"{name}: not a regular file") from None
    except OSError as exc:  # a link (ELOOP: O_NOFOLLOW) or a file gone since the listing
        raise CheckFailed(f"{name}: not a regular file ({exc.strerror})") from None
    with handle:
        return handle.read()


def scrub_evidence(artifacts: Path, run_id: str, secrets: Iterable[str] = ()) -> list[str]:
    """Rewrite every nested evidence file under ``artifacts`` (``layout.nested_files``) in place as
    ``scrub_bytes`` says, with the run dir's ancestors any of them names (``host_ancestors``); the names of
    the files it changed. CheckFailed when one still names the run dir or a secret afterwards, or cannot be
    read as a regular file."""
    secrets = tuple(s for s in secrets if s)
    changed: list[str] = []
    if not artifacts.is_dir():
        return changed
    files = [(path, path.relative_to(artifacts).as_posix()) for path in nested_files(artifacts)]
    ancestors: set[bytes] = set()
    for path, name in files:
        ancestors |= host_ancestors(_read(path, name), run_id)
    for path, name in files:
        data = _read(path, name)
        scrubbed = scrub_bytes(data, run_id, secrets, ancestors)
        problem = _leftover(scrubbed, run_id, secrets)
        if problem:
            raise CheckFailed(f"{name}: {problem} after the rewrite; evidence that would publish a host path or "
                              "a secret is not sealed")
        if scrubbed != data:
            atomic_write_bytes(path, scrubbed)
            changed.append(name)
    return changed
