"""The SBOM's parts on their own: Go build info, licenses, dependency resolution, the NTIA report,
and the base lock's .deb hashes. No registry or Docker needed."""

from __future__ import annotations

import email.parser
import json
import struct
from pathlib import Path

import pytest

from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.evidence import depgraph, goinfo
from pipeline.evidence.licenses import dep5_licenses, is_unknown, npm_licenses, python_licenses
from pipeline.imaging import base
from pipeline.local.ntia import ntia_report

START = b"0w\xaf\x0c\x92t\x08\x02A\xe1\xc1\x07\xe6\xd6\x18\xe6"
END = b"\xf92C1\x86\x18 r\x00\x82B\x10A\x16\xd8\xf2"
MODINFO = (
    "path\texample.com/tool/cmd/tool\n"
    "mod\texample.com/tool\tv1.4.2\th1:main=\n"
    "dep\tgithub.com/a/b\tv0.3.0\th1:ab=\n"
    "dep\tgolang.org/x/sys\tv0.1.0\th1:old=\n"
    "=>\tgolang.org/x/sys\tv0.2.0\th1:new=\n"
    "build\t-ldflags=-s -w\n"
    "build\tvcs.revision=0123abcd\n"
)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def go_blob(modinfo: str = MODINFO, version: str = "go1.24.9") -> bytes:
    """A Go >= 1.18 build info blob (inline strings), as the linker writes it."""
    mod = START + modinfo.encode() + END
    header = goinfo.MAGIC + bytes([8, 2]) + bytes(16)
    return header + _varint(len(version)) + version.encode() + _varint(len(mod)) + mod


def fake_go_elf(modinfo: str = MODINFO) -> bytes:
    """An ELF64 file with no section table (stripped): the build info is found by scanning."""
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    body = bytes(header) + b"\x00" * 64  # aligned to 16 bytes
    return body + go_blob(modinfo) + b"\x00" * 32


def test_go_buildinfo_inline() -> None:
    info = goinfo.parse(fake_go_elf())
    assert info is not None
    assert info.go_version == "go1.24.9" and info.path == "example.com/tool/cmd/tool"
    assert info.main == goinfo.GoModule("example.com/tool", "v1.4.2", "h1:main=")
    assert [(d.path, d.version) for d in info.deps] == [("github.com/a/b", "v0.3.0"), ("golang.org/x/sys", "v0.2.0")]
    assert info.deps[1].replaced_by == "golang.org/x/sys@v0.2.0"
    assert info.setting("vcs.revision") == "0123abcd"
    assert info.main_version() == ("v1.4.2", "module")


def test_go_devel_version_from_ldflags() -> None:
    modinfo = MODINFO.replace("v1.4.2", "(devel)").replace(
        "-ldflags=-s -w", "-ldflags=\"-s -w -X example.com/tool/internal.Version=v9.9.9\"")
    info = goinfo.parse(fake_go_elf(modinfo))
    assert info is not None and info.main_version() == ("v9.9.9", "ldflags")
    plain = goinfo.parse(fake_go_elf(MODINFO.replace("v1.4.2", "(devel)")))
    assert plain is not None and plain.main_version() == ("(devel)", "module")


def test_go_buildinfo_hostile() -> None:
    assert goinfo.parse(b"\x7fELF" + b"\x00" * 200) is None  # no build info: not a Go binary
    # the magic at an unaligned offset is not a header
    assert goinfo.parse(b"\x00" * 3 + go_blob()) is None
    truncated = fake_go_elf()
    cut = truncated.index(goinfo.MAGIC) + 33
    with pytest.raises(goinfo.BuildInfoError):
        goinfo.parse(truncated[:cut] + b"\xff" * 3)
    with pytest.raises(goinfo.BuildInfoError):
        goinfo.parse_modinfo("go1.22", "=>\tx\tv1\n")
    # modinfo without its sentinels is ignored, not misread
    bare = goinfo.MAGIC + bytes([8, 2]) + bytes(16) + _varint(6) + b"go1.22" + _varint(5) + b"mod\tx"
    info = goinfo.parse(bytes(16) + bare)
    assert info is not None and info.main is None and info.deps == ()


