"""CycloneDX 1.6 SBOMs built from what is really inside an image.

The image is read BY DIGEST from its registry (OCI distribution API): the manifest
bytes are checked against the digest, then the config and every layer blob are
streamed and checked against their descriptors. Layers are applied in order with
OCI whiteouts (``.wh.NAME`` deletes, ``.wh..wh..opq`` empties a directory), and only
the files an SBOM needs are kept: ``var/lib/dpkg/status`` (Debian packages) and
``*.dist-info/METADATA`` (Python distributions).

The work is split by what it holds: reading the layers into a file tree
(:mod:`pipeline.evidence.imagelayers`), finding packages and executables in it
(:mod:`pipeline.evidence.imagecontents`), the CycloneDX BOM of those
(:mod:`pipeline.evidence.bom`). This module writes the SBOM of an image ref, kept
in a cache by digest, and validates SBOM text; the names callers use from it
are re-exported here.
"""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import version
from pathlib import Path

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from pipeline.core import paths
from pipeline.core.digests import ImageRef, parse_ref
from pipeline.core.documents import base_lock_path
from pipeline.core.errors import CheckFailed
from pipeline.core.fsutil import atomic_write_bytes, atomic_write_text
from pipeline.evidence.bom import _distro, build_bom, render_bom
from pipeline.evidence.imagecontents import (
    Binary,
    ImageContents,
    Package,
    _python_declared,
    contents_from_tree,
    parse_dpkg_status,
    read_image,
)
from pipeline.evidence.imagelayers import (
    DPKG_STATUS,
    INDEX_TYPES,
    MANIFEST_TYPES,
    _apply_layer,
    _Entry,
    _interesting,
    _Registry,
)

__all__ = ["DPKG_STATUS", "INDEX_TYPES", "MANIFEST_TYPES", "Binary", "ImageContents", "Package", "_Entry", "_Registry",
           "_apply_layer", "_distro", "_interesting", "_python_declared", "build_bom", "contents_from_tree",
           "parse_dpkg_status", "read_image", "render_bom", "validate_sbom_text", "write_sbom"]


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
_GENERATOR_SOURCES = ("sbom.py", "imagelayers.py", "imagecontents.py", "bom.py", "goinfo.py", "licenses.py",
                      "depgraph.py", "golicenses.py", "licensetext.py", "go_licenses.json",
                      "license_texts/Apache-2.0.txt", "license_texts/MPL-2.0.txt")


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
