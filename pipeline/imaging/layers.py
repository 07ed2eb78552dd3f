"""Deterministic layers, a content-addressed blob store and a layer cache.

A layer tar is a pure function of its entries: entries sorted by path, every
parent directory present, mtime fixed to the layer's epoch, uid/gid 0, no
user/group names, modes normalized (0755 dirs/executables, 0644 files). The
gzip stream has mtime 0 and no file name, so equal entries give equal bytes.

Compressing is the expensive part of a build, so compressed layers are cached
under a key computed from the layer's INPUTS (lock file hashes, file hashes):
a warm rebuild finds the key and reuses the blob without reading the inputs.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pipeline.core import paths
from pipeline.core.digests import validate_digest
from pipeline.core.errors import CheckFailed
from pipeline.core.fsutil import atomic_write_json, sha256_file

GZIP_LEVEL = 6
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Entry:
    """One tar member. ``path`` is absolute in the image (``/usr/bin/x``)."""

    path: str
    kind: str  # "file" | "dir" | "symlink"
    mode: int = 0o644
    source: Path | None = None  # file contents from disk ...
    data: bytes | None = None  # ... or from memory
    target: str = ""  # symlink target

    @property
    def arcname(self) -> str:
        return self.path.strip("/")


@dataclass(frozen=True)
class Layer:
    digest: str  # sha256 of the gzip bytes (the blob)
    diff_id: str  # sha256 of the uncompressed tar
    size: int

    def to_json(self) -> dict[str, object]:
        return {"digest": self.digest, "diff_id": self.diff_id, "size": self.size}


def cache_root() -> Path:
    return paths.state_dir("cache")


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """One build at a time per state dir: parallel test sessions share the caches and the lock file."""
    with (cache_root() / "build.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class BlobStore:
    """Blobs by digest under ``<state>/cache/blobs/sha256/<hex>``."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or paths.state_dir("cache", "blobs", "sha256")
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        return self.root / validate_digest(digest).removeprefix("sha256:")

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def put_bytes(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if not self.has(digest):
            tmp = self.temp_path()
            tmp.write_bytes(data)
            os.replace(tmp, self.path(digest))
        return digest

    def read(self, digest: str) -> bytes:
        data = self.path(digest).read_bytes()
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise CheckFailed(f"cached blob {digest} is corrupt (content hash differs); delete {self.path(digest)}")
        return data

    def temp_path(self) -> Path:
        """A new empty file in the store's directory (same filesystem: os.replace is atomic)."""
        fd, name = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        os.close(fd)
        return Path(name)


class _Hasher(io.RawIOBase):
    """Write-through file object that hashes and counts what passes."""

    def __init__(self, sink: BinaryIO | None) -> None:
        self.sink = sink
        self.sha = hashlib.sha256()
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sha.update(data)
        self.count += len(data)
        if self.sink is not None:
            self.sink.write(data)
        return len(data)


def _normal_mode(kind: str, mode: int) -> int:
    if kind == "dir":
        return 0o755
    if kind == "symlink":
        return 0o777
    return 0o755 if mode & 0o111 else 0o644


def _with_parents(entries: Iterable[Entry]) -> list[Entry]:
    by_path: dict[str, Entry] = {}
    for entry in entries:
        if entry.arcname in by_path and by_path[entry.arcname].kind != "dir":
            raise CheckFailed(f"layer: two entries for /{entry.arcname}")
        by_path[entry.arcname] = entry
    for arcname in list(by_path):
        parts = arcname.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            by_path.setdefault(parent, Entry("/" + parent, "dir"))
    return [by_path[k] for k in sorted(by_path)]


def _write_tar(entries: Iterable[Entry], epoch: int, out: BinaryIO) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for entry in _with_parents(entries):
            info = tarfile.TarInfo(entry.arcname)
            info.mtime = epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = _normal_mode(entry.kind, entry.mode)
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = entry.target
                tar.addfile(info)
            elif entry.data is not None:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
            elif entry.source is not None:
                info.size = entry.source.stat().st_size
                with entry.source.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                raise CheckFailed(f"layer entry /{entry.arcname} has no content")


def compress_tar_stream(write_tar: Callable[[BinaryIO], None], store: BlobStore) -> Layer:
    """Run ``write_tar(fileobj)`` and store its gzip; return digests and size."""
    tmp = store.temp_path()
    try:
        with tmp.open("wb") as raw:
            compressed = _Hasher(raw)
            with gzip.GzipFile(filename="", fileobj=compressed, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as gz:
                uncompressed = _Hasher(gz)  # type: ignore[arg-type]
                buffered = io.BufferedWriter(uncompressed, buffer_size=_CHUNK)  # type: ignore[type-var]
                write_tar(buffered)
                buffered.flush()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    digest = "sha256:" + compressed.sha.hexdigest()
    os.replace(tmp, store.path(digest))
    return Layer(digest=digest, diff_id="sha256:" + uncompressed.sha.hexdigest(), size=compressed.count)


def build_layer(entries: Iterable[Entry], epoch: int, store: BlobStore) -> Layer:
    materialized = list(entries)
    return compress_tar_stream(lambda out: _write_tar(materialized, epoch, out), store)


def compress_tarball(tarball: Path, store: BlobStore) -> Layer:
    """Gzip an existing tar (the mmdebstrap rootfs) as one layer, as is."""

    def copy(out: BinaryIO) -> None:
        with tarball.open("rb") as src:
            while chunk := src.read(_CHUNK):
                out.write(chunk)

    return compress_tar_stream(copy, store)


def tree_entries(root: Path, dest: str, exclude_dirs: frozenset[str] = frozenset(), exclude_suffixes: tuple[str, ...] = ()) -> list[Entry]:
    """Entries for every file/dir/symlink below ``root``, placed under ``dest``."""
    entries: list[Entry] = [Entry(dest, "dir")]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in exclude_dirs)
        rel = Path(dirpath).relative_to(root)
        base = dest.rstrip("/") + ("" if str(rel) == "." else "/" + rel.as_posix())
        for d in dirnames:
            full = Path(dirpath) / d
            if full.is_symlink():
                entries.append(Entry(f"{base}/{d}", "symlink", target=os.readlink(full)))
            else:
                entries.append(Entry(f"{base}/{d}", "dir"))
        for name in sorted(filenames):
            if name.endswith(exclude_suffixes):
                continue
            full = Path(dirpath) / name
            if full.is_symlink():
                entries.append(Entry(f"{base}/{name}", "symlink", target=os.readlink(full)))
            else:
                entries.append(Entry(f"{base}/{name}", "file", mode=full.stat().st_mode, source=full))
    return entries


def entries_key(entries: Iterable[Entry]) -> str:
    """A hash of what a layer made of ``entries`` would contain (paths, kinds, modes, contents)."""
    h = hashlib.sha256()
    for entry in sorted(entries, key=lambda e: e.arcname):
        if entry.data is not None:
            content = hashlib.sha256(entry.data).hexdigest()
        elif entry.source is not None:
            content = sha256_file(entry.source)
        else:
            content = entry.target
        h.update(json.dumps([entry.arcname, entry.kind, _normal_mode(entry.kind, entry.mode), content]).encode())
        h.update(b"\n")
    return h.hexdigest()


class LayerCache:
    """``key -> Layer`` records under ``<state>/cache/layers``; valid only while the blob exists."""

    def __init__(self, store: BlobStore, root: Path | None = None, enabled: bool = True) -> None:
        self.store = store
        self.root = root or paths.state_dir("cache", "layers")
        self.enabled = enabled

    def get(self, key: str) -> Layer | None:
        if not self.enabled:
            return None
        record = self.root / f"{key}.json"
        if not record.is_file():
            return None
        data = json.loads(record.read_text())
        layer = Layer(digest=data["digest"], diff_id=data["diff_id"], size=int(data["size"]))
        return layer if self.store.has(layer.digest) else None

    def put(self, key: str, layer: Layer) -> None:
        atomic_write_json(self.root / f"{key}.json", layer.to_json())
