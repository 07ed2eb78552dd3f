"""An SBOM of a planted image in the local registry: licenses, hashes, executables, graph, validation.

The image holds what a real one does (dpkg status and file lists, DEP-5 and free-form copyright
files, dist-info METADATA + RECORD, a node_modules tree, a Go binary, an ELF file no package owns)
plus traps: a later layer deletes one binary and replaces a copyright file.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import CheckFailed
from pipeline.evidence import sbom
from pipeline.local.ntia import ntia_report
from tests.evidence.test_sbom_parts import DEP5, MODINFO, fake_go_elf
from tests.fixtures.sigstore import PushedImage, push_image

pytestmark = pytest.mark.docker

REPO = "benchseal-evidence-test/planted"
SITE = "usr/local/lib/python3.13/dist-packages"

STATUS = b"""Package: libc6
Status: install ok installed
Architecture: amd64
Multi-Arch: same
Maintainer: GNU Libc Maintainers <debian-glibc@lists.debian.org>
Version: 2.41-12
Depends: libgcc-s1
Provides: libc6-dev-stub

Package: libgcc-s1
Status: install ok installed
Architecture: amd64
Maintainer: Debian GCC Maintainers <debian-gcc@lists.debian.org>
Version: 14.2.0-19
Depends: libc6 (>= 2.35)

Package: mawk
Status: install ok installed
Architecture: amd64
Maintainer: Boyuan Yang <byang@debian.org>
Version: 1.3.4-1
Provides: awk
Pre-Depends: libc6 (>= 2.34)

