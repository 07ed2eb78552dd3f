"""CycloneDX 1.6 SBOMs built from what is really inside an image.

The image is read BY DIGEST from its registry (OCI distribution API): the manifest
bytes are checked against the digest, then the config and every layer blob are
streamed and checked against their descriptors. Layers are applied in order with
OCI whiteouts (``.wh.NAME`` deletes, ``.wh..wh..opq`` empties a directory), and only
the files an SBOM needs are kept: ``var/lib/dpkg/status`` (Debian packages) and
``*.dist-info/METADATA`` (Python distributions).
"""

from __future__ import annotations

import email.parser
import gzip
import hashlib
import json
import posixpath
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pipeline.digests import ImageRef, parse_ref
from pipeline.errors import CheckFailed
from pipeline.fsutil import atomic_write_bytes, atomic_write_text

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
    kind: str  # "deb" | "pypi"
    name: str
    version: str
    arch: str | None = None
    location: str | None = None
    license: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class ImageContents:
    ref: ImageRef
    config: dict[str, Any]
    debian: tuple[Package, ...]
    python: tuple[Package, ...]
    layers: tuple[str, ...]
    manifest: bytes = b""


# --- registry access ----------------------------------------------------------------

def _base_url(image: ImageRef) -> str:
    from pipeline.registry_auth import registry_url  # plain HTTP for loopback only, as for the push

    return f"{registry_url(image.registry)}/v2/{image.repository}"


class _Registry:
    def __init__(self, image: ImageRef, timeout: float = 60.0) -> None:
        from pipeline.registry_auth import AuthSession

        self.image = image
        self.base = _base_url(image)
        # Credentials and the Basic/Bearer handshake as for the push (pipeline.registry_auth).
        self.session = AuthSession(image.registry, timeout=timeout)
        self.timeout = timeout

    def get(self, path: str, accept: str | None = None, stream: bool = False) -> Any:
        from pipeline.registry_auth import scope

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

def _interesting(path: str) -> bool:
    return path == DPKG_STATUS or (path.endswith("/METADATA") and path.rsplit("/", 2)[-2].endswith(".dist-info"))


def _normalize(name: str) -> str:
    path = posixpath.normpath(name.lstrip("/")).lstrip("/")
    return "" if path == "." else path


def _apply_layer(files: dict[str, bytes], stream: IO[bytes], media_type: str) -> None:
    if "zstd" in media_type:
        raise CheckFailed(f"unsupported layer compression: {media_type}")
    source: IO[bytes] = gzip.GzipFile(fileobj=stream) if media_type.endswith("gzip") else stream  # type: ignore[assignment]
    with tarfile.open(fileobj=source, mode="r|") as tar:
        seen: dict[str, bytes] = {}
        opaque: list[str] = []
        deleted: list[str] = []
        for member in tar:
            path = _normalize(member.name)
            directory, base = posixpath.split(path)
            if base == ".wh..wh..opq":
                opaque.append(directory)
                continue
            if base.startswith(".wh."):
                deleted.append(posixpath.join(directory, base[len(".wh."):]))
                continue
            if member.isfile() and _interesting(path):
                extracted = tar.extractfile(member)
                if extracted is not None:
                    seen[path] = extracted.read()
            elif not member.isdir() and path in files:
                # replaced by a non-regular file (symlink, device): no longer readable content
                deleted.append(path)
        # Whiteouts in a layer hide lower layers only, never the same layer's entries.
        for directory in opaque:
            prefix = directory + "/" if directory else ""
            for key in [k for k in files if k.startswith(prefix)]:
                del files[key]
        for gone in deleted:
            for key in [k for k in files if k == gone or k.startswith(gone + "/")]:
                del files[key]
        files.update(seen)
    # Read the compressed stream to its end so the digest check covers every byte.
    drain = getattr(stream, "drain", None)
    if drain is not None:
        drain()


