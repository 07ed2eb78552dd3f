"""Image checks that passed, remembered by their exact inputs: verify once per digest, not per call.

A cosign check of a digest-pinned image is a function of its argv (the digest, the identity, the
issuer, the attestation type), the trust root it is given (its bytes) and the cosign binary. Once it
has passed it passes again: the digest names immutable content, and a signature logged in the
transparency log cannot be taken back. So a pass is recorded under the sha256 of those inputs and an
identical later check is answered from the record:

* only passes are recorded: a refusal may turn into a pass (a signature added later, a registry that
  was down), so refusals always run again;
* a record is a file named by the key under ``<home>/cache/image-checks``, written atomically and
  holding the key itself, so a truncated or foreign file is simply not a record;
* a record older than ``MAX_AGE_SECONDS`` is not used: public-good's trust root comes from cosign's
  TUF cache, which the key cannot see, and may change;
* a check without a digest-pinned ref is never recorded (``record`` refuses it).

The worker (before it runs a runner), the local release's attest step and its consumer checks share
the records of one home; on an infra host the worker's home holds them.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

from pipeline.core.digests import parse_ref
from pipeline.core.errors import ValidationError
from pipeline.core.fsutil import atomic_write_text
from pipeline.core.paths import state_dir

MAX_AGE_SECONDS = 24 * 3600
_DIRECTORY = ("cache", "image-checks")


def check_key(args: Sequence[str], cosign: Path, trusted_root: Path | None) -> str | None:
    """The record key of the cosign check ``args`` (its argv without the binary), or None when the
    check names no digest-pinned image (then it is never recorded)."""
    try:
        parse_ref(args[-1] if args else "", "image")
    except ValidationError:
        return None
    stat = cosign.stat()
    inputs = {
        "args": list(args),
        "cosign": [str(cosign.resolve()), stat.st_size, stat.st_mtime_ns],
        "trusted_root": None if trusted_root is None else hashlib.sha256(trusted_root.read_bytes()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode("utf-8")).hexdigest()


def _path(key: str) -> Path:
    return state_dir(*_DIRECTORY) / f"{key}.json"


def passed_before(key: str | None) -> bool:
    """Whether the check of ``key`` passed within ``MAX_AGE_SECONDS``."""
    if key is None:
        return False
    try:
        record = json.loads(_path(key).read_text("utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict) or record.get("key") != key:
        return False
    at = record.get("passed_at")
    return isinstance(at, (int, float)) and 0 <= time.time() - at <= MAX_AGE_SECONDS


def record_pass(key: str | None) -> None:
    """Remember that the check of ``key`` passed (a home that cannot be written keeps no record)."""
    if key is None:
        return
    try:
        atomic_write_text(_path(key), json.dumps({"key": key, "passed_at": time.time()}))
    except OSError:
        pass  # a record only saves a later check; the check itself has passed
