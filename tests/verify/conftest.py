"""What the verify tests share: the local Sigstore instance's trusted root, and ``verify_release`` of a
release the suite signs (tests.fixtures.sigstore: acme/widget at v9.9.9) against it, offline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pytest

from pipeline.verify.release import VerifiedRelease, verify_release

SOURCE_REPO, SOURCE_TAG = "acme/widget", "v9.9.9"

Verify = Callable[[Path], VerifiedRelease]


class _Instance(Protocol):
    trusted_root: Path


@pytest.fixture()
def root(sigstore_instance: _Instance) -> Path:
    return sigstore_instance.trusted_root


@pytest.fixture()
def verify(root: Path) -> Verify:
    """``verify(release)``: the release of SOURCE_REPO at SOURCE_TAG against the local instance's root."""

    def run(release: Path) -> VerifiedRelease:
        return verify_release(release, repository=SOURCE_REPO, tag=SOURCE_TAG, trusted_root=root, offline=True)

    return run