def test_go_buildinfo_pointer_format() -> None:
    """Go < 1.18: the header holds pointers to string headers, resolved through the ELF PT_LOAD segment."""
    vaddr = 0x400000
    data = bytearray(0x400)
    data[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", data, 0x20, 64)  # e_phoff
    struct.pack_into("<HH", data, 0x36, 56, 1)  # e_phentsize, e_phnum
    struct.pack_into("<IIQQQQ", data, 64, 1, 5, 0, vaddr, vaddr, len(data))  # PT_LOAD at offset 0
    version, mod = b"go1.16.5", START + MODINFO.encode() + END
    data[0x200:0x200 + len(version)] = version
    data[0x240:0x240 + len(mod)] = mod
    struct.pack_into("<QQ", data, 0x100, vaddr + 0x200, len(version))  # string header of the version
    struct.pack_into("<QQ", data, 0x110, vaddr + 0x240, len(mod))
    header = goinfo.MAGIC + bytes([8, 0]) + struct.pack("<QQ", vaddr + 0x100, vaddr + 0x110)
    data[0x80:0x80 + len(header)] = header
    info = goinfo.parse(bytes(data))
    assert info is not None and info.go_version == "go1.16.5" and info.main is not None
    assert info.main.path == "example.com/tool"


DEP5 = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: thing

Files: *
Copyright: 2001 Someone
License: GPL-2+

Files: lib/*
Copyright: 2003 Other
License: Expat or GPL-1+ or Artistic

Files: weird/*
Copyright: 2004 X
License: Permission is hereby granted, free of charge, to any person
 obtaining a copy

Files: old/*
Copyright: 2005 Y
License: GPL-3+ with Bison exception

License: GPL-2+
 This program is free software ...
"""


def test_dep5_licenses() -> None:
    found = dep5_licenses(DEP5, "/usr/share/doc/thing/copyright")
    assert found is not None
    assert {(lic.kind, lic.value) for lic in found} == {
        ("id", "GPL-2.0-or-later"), ("id", "MIT"), ("id", "GPL-1.0-or-later"), ("id", "Artistic-1.0"),
        ("name", "GPL-3+ with Bison exception")}
    assert all(lic.source == "/usr/share/doc/thing/copyright" for lic in found)
    # not machine-readable: no answer (the caller names it unknown), never a guess from the text
    assert dep5_licenses("This is GPL-2 licensed.\n\nLicense: MIT\n", "x") is None


def _meta(text: str) -> email.message.Message:
    return email.parser.Parser().parsestr(text)


def test_python_licenses() -> None:
    expr = python_licenses(_meta("Name: a\nLicense-Expression: MIT OR Apache-2.0\nLicense: BSD\n\n"), "m")
    assert [(x.kind, x.value) for x in expr] == [("expression", "MIT OR Apache-2.0")]
    field = python_licenses(_meta("Name: a\nLicense: bsd-3-clause\n\n"), "m")
    assert [(x.kind, x.value) for x in field] == [("id", "BSD-3-Clause")]
    classifier = python_licenses(_meta(
        "Name: a\nLicense: Apache 2\nClassifier: License :: OSI Approved :: Apache Software License\n\n"), "m")
    assert [(x.kind, x.value) for x in classifier] == [("id", "Apache-2.0")]
    name = python_licenses(_meta("Name: a\nLicense: Some Custom License\n\n"), "m")
    assert [(x.kind, x.value) for x in name] == [("name", "Some Custom License")]
    long_text = python_licenses(_meta("Name: a\nLicense: Copyright (c) 2020\n        Permission is hereby granted\n\n"), "m")
    assert is_unknown(long_text)
    assert is_unknown(python_licenses(_meta("Name: a\nLicense: UNKNOWN\n\n"), "m"))
    assert [x.value for x in npm_licenses({"license": "ISC"}, "p")] == ["ISC"]
    assert [x.value for x in npm_licenses({"licenses": [{"type": "MIT"}]}, "p")] == ["MIT"]
    assert is_unknown(npm_licenses({}, "p"))


def test_deb_edges_alternatives_and_virtual() -> None:
    nodes = [
        depgraph.DebNode("a", "a", "amd64", "libc6 (>= 2.34), awk | mawk, missing-pkg | mail-transport-agent", ""),
        depgraph.DebNode("libc6", "libc6", "amd64", "libgcc-s1", ""),
        depgraph.DebNode("libgcc-s1", "libgcc-s1", "amd64", "libc6 (>= 2.35)", ""),
        depgraph.DebNode("mawk", "mawk", "amd64", "", "awk"),
        depgraph.DebNode("postfix", "postfix", "amd64", "libc6:any", "mail-transport-agent (= 1.0), default-mta"),
        depgraph.DebNode("b", "b", "amd64", "nothere", ""),
    ]
    edges, missing = depgraph.deb_edges(nodes)
    assert edges["a"] == ["libc6", "mawk", "postfix"]
    assert edges["postfix"] == ["libc6"]
    assert edges["libc6"] == ["libgcc-s1"] and edges["libgcc-s1"] == ["libc6"]
    assert missing == ["b -> nothere"]
    roots = depgraph.roots([n.key for n in nodes], edges)
    assert "a" in roots and "b" in roots and "libc6" not in roots and "mawk" not in roots


def test_python_edges_markers_and_extras() -> None:
    nodes = [
        depgraph.PyNode("app", "app", "site", ("lib[fast]>=1", "old; python_version < '3.11'",
                                               "winonly; sys_platform == 'win32'", "absent>=2"), "3.13", "3.13.5"),
        depgraph.PyNode("lib", "lib", "site", ("speedup; extra == 'fast'", "docs; extra == 'docs'"), "3.13", "3.13.5"),
        depgraph.PyNode("speedup", "speedup", "site", ("x86only; platform_machine == 'x86_64'",), "3.13", "3.13.5"),
        depgraph.PyNode("x86only", "x86only", "site", (), "3.13", "3.13.5"),
        depgraph.PyNode("old", "old", "site", (), "3.13", "3.13.5"),
        depgraph.PyNode("docs", "docs", "site", (), "3.13", "3.13.5"),
        depgraph.PyNode("winonly", "winonly", "site", (), "3.13", "3.13.5"),
    ]
    edges, missing = depgraph.python_edges(nodes, "x86_64")
    assert edges["app"] == ["lib"]
    assert edges["lib"] == ["speedup"], "extra 'fast' is asked for, 'docs' is not"
    assert edges["speedup"] == ["x86only"]
    assert any(m.startswith("app -> absent") for m in missing)
    arm, _ = depgraph.python_edges(nodes, "aarch64")
    assert arm["speedup"] == []


def test_npm_edges_node_resolution() -> None:
    nodes = [
        depgraph.NpmNode("root", "helper", "opt/helper", ("a", "@s/b")),
        depgraph.NpmNode("a", "a", "opt/helper/node_modules/a", ("c",)),
        depgraph.NpmNode("c-nested", "c", "opt/helper/node_modules/a/node_modules/c", ()),
        depgraph.NpmNode("c-top", "c", "opt/helper/node_modules/c", ()),
        depgraph.NpmNode("b", "@s/b", "opt/helper/node_modules/@s/b", ("c", "gone")),
    ]
    edges, missing = depgraph.npm_edges(nodes)
    assert edges["root"] == ["a", "b"]
    assert edges["a"] == ["c-nested"] and edges["b"] == ["c-top"]
    assert missing == ["b -> gone"]


def _doc(components: list[dict[str, object]], deps: list[dict[str, object]], **meta: object) -> str:
    metadata = {"timestamp": "2026-12-03T00:00:00+00:00", "authors": [{"name": "x"}],
                "component": {"bom-ref": "img", "name": "img", "type": "container"}, **meta}
    return json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "metadata": metadata,
                       "components": components, "dependencies": deps})


def test_ntia_report_shares() -> None:
    full = {"bom-ref": "a", "name": "a", "version": "1", "purl": "pkg:pypi/a@1", "supplier": {"name": "A"},
            "licenses": [{"license": {"id": "MIT"}}], "hashes": [{"alg": "SHA-256", "content": "00"}]}
    bare = {"bom-ref": "b", "name": "b", "purl": "pkg:deb/debian/b", "licenses": [{"license": {"name": "unknown"}}]}
    orphan = {"bom-ref": "c", "name": "c", "version": "2", "purl": "pkg:npm/c@2"}
    text = _doc([full, bare, orphan], [{"ref": "img", "dependsOn": ["a"]}, {"ref": "a", "dependsOn": ["b"]},
                                       {"ref": "b"}, {"ref": "c"}])
    report = ntia_report(text)
    assert report.total == 3
    assert report.met == {"supplier": 1, "name": 3, "version": 2, "unique_id": 3, "dependency_relationship": 2,
                          "author": 3, "timestamp": 3}
    assert report.licensed == {"pypi": 1} and report.hashed == {"pypi": 1}
    assert "supplier 33% (1/3)" in report.summary()
    # hostile: a duplicated bom-ref is no unique id; no timestamp / author counts for no component
    dup = ntia_report(_doc([full, dict(full)], [], timestamp=None, authors=[]))
    assert dup.met["unique_id"] == 0 and dup.met["timestamp"] == 0 and dup.met["author"] == 0
    with pytest.raises(CheckFailed):
        ntia_report("[1, 2")


def test_deb_entries_from_sha256sum() -> None:
    text = ("f5a0546098f38bad5843380521781fe7214e5a283d3bed63f79c505545f262af  base-files_13.8+deb13u8_amd64.deb\n"
            "15c2030e0fb46580af4f1b4cc303f4bd26da781b004e99763bc9eff7cf8e19b8  bsdutils_1%3a2.41.5-0+deb13u1_amd64.deb\n"
            "cf31c6956ab5f65815d9d9ea1615c4f78ecd2893c31119658248a4756cee83e7  tzdata_2025b-4_all.deb\n")
    debs = base.deb_entries(text)
    assert debs["bsdutils:amd64"] == {"version": "1:2.41.5-0+deb13u1",
                                      "sha256": "15c2030e0fb46580af4f1b4cc303f4bd26da781b004e99763bc9eff7cf8e19b8"}
    assert debs["tzdata:all"]["version"] == "2025b-4"
    for bad in ("nothex  a_1_amd64.deb", "f5a0546098f38bad5843380521781fe7214e5a283d3bed63f79c505545f262af  a.deb",
                text + text, ""):
        with pytest.raises(CheckFailed):
            base.deb_entries(bad)


def test_mmdebstrap_argv_keeps_the_history_line() -> None:
    """Recording .deb hashes must not change the base config (its history names the command)."""
    spec = base.load_specs()["runner-base"]
    plain = spec.mmdebstrap_argv(Path("rootfs.tar"))
    assert not any("essential/unlink" in a or "sha256sum" in a for a in plain)
    hashed = spec.mmdebstrap_argv(Path("/tmp/out.tar"), deb_sums=Path("/tmp/x.sha256sums"))
    assert "--skip=essential/unlink" in hashed and any('sha256sum -- *.deb > "/tmp/x.sha256sums"' in a for a in hashed)
    assert hashed[-2:] == [spec.suite, "/tmp/out.tar"]
    with pytest.raises(ValidationError):
        spec.mmdebstrap_argv(Path("/tmp/out.tar"), deb_sums=Path("/tmp/a b;rm -rf x"))


def test_deb_hashes_sidecar_is_bound_to_the_tarball(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The .deb hashes beside a cached rootfs count only for that exact tarball; a remembered
    mismatch is not retried (each retry would run mmdebstrap)."""
    spec = base.load_specs()["runner-base"]
    tarball = tmp_path / "runner-base-x.tar"
    tarball.write_bytes(b"rootfs")
    debs = {"libc6:amd64": {"version": "2.41-12", "sha256": "a" * 64}}
    runs: list[Path] = []

    def no_mmdebstrap(spec: object, out: Path) -> dict[str, dict[str, str]]:
        runs.append(out)
        out.write_bytes(b"another rootfs")  # the mirror moved on: not the cached tarball
        return debs

    monkeypatch.setattr(base, "_run_mmdebstrap", no_mmdebstrap)
    base._write_debs(tarball, debs)
    assert base.deb_hashes(spec, tarball) == debs and runs == []
    tarball.write_bytes(b"rootfs, changed")  # the sidecar no longer belongs to it
    assert base.deb_hashes(spec, tarball) is None and len(runs) == 1
    assert base.deb_hashes(spec, tarball) is None and len(runs) == 1, "the mismatch is remembered"
    assert not (tmp_path / "runner-base-x.recheck.tar").exists()
