"""require_repo_digest: the local image must carry exactly our ref, matched by repository."""

from __future__ import annotations

import pytest

from pipeline.core.digests import parse_ref, require_repo_digest
from pipeline.core.errors import CheckFailed

OURS = parse_ref("127.0.0.1:5055/benchseal/runner@sha256:" + "a" * 64)
OTHER_DIGEST = "sha256:" + "b" * 64


def test_ours_found_among_several_not_first() -> None:
    require_repo_digest(OURS, [f"127.0.0.1:5055/other/repo@{OTHER_DIGEST}", OURS.ref])


@pytest.mark.parametrize("listed", [
    [],
    [f"127.0.0.1:5055/benchseal/runner@{OTHER_DIGEST}"],           # same repository, other digest
    [f"127.0.0.1:5056/benchseal/runner@{OURS.digest}"],            # same digest, other registry
    [f"127.0.0.1:5055/benchseal/runner-base@{OURS.digest}"],       # same digest, other repository
])
def test_anything_but_our_exact_ref_is_refused(listed: list[str]) -> None:
    with pytest.raises(CheckFailed, match="refusing to use it"):
        require_repo_digest(OURS, listed)
