"""One home for the infra policy: the infra repository's ``policies/infra.yaml``.

The host's copy (``/etc/benchseal/infra.yaml``, what accept, the worker and the seal wrappers read)
is only ever that file: benchmark.yml's accept step, on the host's own runner, sends the sha256 of
the file at the dispatching commit, and accept refuses the run unless the host's file has exactly
that digest. A policy edited on the host but not in the repository (or a repository change not yet
installed on the host) is refused before anything is queued, in one line naming both digests. The
suites need no digest of their own: the policy pins each suite's dataset by content digest, which
the worker checks at start and again for every run.

The worker runs what is installed, without a restart (``PolicySource``): it hashes the file at every claim
and loads it again when the digest changed; a new file that does not load stops all claims and the policy
loaded before is never used in its place. Its log says so once per distinct failure (and once when the file
loads again); the worker records the line with its heartbeat, where ``benchseal infra status`` and
``benchseal doctor host`` show it. A run accept checked against a
digest (recorded in the queue with its ``accepted`` event) is planned, run and graded only under a loaded
policy of exactly that digest (``check_accepted_policy``); the digest of the policy that graded a run is in
its grading, summary.json, the test-result statement and the release body.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from pipeline.core.digests import validate_digest
from pipeline.core.errors import CheckFailed, PolicyNotLoaded, PolicyRefused, ValidationError
from pipeline.infra.intake.policy import POLICY_PATH, InfraPolicy, load_policy, policy_bytes_digest

log = logging.getLogger("benchseal.policy")

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
    return policy_bytes_digest(data)


def check_policy_home(path: Path | None, expected: str) -> Path:
    """The policy file that will be read has the dispatching commit's digest ``expected``; CheckFailed otherwise."""
    validate_digest(expected, "--policy-digest")
    file = policy_file(path)
    _refuse_other(file, policy_digest(file), expected)
    return file


def check_loaded_policy(policy: InfraPolicy, file: Path, expected: str) -> None:
    """``policy``, as loaded from ``file`` after ``check_policy_home``, still has ``expected``: the bytes parsed
    are the bytes checked (the file was not replaced in between)."""
    _refuse_other(file, policy.digest, expected)


def _refuse_other(file: Path, actual: str | None, expected: str) -> None:
    if actual != expected:
        raise CheckFailed(f"policy: {file} has digest {actual}, not the infra repository's policies/infra.yaml at the "
                          f"dispatching commit ({expected}): install that file on the host "
                          "(docs/host.md 'One home for the policy'); a policy edited on the host alone is never used")


def accepted_policy_problem(accepted: str | None, policy: InfraPolicy) -> str | None:
    """Why ``policy`` may not run or grade a run accepted under the digest ``accepted`` (None: it may; a run
    accepted without a checked digest is not held to one)."""
    if accepted is None or policy.digest == accepted:
        return None
    loaded = policy.digest or "a policy not read from a file"
    return (f"policy: the run was accepted under infra policy {accepted} and this worker has loaded {loaded}: "
            "a run is never run or graded under another policy than the one accept checked (dispatch it again)")


def check_accepted_policy(accepted: str | None, policy: InfraPolicy) -> None:
    """PolicyRefused unless ``policy`` is the one the run was accepted under (``accepted_policy_problem``)."""
    problem = accepted_policy_problem(accepted, policy)
    if problem is not None:
        raise PolicyRefused(problem)


class PolicySource:
    """The worker's policy: the installed file, re-read at every claim without a restart.

    ``current()`` hashes the file (``policy_digest``) and returns the policy loaded before while the digest is
    unchanged; a changed file is loaded and validated again. When it does not load, the first call raises the
    loader's ValidationError (a worker that starts with a bad policy is a usage error), every later one
    PolicyNotLoaded: nothing is claimed, and the policy loaded before is never used in its place. Each distinct
    refusal is logged once, and so is the file loading again: the claim loops poll every few seconds."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = policy_file(path)
        self._lock = threading.Lock()  # the worker's claim loops share one source
        self._policy: InfraPolicy | None = None
        self._refused: str | None = None  # the refusal logged last (None: the file loads)

    def current(self) -> InfraPolicy:
        with self._lock:
            before = self._policy
            try:
                if before is not None and policy_digest(self.path) == before.digest:
                    return before
                policy = load_policy(self.path)
            except ValidationError as exc:
                if before is None:
                    raise
                refused = PolicyNotLoaded(f"policy {self.path} changed and is refused, so no run is claimed until it "
                                          f"loads (the policy loaded before, {before.digest}, is not used in its "
                                          f"place): {exc.diagnostics()}")
                if str(refused) != self._refused:
                    log.error("%s", refused)
                    self._refused = str(refused)
                raise refused from None
            if self._refused is not None:
                log.warning("policy %s loads again (%s): claims resume", self.path, policy.digest)
                self._refused = None
            elif before is not None:
                log.warning("policy %s changed: %s -> %s, used from this claim on", self.path, before.digest,
                            policy.digest)
            self._policy = policy
            return policy
