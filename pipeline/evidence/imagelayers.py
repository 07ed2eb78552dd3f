"""An image read by digest from its registry, its layers applied into the file tree the SBOM reads.

The manifest bytes are checked against the digest, then the config and every layer blob are
streamed and checked against their descriptors (OCI distribution API). Layers are applied in
order with OCI whiteouts (``.wh.NAME`` deletes, ``.wh..wh..opq`` empties a directory), and only
what an SBOM needs is kept: package databases, dist-info metadata, copyright files, package.json,
and the hash (and Go build info) of every executable.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import tarfile
import zlib
from dataclasses import dataclass
from typing import IO, Any

from pipeline.core.digests import ImageRef
from pipeline.core.errors import CheckFailed
from pipeline.core.project import AGENT_MANIFEST_PATH
from pipeline.core.registry_auth import AuthSession, registry_url, scope
from pipeline.evidence import goinfo
from pipeline.evidence.goinfo import GoBuildInfo

DPKG_STATUS = "var/lib/dpkg/status"
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
_CHUNK = 1 << 20

# --- registry access ----------------------------------------------------------------

def _base_url(image: ImageRef) -> str:

    return f"{registry_url(image.registry)}/v2/{image.repository}"


class _Registry:
    def __init__(self, image: ImageRef, timeout: float = 60.0) -> None:
        self.image = image
        self.base = _base_url(image)
        # Credentials and the Basic/Bearer handshake as for the push (pipeline.core.registry_auth).
        self.session = AuthSession(image.registry, timeout=timeout)
        self.timeout = timeout

    def get(self, path: str, accept: str | None = None, stream: bool = False) -> Any:
        headers = {"Accept": accept} if accept else {}
        response = self.session.request("GET", f"{self.base}/{path}", [scope(self.image.repository)], headers=headers, stream=stream)
        if response.status_code != 200:
            raise CheckFailed(f"{self.image.ref}: GET {path} -> HTTP {response.status_code}")
        return response

    def manifest(self, digest: str) -> bytes:
        response = self.get(f"manifests/{digest}", accept=", ".join(MANIFEST_TYPES + INDEX_TYPES))
        body: bytes = response.content
        actual = "sha256:" + hashlib.sha256(body).hexdigest()
        if actual != digest:
            raise CheckFailed(f"{self.image.name}: manifest bytes hash to {actual}, not the pinned {digest}")
        return body

    def blob_bytes(self, digest: str, limit: int = 16 << 20) -> bytes:
        response = self.get(f"blobs/{digest}", stream=True)
        hasher = hashlib.sha256()
        chunks = []
        size = 0
        for chunk in response.iter_content(_CHUNK):
            hasher.update(chunk)
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise CheckFailed(f"{self.image.name}: blob {digest} larger than {limit} bytes")
        if "sha256:" + hasher.hexdigest() != digest:
            raise CheckFailed(f"{self.image.name}: blob {digest} content does not match its digest")
        return b"".join(chunks)

    def blob_stream(self, digest: str) -> _VerifyingReader:
        response = self.get(f"blobs/{digest}", stream=True)
        return _VerifyingReader(response.raw, digest, self.image.name)


class _VerifyingReader:
    """A file-like reader that hashes what passes through and checks the digest at EOF."""

    def __init__(self, raw: IO[bytes], digest: str, name: str) -> None:
        self.raw = raw
        self.digest = digest
        self.name = name
        self.hasher = hashlib.sha256()
        self.done = False

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.hasher.update(data)
        if not data or size < 0:
            self._finish()
        return data

    def _finish(self) -> None:
        if not self.done:
            self.done = True
            if "sha256:" + self.hasher.hexdigest() != self.digest:
                raise CheckFailed(f"{self.name}: layer {self.digest} content does not match its digest")

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass
        self._finish()


# --- layer application ------------------------------------------------------------------

_ELF = b"\x7fELF"


@dataclass(frozen=True)
class _Entry:
    kind: str  # "file" | "symlink"
    data: bytes | None = None  # content of a file the SBOM reads (package databases)
    target: str = ""  # symlink target
    sha256: str = ""  # executables
    elf: bool = False
    executable: bool = False
    go: GoBuildInfo | None = None
    go_error: str | None = None


_LICENSE_FILE = re.compile(r"(?i)\A(?:licen[cs]e|copying)(?:[._-][A-Za-z0-9.+_-]*)?\Z")


def _interesting(path: str) -> bool:
    """Files whose content the SBOM reads: package databases, dist-info metadata, copyright files, package.json."""
    if path == DPKG_STATUS or path == AGENT_MANIFEST_PATH.lstrip("/"):  # the agent manifest: its package's integrity
        return True
    directory, base = posixpath.split(path)
    if base in ("METADATA", "RECORD"):
        return directory.endswith(".dist-info")
    if directory.endswith(".dist-info"):  # License-File at the dist-info root (older wheels)
        return bool(_LICENSE_FILE.match(base))
    if ".dist-info/licenses" in directory + "/":  # License-File: dist-info/licenses/PATH (metadata 2.4)
        return (directory + "/").split(".dist-info/licenses", 1)[1].startswith("/")
    if base == "copyright":
        return directory.startswith("usr/share/doc/") and directory.count("/") == 3
    if base.endswith(".list"):
        return directory == "var/lib/dpkg/info"
    return base == "package.json"


def _normalize(name: str) -> str:
    path = posixpath.normpath(name.lstrip("/")).lstrip("/")
    return "" if path == "." else path


def _executable_entry(head: bytes, rest: IO[bytes], mode: int) -> _Entry:
    data = head + rest.read()
    elf = head == _ELF
    go: GoBuildInfo | None = None
    error: str | None = None
    if elf:
        try:
            go = goinfo.parse(data)
        except goinfo.BuildInfoError as exc:
            error = str(exc)
    return _Entry("file", sha256=hashlib.sha256(data).hexdigest(), elf=elf, executable=bool(mode & 0o111),
                  go=go, go_error=error)


class _Gunzip:
    """Streaming gzip reader on zlib (which checks each member's CRC and length itself); faster than GzipFile."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.inflater: Any = zlib.decompressobj(wbits=31)
        self.buf = b""
        self.pos = 0
        self.eof = False

    def _fill(self) -> None:
        """Decompress the next chunk into ``buf`` (the previous one fully consumed)."""
        parts: list[bytes] = []
        while not parts and not self.eof:
            chunk = self.raw.read(_CHUNK)
            if not chunk:
                if self.inflater is not None:
                    raise CheckFailed("layer gzip stream is truncated")
                self.eof = True
                break
            while chunk:
                if self.inflater is None:  # a concatenated gzip member follows
                    self.inflater = zlib.decompressobj(wbits=31)
                out = self.inflater.decompress(chunk)
                if out:
                    parts.append(out)
                chunk = b""
                if self.inflater.eof:
                    chunk = self.inflater.unused_data
                    self.inflater = None
        self.buf = b"".join(parts)
        self.pos = 0

    def read(self, size: int = -1) -> bytes:
        out: list[bytes] = []
        want = size if size >= 0 else 1 << 62
        while want > 0:
            if self.pos >= len(self.buf):
                self._fill()
                if not self.buf:
                    break
            piece = self.buf[self.pos:self.pos + want]
            self.pos += len(piece)
            want -= len(piece)
            out.append(piece)
        return out[0] if len(out) == 1 else b"".join(out)


@dataclass
class _LayerRead:
    """What one layer adds and removes; merged onto the layers below it in order."""

    seen: dict[str, _Entry]
    opaque: list[str]
    deleted: list[str]
    shadowed: list[str]  # replaced by something the SBOM does not keep
    dirs: list[str]  # directories (they replace a lower layer's symlink of the same path)
    hardlinks: list[tuple[str, str]]  # (path, target) whose target is not in this layer


def _apply_layer(files: dict[str, _Entry], stream: IO[bytes], media_type: str) -> None:
    _merge(files, _read_layer(stream, media_type))


def _read_layer(stream: IO[bytes], media_type: str) -> _LayerRead:
    try:
        return _read_layer_unchecked(stream, media_type)
    except (tarfile.TarError, zlib.error, EOFError) as exc:
        raise CheckFailed(f"layer ({media_type}) is not a readable tar stream: {exc}") from None


def _read_layer_unchecked(stream: IO[bytes], media_type: str) -> _LayerRead:
    if "zstd" in media_type:
        raise CheckFailed(f"unsupported layer compression: {media_type}")
    source: IO[bytes] = _Gunzip(stream) if media_type.endswith("gzip") else stream  # type: ignore[assignment]
    read = _LayerRead({}, [], [], [], [], [])
    seen = read.seen
    with tarfile.open(fileobj=source, mode="r|", bufsize=64 << 10) as tar:
        for member in tar:
            path = _normalize(member.name)
            directory, base = posixpath.split(path)
            if base == ".wh..wh..opq":
                read.opaque.append(directory)
                continue
            if base.startswith(".wh."):
                read.deleted.append(posixpath.join(directory, base[len(".wh."):]))
                continue
            entry: _Entry | None = None
            if member.isfile():
                extracted = tar.extractfile(member)
                if extracted is not None:
                    if _interesting(path):
                        entry = _Entry("file", data=extracted.read())
                    else:
                        head = extracted.read(4)
                        if head == _ELF or member.mode & 0o111:
                            entry = _executable_entry(head, extracted, member.mode)
            elif member.issym():
                entry = _Entry("symlink", target=member.linkname)
            elif member.islnk():
                target = _normalize(member.linkname)
                entry = seen.get(target)
                if entry is None and target not in read.shadowed:
                    read.hardlinks.append((path, target))  # a lower layer's file: resolved when merged
                    continue
            elif member.isdir():
                read.dirs.append(path)
                if seen.get(path, _DIR).kind != "symlink":
                    continue
            if entry is None:
                seen.pop(path, None)
                read.shadowed.append(path)
            else:
                seen[path] = entry
    # Read the compressed stream to its end so the digest check covers every byte.
    drain = getattr(stream, "drain", None)
    if drain is not None:
        drain()
    return read


def _merge(files: dict[str, _Entry], layer: _LayerRead) -> None:
    linked = {path: files[target] for path, target in layer.hardlinks if target in files}
    for path, _ in layer.hardlinks:
        if path not in linked:
            layer.shadowed.append(path)
    # Whiteouts in a layer hide lower layers only, never the same layer's entries.
    for directory in layer.opaque:
        prefix = directory + "/" if directory else ""
        for key in [k for k in files if k.startswith(prefix)]:
            del files[key]
    for gone in layer.deleted:
        for key in [k for k in files if k == gone or k.startswith(gone + "/")]:
            del files[key]
    for path in layer.shadowed:
        files.pop(path, None)
    for path in layer.dirs:
        if files.get(path, _DIR).kind == "symlink":
            del files[path]
    files.update(linked)
    files.update(layer.seen)


_DIR = _Entry("dir")


class _Tree:
    """The final file tree: resolves paths through symlinked directories (``bin`` -> ``usr/bin``)."""

    def __init__(self, files: dict[str, _Entry]) -> None:
        self.files = files
        self.links = {path: entry.target for path, entry in files.items() if entry.kind == "symlink"}
        self._dirs: dict[str, str] = {}

    def _resolve_dir(self, directory: str, depth: int = 0) -> str:
        if not directory or depth > 40:
            return directory
        cached = self._dirs.get(directory)
        if cached is not None:
            return cached
        parent, base = posixpath.split(directory)
        real = posixpath.join(self._resolve_dir(parent, depth + 1), base) if parent else base
        target = self.links.get(real)
        if target is not None:
            joined = target if target.startswith("/") else posixpath.join(posixpath.dirname(real), target)
            real = self._resolve_dir(_normalize(joined), depth + 1)
        self._dirs[directory] = real
        return real

    def canonical(self, path: str) -> str:
        """``path`` with its directories resolved (the file itself may still be a symlink)."""
        directory, base = posixpath.split(_normalize(path))
        return posixpath.join(self._resolve_dir(directory), base) if directory else base

    def read(self, path: str) -> bytes | None:
        """Content of ``path``, following symlinks (e.g. /usr/share/doc/libgcc-s1 -> gcc-14-base)."""
        current = self.canonical(path)
        for _ in range(40):
            entry = self.files.get(current)
            if entry is None:
                return None
            if entry.kind != "symlink":
                return entry.data
            joined = entry.target if entry.target.startswith("/") else posixpath.join(posixpath.dirname(current), entry.target)
            current = self.canonical(joined)
        return None