Package: tool
Status: install ok installed
Architecture: amd64
Maintainer: Tool Maintainer <tool@example.org>
Version: 1.0-1
Depends: gawk | awk, libc6-dev-stub, not-installed-anywhere
"""

REAL_ELF = Path("/usr/bin/true").read_bytes()  # any real ELF executable of the host
MYSTERY = REAL_ELF + b"planted"
DELETED = REAL_ELF + b"deleted later"


def _metadata(name: str, version: str, *lines: str) -> bytes:
    return ("Metadata-Version: 2.4\n" + f"Name: {name}\nVersion: {version}\n" + "".join(f"{x}\n" for x in lines)
            + "\nbody\n").encode()


def _record(dist: str, files: dict[str, bytes]) -> bytes:
    rows = [f"{path},sha256={hashlib.sha256(data).hexdigest()},{len(data)}" for path, data in files.items()]
    return ("\n".join([*rows, f"{dist}/RECORD,,"]) + "\n").encode()


def _layer(entries: list[tuple[str, Any, int]]) -> bytes:
    """(path, bytes | ("link", target) | None for a directory, mode)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(data, tuple):
                info.type = tarfile.SYMTYPE if data[0] == "link" else tarfile.LNKTYPE
                info.linkname = data[1]
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def _layers() -> list[bytes]:
    app_files = {"app/__init__.py": b"", "../../../bin/app": b"#!/usr/bin/python3\n"}
    lib_files = {"lib/__init__.py": b""}
    compose_files = {"tooly/__init__.py": b""}
    layer1 = _layer([
        ("bin", ("link", "usr/bin"), 0o777),
        ("var/lib/dpkg/status", STATUS, 0o644),
        ("var/lib/dpkg/info/libc6:amd64.list", b"/.\n/usr\n/usr/lib/x86_64-linux-gnu/libc.so.6\n", 0o644),
        ("var/lib/dpkg/info/mawk.list", b"/.\n/bin/mawk\n", 0o644),  # listed under the /bin symlink
        ("var/lib/dpkg/info/tool.list", b"/usr/bin/gotool-deb\n", 0o644),
        ("var/lib/dpkg/info/tool.postinst", b"#!/bin/sh\nexit 0\n", 0o755),
        ("usr/lib/x86_64-linux-gnu/libc.so.6", REAL_ELF, 0o755),
        ("usr/bin/mawk", REAL_ELF + b"mawk", 0o755),
        ("usr/bin/gotool-deb", fake_go_elf(MODINFO.replace("example.com/tool", "example.com/debtool")), 0o755),
        ("usr/share/doc/libc6/copyright", b"This is free-form text, licensed under the GPL.\n", 0o644),
        ("usr/share/doc/libgcc-s1", ("link", "mawk"), 0o777),
        ("usr/share/doc/mawk/copyright", DEP5.encode(), 0o644),
        ("usr/share/doc/tool/copyright", DEP5.encode(), 0o644),
        ("usr/local/bin/deleted-later", DELETED, 0o755),
        ("opt/unknown/mystery", MYSTERY, 0o755),
    ])
    layer2 = _layer([
        (f"{SITE}/app-1.0.dist-info/METADATA", _metadata(
            "App", "1.0", "Author: Ann Author <ann@example.org>", "License-Expression: MIT",
            "Requires-Dist: lib[fast]>=1", "Requires-Dist: pywin; sys_platform == 'win32'",
            "Requires-Dist: oldlib; python_version < '3.11'"), 0o644),
        (f"{SITE}/app-1.0.dist-info/RECORD", _record("app-1.0.dist-info", app_files), 0o644),
        (f"{SITE}/app/__init__.py", b"", 0o644),
        ("usr/local/bin/app", b"#!/usr/bin/python3\n", 0o755),
        (f"{SITE}/lib-2.0.dist-info/METADATA", _metadata(
            "lib", "2.0", "License: Apache 2", "Classifier: License :: OSI Approved :: Apache Software License",
            "Requires-Dist: speed; extra == 'fast'", "Requires-Dist: docs; extra == 'docs'"), 0o644),
        (f"{SITE}/lib-2.0.dist-info/RECORD", _record("lib-2.0.dist-info", lib_files), 0o644),
        (f"{SITE}/speed-0.1.dist-info/METADATA", _metadata("speed", "0.1", "License: Custom Thing"), 0o644),
        (f"{SITE}/docs-0.1.dist-info/METADATA", _metadata("docs", "0.1"), 0o644),
        (f"{SITE}/oldlib-0.1.dist-info/METADATA", _metadata("oldlib", "0.1"), 0o644),
        (f"{SITE}/tooly-3.0.dist-info/METADATA", _metadata("tooly", "3.0", "License-Expression: Apache-2.0"), 0o644),
        (f"{SITE}/tooly-3.0.dist-info/RECORD", _record("tooly-3.0.dist-info", compose_files), 0o644),
        (f"{SITE}/tooly/__init__.py", b"", 0o644),
        (f"{SITE}/tooly/bin/gotool", fake_go_elf(), 0o755),  # unpacked beside the package, not in RECORD
        ("opt/helper/package.json", json.dumps({"name": "helper", "version": "0.1.0", "license": "ISC",
                                                "dependencies": {"@s/b": "^1", "a": "^2"}}).encode(), 0o644),
        ("opt/helper/node_modules/a/package.json", json.dumps(
            {"name": "a", "version": "2.1.0", "license": "MIT", "author": "Al <al@example.org>"}).encode(), 0o644),
        ("opt/helper/node_modules/@s/b/package.json", json.dumps(
            {"name": "@s/b", "version": "1.0.0", "license": "(MIT OR Apache-2.0)", "dependencies": {"a": "*"}}).encode(),
         0o644),
        ("usr/local/bin/.wh.deleted-later", b"", 0o644),
        ("opt/unknown/lower-hardlink", ("hard", "opt/unknown/mystery"), 0o755),  # to a lower layer's file
        # the later layer replaces the DEP-5 file of "tool" with free text: its license becomes unknown
        ("usr/share/doc/tool/copyright", b"Copyright 2020 Someone; see the GPL.\n", 0o644),
    ])
    return [layer1, layer2]


@pytest.fixture(scope="module")
def planted() -> PushedImage:
    from pipeline.local import registry

    registry.start(registry.default_registry())
    return push_image(REPO, _layers())


