"""``benchseal verify``: the evidence archive holds exactly what evidence-SHA256SUMS lists.

SHA256SUMS (checked against its bundle first) covers ``evidence-logs.tar.gz`` and
``evidence-SHA256SUMS``; this binds the two: every member a regular file evidence-SHA256SUMS lists,
with its sha256, each listed file present once (``pipeline.core.evidence_archive``, the format's one
home). A release without the archive (sealed before it existed) has nothing to check here; one that
lists it and lacks it was already refused by SHA256SUMS.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import CheckFailed, ChecksumMismatch
from pipeline.core.evidence_archive import check_archive
from pipeline.core.layout import EVIDENCE_ARCHIVE, NESTED_SUMS, parse_checksums

__all__ = ["verify_evidence_archive"]


def verify_evidence_archive(directory: Path) -> bool:
    """Check ``directory``'s evidence archive against its evidence-SHA256SUMS (both already covered by a
    verified SHA256SUMS); False when the release carries no archive. ChecksumMismatch names the file."""
    archive = directory / EVIDENCE_ARCHIVE
    if not archive.is_file():
        return False
    sums = directory / NESTED_SUMS
    if not sums.is_file():
        raise ChecksumMismatch(f"{EVIDENCE_ARCHIVE}: present, but {NESTED_SUMS} (what it must hold) is missing",
                               subject=EVIDENCE_ARCHIVE)
    try:
        listed = parse_checksums(sums.read_bytes(), NESTED_SUMS, nested=True)
        check_archive(archive, listed)
    except ChecksumMismatch:
        raise
    except CheckFailed as exc:
        raise ChecksumMismatch(str(exc), subject=EVIDENCE_ARCHIVE) from None
    return True
