"""Issue 37.5: the logs behind the score as one archive asset, and no host path or secret in them.

Fast, no signer (and a public-good release carries no trust files): ``evidence-logs.tar.gz`` (pipeline.core.evidence_archive) is byte-identical for the same
files whatever their mtimes, modes or creation order; it holds exactly what evidence-SHA256SUMS lists,
relative, regular files only, so the real ``tar`` + ``sha256sum -c`` check it after extraction; SHA256SUMS
lists it; the reader refuses every other shape. The rewrite (pipeline.evidence.scrub): absolute paths
into the run dir become run-relative, secrets are redacted, leftovers are refused.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import cast

import pytest
from sigstore.models import ClientTrustConfig

from pipeline.core.errors import CheckFailed, ChecksumMismatch
from pipeline.core.evidence_archive import archive_bytes, check_archive
from pipeline.core.layout import CHECKSUMS, EVIDENCE_ARCHIVE, NESTED_SUMS, TRUST_FILES, parse_checksums
from pipeline.evidence.artifacts import write_checksums
from pipeline.evidence.scrub import REDACTED, host_ancestors, scrub_bytes, scrub_evidence, secret_values
from pipeline.evidence.signing import Signer
from pipeline.evidence.trust import write_trust_files
from pipeline.verify.archive import verify_evidence_archive

RUN_ID = "run-0123456789abcdef0123"
HOST_RUN = f"/srv/infra-host/infra/runs/{RUN_ID}"
FILES = {
    "evidence/trials.json": b'{"run_id": "%s"}\n' % RUN_ID.encode(),
    "evidence/harbor/alpha__0123/result.json": b'{"reward": 1}\n',
    "evidence/harbor/alpha__0123/agent/trajectory.json": b"[]\n",
    "evidence/harbor/alpha__0123/verifier/test-output.txt": b"1 passed\n",
    "evidence/batches/0000-aa/logs/runner.log": b"ran 1 trial\n",
    "evidence/harbor/alpha__0123/" + "d" * 120 + "/long.txt": b"a name longer than ustar's 100 bytes\n",
}


def _artifacts(root: Path, files: dict[str, bytes], *, mtime: int, mode: int, reverse: bool = False) -> Path:
    artifacts = root / "artifacts"
    artifacts.mkdir(parents=True)
    (artifacts / "summary.json").write_text("{}\n")
    for name in sorted(files, reverse=reverse):
        path = artifacts / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])
        path.chmod(mode)
        os.utime(path, (mtime, mtime))
    return artifacts


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_same_files_give_the_same_archive_bytes(tmp_path: Path) -> None:
    a = _artifacts(tmp_path / "a", FILES, mtime=1_000_000, mode=0o600)
    b = _artifacts(tmp_path / "b", FILES, mtime=2_000_000_000, mode=0o755, reverse=True)
    write_checksums(a)
    write_checksums(b)
    assert (a / EVIDENCE_ARCHIVE).read_bytes() == (b / EVIDENCE_ARCHIVE).read_bytes()
    assert (a / NESTED_SUMS).read_bytes() == (b / NESTED_SUMS).read_bytes()
    # A re-seal (write_checksums again, e.g. after publisher-error.json) writes the same archive.
    first = (a / EVIDENCE_ARCHIVE).read_bytes()
    write_checksums(a)
    assert (a / EVIDENCE_ARCHIVE).read_bytes() == first
    # One byte of one file changed: another archive.
    (b / "evidence/harbor/alpha__0123/result.json").write_bytes(b'{"reward": 0}\n')
    write_checksums(b)
    assert (b / EVIDENCE_ARCHIVE).read_bytes() != first


def test_members_are_relative_regular_files_with_fixed_metadata(tmp_path: Path) -> None:
    artifacts = _artifacts(tmp_path, FILES, mtime=1_234_567, mode=0o700)
    write_checksums(artifacts)
    data = (artifacts / EVIDENCE_ARCHIVE).read_bytes()
    assert data[4:8] == b"\0\0\0\0" and data[3] & 0x08 == 0  # gzip: mtime 0, no file name
    listed = parse_checksums((artifacts / NESTED_SUMS).read_bytes(), NESTED_SUMS, nested=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == list(listed)  # evidence-SHA256SUMS's order, nothing else
    for member in members:
        assert member.isreg() and not member.name.startswith("/") and ".." not in member.name.split("/")
        assert (member.mode, member.mtime, member.uid, member.gid, member.uname, member.gname) == (
            0o644, 0, 0, 0, "", "")


def test_sha256sum_checks_the_extracted_archive_and_sha256sums_lists_it(tmp_path: Path) -> None:
    artifacts = _artifacts(tmp_path / "run", FILES, mtime=1, mode=0o644)
    write_checksums(artifacts)
    sums = parse_checksums((artifacts / CHECKSUMS).read_bytes())
    assert sums[EVIDENCE_ARCHIVE] == _sha((artifacts / EVIDENCE_ARCHIVE).read_bytes())
    assert NESTED_SUMS in sums
    # A consumer: the two assets in a fresh directory, the real tar and sha256sum.
    consumer = tmp_path / "download"
    consumer.mkdir()
    for name in (EVIDENCE_ARCHIVE, NESTED_SUMS):
        shutil.copy(artifacts / name, consumer / name)
    subprocess.run(["tar", "-xzf", EVIDENCE_ARCHIVE], cwd=consumer, check=True)
    done = subprocess.run(["sha256sum", "--strict", "-c", NESTED_SUMS], cwd=consumer, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": OK") == len(FILES)
    assert verify_evidence_archive(artifacts)


def test_no_nested_evidence_no_archive(tmp_path: Path) -> None:
    artifacts = _artifacts(tmp_path, FILES, mtime=1, mode=0o644)
    write_checksums(artifacts)
    shutil.rmtree(artifacts / "evidence")
    write_checksums(artifacts)  # a stale archive is not left behind
    assert not (artifacts / EVIDENCE_ARCHIVE).exists() and not (artifacts / NESTED_SUMS).exists()
    assert not verify_evidence_archive(artifacts)


def _tar(members: list[tuple[str, bytes | None, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            info.size = len(data) if data is not None else 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return raw.getvalue()


A, B = "evidence/a.txt", "evidence/b/c.txt"
LISTED = {A: _sha(b"a"), B: _sha(b"c")}
REG = tarfile.REGTYPE


@pytest.mark.parametrize(("members", "says"), [
    ([(A, b"a", REG)], f"lacks {B}"),
    ([(A, b"a", REG), (B, b"c", REG), ("evidence/extra", b"x", REG)], "evidence/extra is not listed"),
    ([(A, b"a", REG), (B, b"C", REG)], f"{B} does not match"),
    ([(A, b"a", REG), (A, b"a", REG), (B, b"c", REG)], f"{A} appears twice"),
    ([(A, b"a", REG), (B, None, tarfile.SYMTYPE)], f"{B} is not a regular file"),
    ([(A, b"a", REG), ("evidence/b", None, tarfile.DIRTYPE), (B, b"c", REG)], "evidence/b is not a regular file"),
    ([("/" + A, b"a", REG), (B, b"c", REG)], "'/evidence/a.txt'"),
    ([("evidence/../a.txt", b"a", REG), (B, b"c", REG)], "'evidence/../a.txt'"),
])
def test_the_reader_refuses_every_other_archive(members: list[tuple[str, bytes | None, bytes]], says: str) -> None:
    check_archive(_tar([(A, b"a", REG), (B, b"c", REG)]), LISTED)  # the honest one passes
    with pytest.raises(CheckFailed) as caught:
        check_archive(_tar(members), LISTED)
    assert says in str(caught.value)


def test_verify_refuses_an_archive_that_is_not_what_evidence_sha256sums_lists(tmp_path: Path) -> None:
    artifacts = _artifacts(tmp_path, FILES, mtime=1, mode=0o644)
    write_checksums(artifacts)
    (artifacts / EVIDENCE_ARCHIVE).write_bytes(archive_bytes(artifacts, ["evidence/trials.json"]))
    with pytest.raises(ChecksumMismatch, match="lacks evidence/") as caught:
        verify_evidence_archive(artifacts)
    assert caught.value.subject == EVIDENCE_ARCHIVE
    (artifacts / NESTED_SUMS).unlink()
    with pytest.raises(ChecksumMismatch, match=f"{NESTED_SUMS} .* is missing"):
        verify_evidence_archive(artifacts)


def test_the_writer_refuses_a_link(tmp_path: Path) -> None:
    (tmp_path / "evidence").mkdir()
    (tmp_path / "evidence" / "link").symlink_to("/etc/passwd")
    with pytest.raises(CheckFailed, match="not a regular file"):
        archive_bytes(tmp_path, ["evidence/link"])


# --- the rewrite ---------------------------------------------------------------------------

@pytest.mark.parametrize(("before", "after"), [
    (f'"path": "{HOST_RUN}/batches/0000-aa/suite/alpha"', '"path": "batches/0000-aa/suite/alpha"'),
    (f"ran 1 trial into {HOST_RUN}/batches/0000-aa/harbor\n", "ran 1 trial into batches/0000-aa/harbor\n"),
    (f'"trials_dir": "{HOST_RUN}"', '"trials_dir": "."'),
    (f'"trial_uri": "file://{HOST_RUN}/harbor/alpha"', '"trial_uri": "file://harbor/alpha"'),
    (f"/other/host/{RUN_ID}/x /third/{RUN_ID}/", "x ."),  # any host's run dir
    (f'"run_id": "{RUN_ID}"', f'"run_id": "{RUN_ID}"'),  # the id alone is no path
    ("/usr/lib/python3 /app/wc.py", "/usr/lib/python3 /app/wc.py"),  # the task container's paths stay
])
def test_paths_into_the_run_dir_become_run_relative(before: str, after: str) -> None:
    assert scrub_bytes(before.encode(), RUN_ID) == after.encode()


def test_the_run_dir_s_ancestors_become_host() -> None:
    """An engine's error names a directory above the run dir (pytest's base dir, the host's state dir): any
    path from one the evidence reveals, two components deep at least, starts at [HOST]."""
    data = (f"into {HOST_RUN}/batches/0/harbor\n"
            'mkdir /srv/infra-host: permission denied; "/srv/infra-host/infra/sandbox/x" /srv /srv/infra-hostile\n')
    ancestors = host_ancestors(data.encode(), RUN_ID)
    assert ancestors == {b"/srv/infra-host", b"/srv/infra-host/infra", b"/srv/infra-host/infra/runs"}
    assert scrub_bytes(data.encode(), RUN_ID, ancestors=ancestors) == (
        b'into batches/0/harbor\nmkdir [HOST]: permission denied; "[HOST]/infra/sandbox/x" /srv /srv/infra-hostile\n')


def test_secrets_are_redacted_and_taken_from_the_policy_names() -> None:
    assert scrub_bytes(b"key=sk-canary-1234 and sk-canary-1234-longer", RUN_ID,
                       ["sk-canary-1234", "sk-canary-1234-longer"]) == b"key=" + REDACTED + b" and " + REDACTED
    assert secret_values(["A", "B", "C"], {"A": "one", "C": "", "D": "four"}) == ("one",)


def test_scrub_evidence_rewrites_in_place_and_refuses_leftovers(tmp_path: Path) -> None:
    secret = "sk-canary-0987654321"
    files = {
        "evidence/harbor/alpha__0123/result.json": f'{{"trials_dir": "{HOST_RUN}/batches/0/harbor"}}'.encode(),
        "evidence/harbor/alpha__0123/agent/agent.log": f"using key {secret}\n".encode(),
        "evidence/harbor/alpha__0123/app/__pycache__/x.pyc": b"\x00\x01" + HOST_RUN.encode() + b"/x.py\x00",
        "evidence/trials.json": b"{}\n",
        # Another file than the one revealing the run dir's path: the ancestors are collected over all of them.
        "evidence/harbor/alpha__0123/exception.txt": b"mkdir /srv/infra-host: permission denied",
    }
    artifacts = _artifacts(tmp_path / "a", files, mtime=1, mode=0o644)
    changed = scrub_evidence(artifacts, RUN_ID, [secret])
    assert sorted(changed) == sorted(set(files) - {"evidence/trials.json"})
    for path in (artifacts / "evidence").rglob("*"):
        if path.is_file():
            assert HOST_RUN.encode() not in path.read_bytes() and secret.encode() not in path.read_bytes()
    assert (artifacts / "evidence/harbor/alpha__0123/result.json").read_bytes() == b'{"trials_dir": "batches/0/harbor"}'
    assert (artifacts / "evidence/harbor/alpha__0123/exception.txt").read_bytes() == b"mkdir [HOST]: permission denied"
    assert scrub_evidence(artifacts, RUN_ID, [secret]) == []  # idempotent
    # A path the rewrite cannot take (relative, so no absolute prefix to strip) is refused, naming the file.
    left = _artifacts(tmp_path / "b", {"evidence/x.log": f"see infra/runs/{RUN_ID}/x\n".encode()}, mtime=1, mode=0o644)
    with pytest.raises(CheckFailed, match=r"^evidence/x\.log: still names the run directory"):
        scrub_evidence(left, RUN_ID)


def test_a_public_good_release_carries_no_trust_files(tmp_path: Path) -> None:
    """No private root (the production signer): none written, and a re-seal removes any an earlier seal left."""
    for name in TRUST_FILES:
        (tmp_path / name).write_text("{}\n")
    public_good = Signer(trust_config=cast(ClientTrustConfig, None), token=lambda: "", identity="x", issuer="y")
    assert write_trust_files(tmp_path, public_good) == ()
    assert not any((tmp_path / name).exists() for name in TRUST_FILES)
