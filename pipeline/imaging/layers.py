"""Deterministic layers, a content-addressed blob store and a layer cache.

A layer tar is a pure function of its entries: entries sorted by path, every
parent directory present, mtime fixed to the layer's epoch, uid/gid 0, no
user/group names, modes normalized (0755 dirs/executables, 0644 files). The
gzip stream has mtime 0 and no file name, and a fixed level, so equal entries
give equal bytes: level 6 for a base's rootfs (the committed production lock
pins those digests) and for BuildKit images' layers, level 1 for the layers
benchseal assembles (half of level 6's time for the runner's 430 MB wheels
layer with the tar written beside it, 13 % larger). The tar is written on one
thread while the caller's thread hashes and compresses it.

Compressing is the expensive part of a build, so compressed layers are cached
under a key computed from the layer's INPUTS (lock file hashes, file hashes):
a warm rebuild finds the key and reuses the blob without reading the inputs.
The records of image layers are named by their compression too.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import queue
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pipeline.core import paths
from pipeline.core.digests import validate_digest
from pipeline.core.errors import CheckFailed
from pipeline.core.fsutil import atomic_write_json, sha256_file

# A base's rootfs layer (compress_tarball), and a BuildKit image's layers, which may be a base's
# own (buildkit.py): an unchanged base layer then comes out as the base's blob.
BASE_GZIP_LEVEL = 6
LAYER_GZIP_LEVEL = 1  # every other layer
LAYER_FORMAT = f"gzip{LAYER_GZIP_LEVEL}"  # part of image layers' cache records
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


@contextlib.contextmanager
def staging_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory, removed after the block on a thread of its own: deleting a layer's
    staging tree (40,000 files for the runner's wheels, about 2 s) is not on the build's path. Not
    a daemon thread: the interpreter waits for it before it exits."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        threading.Thread(target=shutil.rmtree, args=(path,), kwargs={"ignore_errors": True},
                         name="staging-cleanup").start()


class _QueueWriter(io.RawIOBase):
    """The producer's side of a bounded queue of chunks (the tar writer's file object); it hashes
    the uncompressed stream (the diff_id) on its own thread."""

    def __init__(self, chunks: queue.Queue[bytes | BaseException | None]) -> None:
        self.chunks = chunks
        self.sha = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        chunk = bytes(data)
        self.sha.update(chunk)
        self.chunks.put(chunk)
        return len(chunk)


def compress_tar_stream(write_tar: Callable[[BinaryIO], None], store: BlobStore,
                        level: int = LAYER_GZIP_LEVEL) -> Layer:
    """Run ``write_tar(fileobj)`` on a thread of its own and store its gzip; return digests and size.

    The bytes do not depend on the split: ``write_tar`` writes through a 1 MiB buffer as before,
    and this thread feeds each chunk, in order, to the hashers and the compressor.
    """
    chunks: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=16)
    writer = _QueueWriter(chunks)

    def produce() -> None:
        try:
            buffered = io.BufferedWriter(writer, buffer_size=_CHUNK)  # type: ignore[type-var]
            write_tar(buffered)
            buffered.flush()
            chunks.put(None)
        except BaseException as exc:  # handed to the consumer, which raises it
            chunks.put(exc)

    producer = threading.Thread(target=produce, name="layer-tar", daemon=True)
    tmp = store.temp_path()
    failure: BaseException | None = None
    try:
        producer.start()
        with tmp.open("wb") as raw:
            compressed = _Hasher(raw)
            with gzip.GzipFile(filename="", fileobj=compressed, mode="wb", compresslevel=level, mtime=0) as gz:
                while (chunk := chunks.get()) is not None:
                    if isinstance(chunk, BaseException):
                        failure = chunk
                        break
                    if failure is None:
                        try:
                            gz.write(chunk)
                        except BaseException as exc:  # keep draining so the producer ends
                            failure = exc
    except BaseException as exc:
        failure = failure or exc
        while producer.is_alive():  # unblock a producer waiting on a full queue
            with contextlib.suppress(queue.Empty):
                chunks.get(timeout=0.1)
    producer.join()
    if failure is not None:
        tmp.unlink(missing_ok=True)
        raise failure
    digest = "sha256:" + compressed.sha.hexdigest()
    os.replace(tmp, store.path(digest))
    return Layer(digest=digest, diff_id="sha256:" + writer.sha.hexdigest(), size=compressed.count)


def build_layer(entries: Iterable[Entry], epoch: int, store: BlobStore) -> Layer:
    materialized = list(entries)
    return compress_tar_stream(lambda out: _write_tar(materialized, epoch, out), store)


def compress_tarball(tarball: Path, store: BlobStore) -> Layer:
    """Gzip an existing tar (the mmdebstrap rootfs) as one layer, as is, at the base's level."""

    def copy(out: BinaryIO) -> None:
        with tarball.open("rb") as src:
            while chunk := src.read(_CHUNK):
                out.write(chunk)

    return compress_tar_stream(copy, store, level=BASE_GZIP_LEVEL)


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

    def __init__(self, store: BlobStore, root: Path | None = None, enabled: bool = True,
                 compression: str = LAYER_FORMAT) -> None:
        """``compression``: names the records (a layer cached at another level is not this layer);
        empty for the base's rootfs layers, whose compression has not changed."""
        self.store = store
        self.root = root or paths.state_dir("cache", "layers")
        self.enabled = enabled
        self.suffix = f".{compression}" if compression else ""

    def get(self, key: str) -> Layer | None:
        if not self.enabled:
            return None
        record = self.root / f"{key}{self.suffix}.json"
        if not record.is_file():
            return None
        data = json.loads(record.read_text())
        layer = Layer(digest=data["digest"], diff_id=data["diff_id"], size=int(data["size"]))
        return layer if self.store.has(layer.digest) else None

    def put(self, key: str, layer: Layer) -> None:
        atomic_write_json(self.root / f"{key}{self.suffix}.json", layer.to_json())