def read_image(ref: str) -> ImageContents:
    """Read ``name@sha256:...`` from its registry and collect its packages."""
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
    files: dict[str, bytes] = {}
    for layer in layers:
        stream = registry.blob_stream(str(layer.get("digest")))
        _apply_layer(files, stream, str(layer.get("mediaType", "")))  # type: ignore[arg-type]
    return ImageContents(
        ref=image,
        config=config,
        debian=tuple(parse_dpkg_status(files.get(DPKG_STATUS, b"").decode("utf-8", "replace"))),
        python=tuple(sorted(_python_packages(files), key=lambda p: (p.name.lower(), p.version, p.location or ""))),
        layers=tuple(str(layer.get("digest")) for layer in layers),
        manifest=manifest_bytes,
    )


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


def parse_dpkg_status(text: str) -> list[Package]:
    packages = []
    for fields in _paragraphs(text):
        if fields.get("Status", "").split()[-1:] != ["installed"]:
            continue
        source = fields.get("Source", "").split(" ")[0] or None
        packages.append(Package("deb", fields["Package"], fields["Version"], arch=fields.get("Architecture"), source=source))
    return sorted(packages, key=lambda p: p.name)


def _python_packages(files: dict[str, bytes]) -> Iterator[Package]:
    parser = email.parser.BytesHeaderParser()
    for path, content in files.items():
        if not path.endswith("/METADATA"):
            continue
        meta = parser.parsebytes(content)
        name, version = meta.get("Name"), meta.get("Version")
        if not name or not version:
            continue
        license_ = meta.get("License-Expression") or None
        yield Package("pypi", str(name), str(version), location=posixpath.dirname(path), license=license_)


# --- CycloneDX --------------------------------------------------------------------------

def _oci_purl(image: ImageRef, config: dict[str, Any]) -> Any:
    from packageurl import PackageURL

    qualifiers = {"repository_url": image.name}
    arch = config.get("architecture")
    if arch:
        qualifiers["arch"] = str(arch)
    return PackageURL(type="oci", name=image.repository.rsplit("/", 1)[-1], version=image.digest, qualifiers=qualifiers)


def build_bom(contents: ImageContents, *, distro: str | None = None) -> Any:
    """A cyclonedx Bom: metadata component = the image by digest; one component per package."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    image = contents.ref
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"benchseal-sbom:{image.ref}"))
    root = Component(
        type=ComponentType.CONTAINER,
        name=image.name,
        version=image.digest,
        bom_ref=image.ref,
        purl=_oci_purl(image, contents.config),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=image.digest.removeprefix("sha256:"))],
        properties=[Property(name="benchseal:layer", value=d) for d in contents.layers],
    )
    bom.metadata.component = root
    distro_q = {"distro": distro} if distro else {}
    seen: set[str] = set()
    for pkg in contents.debian:
        purl = PackageURL(type="deb", namespace="debian", name=pkg.name, version=pkg.version,
                          qualifiers={**({"arch": pkg.arch} if pkg.arch else {}), **distro_q})
        ref = str(purl)
        if ref in seen:
            continue
        seen.add(ref)
        props = [Property(name="benchseal:source-package", value=pkg.source)] if pkg.source else []
        bom.components.add(Component(type=ComponentType.LIBRARY, name=pkg.name, version=pkg.version, purl=purl,
                                     bom_ref=ref, properties=props))
    for pkg in contents.python:
        purl = PackageURL(type="pypi", name=_pep503(pkg.name), version=pkg.version)
        ref = f"{purl}#{pkg.location}"
        if ref in seen:
            continue
        seen.add(ref)
        bom.components.add(Component(type=ComponentType.LIBRARY, name=pkg.name, version=pkg.version, purl=purl,
                                     bom_ref=ref,
                                     properties=[Property(name="benchseal:location", value=pkg.location or "")]))
    # Everything found in the image is part of the image.
    bom.register_dependency(root, list(bom.components))
    return bom


def _pep503(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def render_bom(bom: Any) -> str:
    from cyclonedx.output.json import JsonV1Dot6

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
# names this module's source and the library version: a change in how SBOMs are made is a miss.
def _cache_path(image: ImageRef) -> Path:
    from importlib.metadata import version

    from pipeline import paths

    generator = hashlib.sha256(Path(__file__).read_bytes() + version("cyclonedx-python-lib").encode()).hexdigest()[:16]
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
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise CheckFailed(f"SBOM is not valid CycloneDX 1.6: {error}")
