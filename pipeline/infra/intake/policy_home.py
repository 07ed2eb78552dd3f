"""One home for the infra policy: the infra repository's ``policies/infra.yaml``.

The host's copy (``/etc/benchseal/infra.yaml``, what accept, the worker and the seal wrappers read)
is only ever that file: benchmark.yml's accept step, on the host's own runner, sends the sha256 of
the file at the dispatching commit, and accept refuses the run unless the host's file has exactly
that digest. A policy edited on the host but not in the repository (or a repository change not yet
installed on the host) is refused before anything is queued, in one line naming both digests. The
suites need no digest of their own: the policy pins each suite's dataset by content digest, which
the worker checks at start and again for every run.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pipeline.core.digests import validate_digest
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.infra.intake.policy import POLICY_PATH

# The policy model's own bound on the file (policy._MAX_POLICY_BYTES); hashing reads no more.
_MAX_BYTES = 65536


def policy_file(path: Path | None = None) -> Path:
    """The policy ``load_policy(path)`` reads: ``path``, else $BENCHSEAL_INFRA_POLICY, else the shipped one."""
    if path is not None:
        return path
    configured = os.environ.get("BENCHSEAL_INFRA_POLICY")
    if configured is not None and not os.path.isabs(configured):
        raise ValidationError("BENCHSEAL_INFRA_POLICY", "must be an absolute path", configured)
    return Path(configured) if configured is not None else POLICY_PATH


def policy_digest(path: Path) -> str:
    """``sha256:HEX`` of the file's bytes (what ``sha256sum policies/infra.yaml`` prints, prefixed)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_BYTES + 1)
    except OSError as exc:
        raise ValidationError(f"policy {path.name}", f"cannot be read: {exc.strerror or type(exc).__name__}",
                              str(path)) from None
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_policy_home(path: Path | None, expected: str) -> Path:
    """The policy file that will be read has the dispatching commit's digest ``expected``; CheckFailed otherwise."""
    validate_digest(expected, "--policy-digest")
    file = policy_file(path)
    actual = policy_digest(file)
    if actual != expected:
        raise CheckFailed(f"policy: {file} has digest {actual}, not the infra repository's policies/infra.yaml at the "
                          f"dispatching commit ({expected}): install that file on the host "
                          "(docs/host.md 'One home for the policy'); a policy edited on the host alone is never used")
    return file
