"""A --trusted-root that is not a Sigstore trusted root is a usage error naming the option (exit 2, one line),
whatever sigstore-python raises while loading it: the verifier catches sigstore's Error, ValueError and
OSError by name (no bare ``except Exception``), so each of those must still end as that one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import ValidationError
from pipeline.core.layout import CHECKSUMS, CHECKSUMS_BUNDLE, SUMMARY
from pipeline.verify.release import verify_release

REPO = Path(__file__).resolve().parents[2]
PUBLIC_GOOD_ROOT = REPO / "tests" / "data" / "sigstore" / "public-good" / "trusted_root.json"


def _no_logs(path: Path) -> None:  # sigstore's VerificationError: a root without transparency logs
    root = json.loads(PUBLIC_GOOD_ROOT.read_text())
    root["tlogs"] = []
    path.write_text(json.dumps(root))


ROOTS = {
    "not JSON": lambda path: path.write_bytes(b"\xffnot json"),  # ValueError
    "JSON of another shape": lambda path: path.write_text('{"mediaType": 5}'),  # the model's ValueError
    "another media type": lambda path: path.write_text(json.dumps(  # sigstore's Error
        {**json.loads(PUBLIC_GOOD_ROOT.read_text()), "mediaType": "application/x-other"})),
    "no transparency log": _no_logs,
    "a directory": lambda path: path.mkdir(),  # OSError
}


@pytest.fixture()
def release(tmp_path: Path) -> Path:
    # The trusted root is loaded once the release's three top files are there, before any is read.
    directory = tmp_path / "release"
    directory.mkdir()
    for name in (SUMMARY, CHECKSUMS, CHECKSUMS_BUNDLE):
        (directory / name).write_text("{}\n")
    return directory


@pytest.mark.parametrize("case", list(ROOTS))
def test_a_root_that_is_not_a_trusted_root_is_a_usage_error(case: str, release: Path, tmp_path: Path) -> None:
    root = tmp_path / "root.json"
    ROOTS[case](root)
    with pytest.raises(ValidationError) as caught:
        verify_release(release, repository="acme/widget", tag="v9.9.9", trusted_root=root, offline=True)
    assert caught.value.field == "--trusted-root" and caught.value.exit_code == 2


def test_the_cli_says_so_in_one_line(release: Path, tmp_path: Path) -> None:
    root = tmp_path / "root.json"
    _no_logs(root)
    done = subprocess.run([sys.executable, "-m", "pipeline", "verify", str(release), "--repo", "acme/widget",
                           "--tag", "v9.9.9", "--trusted-root", str(root), "--offline"],
                          capture_output=True, text=True, check=False, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("benchseal: error: invalid --trusted-root: is not a Sigstore trusted root"), line
