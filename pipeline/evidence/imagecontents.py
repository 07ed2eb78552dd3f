"""What an image holds, found in its file tree: Debian, Python and npm packages (with their declared
licenses and hashes) and every executable with the package that accounts for it."""

from __future__ import annotations

import csv
import email.parser
import hashlib
import io
import json
import posixpath
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from email.message import Message
from typing import Any

from pipeline.core.contracts import pep503_name, sri_hex
from pipeline.core.digests import ImageRef, parse_ref
from pipeline.core.documents import base_lock_path, read_base_lock
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.project import AGENT_MANIFEST_PATH, load_manifest
from pipeline.evidence.goinfo import GoBuildInfo
from pipeline.evidence.imagelayers import (
    DPKG_STATUS,
    INDEX_TYPES,
    _Entry,
    _LayerRead,
    _merge,
    _read_layer,
    _Registry,
    _Tree,
)
from pipeline.evidence.licenses import (
    DeclaredLicense,
    dep5_licenses,
    is_unknown,
    npm_licenses,
    python_licenses,
    unknown,
)
from pipeline.evidence.licensetext import identify


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
    integrity: str | None = None  # SRI of the release agent's package as the build checked it (agent manifest)


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
    python, npm = _with_agent_integrity(files, python, npm)
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


_AGENT_HASH_SOURCE = f"{AGENT_MANIFEST_PATH} (the release agent's package, checked by the build)"


def _with_agent_integrity(files: dict[str, _Entry], python: list[Package],
                          npm: list[Package]) -> tuple[list[Package], list[Package]]:
    """The release agent's package gets the integrity its manifest records (npm dist.integrity, wheel sha256)."""
    entry = files.get(AGENT_MANIFEST_PATH.lstrip("/"))
    if entry is None or entry.data is None:
        return python, npm
    try:
        manifest = load_manifest(json.loads(entry.data), AGENT_MANIFEST_PATH)
    except (ValueError, ValidationError) as exc:
        raise CheckFailed(f"{AGENT_MANIFEST_PATH} in the image is not an agent manifest: {exc}") from None
    artifact = manifest.artifact
    algorithm, digest = sri_hex(artifact.integrity)
    if artifact.kind == "npm":
        location = (manifest.package_dir or "").lstrip("/")
        return python, [replace(p, integrity=artifact.integrity, hash_source=_AGENT_HASH_SOURCE)
                        if p.name == artifact.package and p.version == artifact.version and p.location == location
                        else p for p in npm]
    name = pep503_name(artifact.package)
    return [replace(p, integrity=artifact.integrity, hash_source=_AGENT_HASH_SOURCE,
                    sha256=digest if algorithm == "sha256" else p.sha256)
            if pep503_name(p.name) == name else p for p in python], npm


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
