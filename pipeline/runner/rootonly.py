"""The grader's root-only rule for a verifier's ``/tests`` and verifier dir, in one place.

Code run as the candidate user must not read the suite's tests (the expected answers) nor plant files in the
verifier dir (a bind mount of the trial dir). Two paths apply this one definition, so changing it here changes
both: the engine environment's archive entries (``EngineEnvironment.upload_root_only``: each entry carries the
owner and mode) and the grader's chown/chmod command on any other environment (``pipeline.runner.grader``).
"""

from __future__ import annotations

import shlex

OWNER = (0, 0)  # uid, gid of /tests, of everything under it, and of the verifier dir
TESTS_MODE = 0o700  # /tests itself
CLOSED_BITS = 0o077  # taken from every entry under /tests: no group or other access at all
VERIFIER_DIR_MODE = 0o755  # root's, readable, not writable by the candidate


def closed_mode(mode: int) -> int:
    """An entry's mode under ``/tests``: its own, less ``CLOSED_BITS``."""
    return mode & ~CLOSED_BITS


def close_command(tests: str, verifier_dir: str) -> str:
    """The shell command (run as root) that applies the rule to an uploaded ``tests`` and to ``verifier_dir``."""
    owner = "{}:{}".format(*OWNER)
    t, v = shlex.quote(tests), shlex.quote(verifier_dir)
    return (f"chown -R {owner} {t} && chmod -R {_removal(CLOSED_BITS)} {t} && chmod {TESTS_MODE:o} {t} "
            f"&& chown {owner} {v} && chmod {VERIFIER_DIR_MODE:o} {v}")


def _removal(bits: int) -> str:
    """``bits`` (permission bits only) as chmod's symbolic removal: 0o077 is ``g-rwx,o-rwx``."""
    if not 0 < bits <= 0o777:
        raise ValueError(f"CLOSED_BITS {bits:o}: permission bits (1..777) expected")
    parts = []
    for who, shift in (("u", 6), ("g", 3), ("o", 0)):
        letters = "".join(letter for letter, bit in (("r", 4), ("w", 2), ("x", 1)) if bits >> shift & bit)
        if letters:
            parts.append(f"{who}-{letters}")
    return ",".join(parts)