@pytest.fixture()
def base_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: PushedImage) -> Path:
    """A base lock whose rootfs is the planted image's first layer, with .deb hashes for two packages."""
    import requests

    manifest = json.loads(planted.manifest)
    layer = manifest["layers"][0]
    config = requests.get(f"http://127.0.0.1:5055/v2/{REPO}/blobs/{manifest['config']['digest']}", timeout=30).json()
    diff_id = config["rootfs"]["diff_ids"][0]
    lock = tmp_path / "base.lock.json"
    lock.write_text(json.dumps({"schema": "benchseal.base-lock/v1", "images": {"planted-base": {
        "name": "127.0.0.1:5055/x", "digest": "sha256:" + "0" * 64, "ref": "127.0.0.1:5055/x@sha256:" + "0" * 64,
        "rootfs_sha256": diff_id.removeprefix("sha256:"),
        "layer": {"digest": layer["digest"], "diff_id": diff_id, "size": layer["size"]},
        "debs": {"libc6:amd64": {"version": "2.41-12", "sha256": "a" * 64},
                 "mawk:amd64": {"version": "1.3.4-1", "sha256": "b" * 64},
                 "tool:amd64": {"version": "0.9-1", "sha256": "c" * 64}},  # another version: not this package's hash
    }}}))
    monkeypatch.setenv("BENCHSEAL_BASE_LOCK", str(lock))
    monkeypatch.setenv("BENCHSEAL_HOME", str(tmp_path / "home"))
    return lock


def _by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in data["components"]}


def _licenses(component: dict[str, Any]) -> list[str]:
    return sorted(e.get("expression") or e["license"].get("id") or e["license"]["name"] for e in component["licenses"])


def _deps(data: dict[str, Any]) -> dict[str, list[str]]:
    return {d["ref"]: d.get("dependsOn", []) for d in data["dependencies"]}


