"""One writer of an image digest's tags at a time on this machine.

The registry here has no referrers API, so an image's signatures, attestations and attached
results live under tags derived from its digest (cosign's ``sha256-<hex>.sig`` / ``.att``, the
referrers fallback index ``sha256-<hex>``), and every writer rewrites such a tag whole: read, append,
write. Two writers of one digest at once (two releases of the same tree, test workers signing the
same built images) can each drop the other's entry. Writers on this machine take the digest's lock
first: an ``flock`` on a file named by the digest's reference in a per-user directory of the
system's temp dir (shared by every home and process of the user; the kernel releases it when the
holder exits, however it exits).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.core.digests import ImageRef


@contextmanager
def digest_tags_locked(image: ImageRef) -> Iterator[None]:
    """Hold the lock of ``image``'s digest tags (its registry, repository and digest) while the block runs."""
    directory = Path(tempfile.gettempdir()) / f"benchseal-tag-locks-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    name = hashlib.sha256(image.ref.encode()).hexdigest()
    fd = os.open(directory / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