def test_planted_image_sbom(planted: PushedImage, base_lock: Path, tmp_path: Path) -> None:
    text = sbom.write_sbom(planted.ref, tmp_path / "sbom.json").read_text()
    sbom.validate_sbom_text(text)
    data = json.loads(text)
    comps = _by_name(data)
    # licenses: DEP-5 mapped to SPDX ids, a symlinked doc dir followed, free text -> explicit unknown
    dep5 = ["Artistic-1.0", "GPL-1.0-or-later", "GPL-2.0-or-later", "GPL-3+ with Bison exception", "MIT"]
    assert _licenses(comps["mawk"]) == dep5
    assert _licenses(comps["libgcc-s1"]) == dep5  # /usr/share/doc/libgcc-s1 -> mawk
    assert _licenses(comps["libc6"]) == ["unknown"]
    assert _licenses(comps["tool"]) == ["unknown"], "the upper layer's free-text copyright wins"
    assert _licenses(comps["App"]) == ["MIT"] and _licenses(comps["lib"]) == ["Apache-2.0"]
    assert _licenses(comps["speed"]) == ["Custom Thing"] and _licenses(comps["docs"]) == ["unknown"]
    assert _licenses(comps["@s/b"]) == ["(MIT OR Apache-2.0)"] and _licenses(comps["helper"]) == ["ISC"]
    # suppliers from Maintainer / Author / package.json author
    assert comps["libc6"]["supplier"]["name"] == "GNU Libc Maintainers"
    assert comps["App"]["supplier"]["name"] == "Ann Author" and comps["a"]["supplier"]["name"] == "Al"
    # hashes: .deb from the base lock only where name, arch and version match; RECORD for wheels
    assert comps["libc6"]["hashes"] == [{"alg": "SHA-256", "content": "a" * 64}]
    assert comps["mawk"]["hashes"] == [{"alg": "SHA-256", "content": "b" * 64}]
    assert "hashes" not in comps["tool"] and "hashes" not in comps["libgcc-s1"]
    record = _record("app-1.0.dist-info", {"app/__init__.py": b"", "../../../bin/app": b"#!/usr/bin/python3\n"})
    assert comps["App"]["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(record).hexdigest()}]
    # executables: the unowned ELF is a file component with its hash; the deleted one is gone;
    # owned ones (libc, mawk via the /bin symlink, the maintainer script, the console script) are not files
    files = {c["name"]: c for c in data["components"] if c["type"] == "file"}
    assert set(files) == {"/opt/unknown/mystery", "/opt/unknown/lower-hardlink"}
    assert files["/opt/unknown/lower-hardlink"]["hashes"] == files["/opt/unknown/mystery"]["hashes"]
    assert files["/opt/unknown/mystery"]["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(MYSTERY).hexdigest()}]
    # Go: both binaries with their modules; the replaced module at the replacement's version
    assert all("purl" in c for c in data["components"])
    assert files["/opt/unknown/mystery"]["purl"] == f"pkg:generic/opt/unknown/mystery?checksum=sha256:{hashlib.sha256(MYSTERY).hexdigest()}"
    go = {c["purl"] for c in data["components"] if c.get("purl", "").startswith("pkg:golang/")}
    assert {"pkg:golang/example.com/tool@v1.4.2", "pkg:golang/example.com/debtool@v1.4.2",
            "pkg:golang/github.com/a/b@v0.3.0", "pkg:golang/golang.org/x/sys@v0.2.0", "pkg:golang/stdlib@1.24.9"} <= go
    deps = _deps(data)
    tool_ref = f"pkg:golang/example.com/tool@v1.4.2#/{SITE}/tooly/bin/gotool"
    assert set(deps[tool_ref]) == {"pkg:golang/github.com/a/b@v0.3.0", "pkg:golang/golang.org/x/sys@v0.2.0",
                                   "pkg:golang/stdlib@1.24.9"}
    # the graph: deb alternatives/virtuals, extras and markers, Node resolution, binaries to their packages
    ref = {name: c["bom-ref"] for name, c in comps.items()}
    assert set(deps[ref["tool"]]) == {ref["mawk"], ref["libc6"], "pkg:golang/example.com/debtool@v1.4.2#/usr/bin/gotool-deb"}
    assert deps[ref["mawk"]] == [ref["libc6"]]
    assert deps[ref["App"]] == [ref["lib"]] and deps[ref["lib"]] == [ref["speed"]]
    assert tool_ref in deps[ref["tooly"]]
    assert set(deps[ref["helper"]]) == {ref["a"], ref["@s/b"]} and deps[ref["@s/b"]] == [ref["a"]]
    root = deps[data["metadata"]["component"]["bom-ref"]]
    assert ref["App"] in root and ref["lib"] not in root and ref["libc6"] not in root
    report = ntia_report(text)
    assert report.met["dependency_relationship"] == report.total, "every component is reachable from the image"
    assert report.met["unique_id"] == report.total and report.share("timestamp") == 1.0


def test_planted_image_sbom_is_reproducible(planted: PushedImage, base_lock: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    first = json.loads(sbom.write_sbom(planted.ref, tmp_path / "a.json").read_text())
    monkeypatch.setenv("BENCHSEAL_HOME", str(tmp_path / "other-home"))  # no cache: read the image again
    second = json.loads(sbom.write_sbom(planted.ref, tmp_path / "b.json").read_text())
    for doc in (first, second):
        doc["metadata"].pop("timestamp")
    assert first == second


def test_lock_for_another_rootfs_gives_no_deb_hashes(planted: PushedImage, base_lock: Path, tmp_path: Path) -> None:
    data = json.loads(base_lock.read_text())
    data["images"]["planted-base"]["layer"]["digest"] = "sha256:" + "1" * 64
    base_lock.write_text(json.dumps(data))
    doc = json.loads(sbom.write_sbom(planted.ref, tmp_path / "sbom.json").read_text())
    debs = [c for c in doc["components"] if c.get("purl", "").startswith("pkg:deb/")]
    assert debs and not any("hashes" in c for c in debs)
    said = [p["value"] for p in doc["metadata"]["component"]["properties"] if p["name"] == "benchseal:deb-hashes"]
    assert said == [f"unavailable: no base lock entry records the .debs of layer {json.loads(planted.manifest)['layers'][0]['digest']}"]


def test_corrupt_layer_fails() -> None:
    gz = "application/vnd.oci.image.layer.v1.tar+gzip"
    layer = _layers()[0]
    with pytest.raises(CheckFailed, match="truncated"):
        sbom._apply_layer({}, io.BytesIO(layer[:-20]), gz)
    flipped = bytearray(layer)
    flipped[len(flipped) // 2] ^= 0xFF
    with pytest.raises(CheckFailed):
        sbom._apply_layer({}, io.BytesIO(bytes(flipped)), gz)
    with pytest.raises(CheckFailed, match="not a readable tar"):
        sbom._apply_layer({}, io.BytesIO(gzip.compress(b"\x01" * 1024)), gz)
