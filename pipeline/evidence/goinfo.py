"""Go build info read from a binary's bytes (what ``go version -m`` prints), in pure Python.

The Go linker writes a ``.go.buildinfo`` blob: a 32-byte header starting with
``\\xff Go buildinf:`` (16-byte aligned), then the Go version and the module info.
Go >= 1.18 stores both inline as varint-length-prefixed strings (flag bit 2); older
toolchains store pointers to Go string headers, resolved here through the ELF program
headers. The module info is framed by two 16-byte sentinels and holds tab-separated
lines: ``path``, ``mod`` (main module), ``dep`` (dependencies), ``=>`` (replacement of
the line above) and ``build`` (settings such as ``-ldflags``).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

MAGIC = b"\xff Go buildinf:"
_HEADER = 32
_FLAG_BIG_ENDIAN = 0x1
_FLAG_INLINE = 0x2


class BuildInfoError(ValueError):
    """The binary has a Go build info header that cannot be read."""


@dataclass(frozen=True)
class GoModule:
    path: str
    version: str
    sum: str = ""
    replaced_by: str = ""


@dataclass(frozen=True)
class GoBuildInfo:
    go_version: str
    path: str
    main: GoModule | None
    deps: tuple[GoModule, ...]
    settings: tuple[tuple[str, str], ...]

    def setting(self, key: str) -> str | None:
        return next((value for k, value in self.settings if k == key), None)

    def main_version(self) -> tuple[str, str]:
        """(version, where it came from): the module version, else a ``-X ...Version=`` link flag of the main module.

        ``go build`` from a source tree records ``(devel)``; release builds such as Docker Compose's set
        the version with ``-ldflags -X <main module>/...Version=vX``, which the build info keeps.
        """
        version = self.main.version if self.main else ""
        if version and version != "(devel)":
            return version, "module"
        flags = self.setting("-ldflags") or ""
        if self.main is not None:
            prefix = re.escape(self.main.path)
            m = re.search(rf"-X[= ]+['\"]?{prefix}(?:/[^=\s'\"]*)?\.[Vv]ersion=([^\s'\"]+)", flags)
            if m:
                return m.group(1), "ldflags"
        return version or "(devel)", "module"


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise BuildInfoError("truncated varint in the build info")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _inline_string(data: bytes, pos: int) -> tuple[bytes, int]:
    length, pos = _uvarint(data, pos)
    if pos + length > len(data):
        raise BuildInfoError("build info string runs past the end of the file")
    return data[pos:pos + length], pos + length


def _elf_reader(data: bytes) -> tuple[str, list[tuple[int, int, int]]]:
    """(struct byte order, [(vaddr, offset, filesz)] of PT_LOAD segments) of an ELF file."""
    if data[:4] != b"\x7fELF" or len(data) < 64:
        raise BuildInfoError("pre-1.18 build info outside an ELF file is not supported")
    wide = data[4] == 2
    order = "<" if data[5] == 1 else ">"
    if wide:
        phoff, = struct.unpack_from(order + "Q", data, 0x20)
        phentsize, phnum = struct.unpack_from(order + "HH", data, 0x36)
    else:
        phoff, = struct.unpack_from(order + "I", data, 0x1C)
        phentsize, phnum = struct.unpack_from(order + "HH", data, 0x2A)
    segments = []
    for i in range(phnum):
        base = phoff + i * phentsize
        if base + phentsize > len(data):
            raise BuildInfoError("ELF program headers run past the end of the file")
        if wide:
            p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(order + "IIQQQQ", data, base)
        else:
            p_type, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(order + "IIIII", data, base)
        if p_type == 1:
            segments.append((p_vaddr, p_offset, p_filesz))
    return order, segments


def _pointer_strings(data: bytes, start: int, ptr_size: int, big_endian: bool) -> tuple[bytes, bytes]:
    _, segments = _elf_reader(data)
    order = ">" if big_endian else "<"
    fmt = order + ("Q" if ptr_size == 8 else "I")

    def at(vaddr: int, size: int) -> bytes:
        for seg_vaddr, offset, filesz in segments:
            if seg_vaddr <= vaddr and vaddr + size <= seg_vaddr + filesz:
                begin = offset + vaddr - seg_vaddr
                return data[begin:begin + size]
        raise BuildInfoError(f"build info points at 0x{vaddr:x}, outside the file's loaded segments")

    def string(header_addr: int) -> bytes:
        header = at(header_addr, 2 * ptr_size)
        pointer, = struct.unpack_from(fmt, header, 0)
        length, = struct.unpack_from(fmt, header, ptr_size)
        if length > len(data):
            raise BuildInfoError("build info string longer than the file")
        return at(pointer, length) if length else b""

    version_ptr, = struct.unpack_from(fmt, data, start + 16)
    modinfo_ptr, = struct.unpack_from(fmt, data, start + 16 + ptr_size)
    return string(version_ptr), string(modinfo_ptr)


def _elf_section(data: bytes, wanted: bytes) -> tuple[int, int] | None:
    """(offset, size) of a named ELF section; None when absent; raises ValueError when the table is unreadable."""
    wide = data[4] == 2
    order = "<" if data[5] == 1 else ">"
    if wide:
        shoff, = struct.unpack_from(order + "Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", data, 0x3A)
        layout, name_at, offset_at = order + "IIQQQQ", 0, 4
    else:
        shoff, = struct.unpack_from(order + "I", data, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", data, 0x2E)
        layout, name_at, offset_at = order + "IIIIII", 0, 4
    if shnum == 0 or shstrndx >= shnum or shoff + shnum * shentsize > len(data):
        raise ValueError("no usable section header table")
    sections = [struct.unpack_from(layout, data, shoff + i * shentsize) for i in range(shnum)]
    strtab_offset, strtab_size = sections[shstrndx][offset_at], sections[shstrndx][offset_at + 1]
    names = data[strtab_offset:strtab_offset + strtab_size]
    for section in sections:
        start = section[name_at]
        end = names.find(b"\0", start)
        if names[start:end] == wanted:
            return section[offset_at], section[offset_at + 1]
    return None


def find_header(data: bytes) -> int:
    """Offset of the (16-byte aligned) build info header, or -1.

    In an ELF file with a section table, only the ``.go.buildinfo`` section is looked at (a file
    without it is not a Go binary); anything else (stripped section table, other formats) is scanned.
    """
    if data[:4] == b"\x7fELF" and len(data) >= 64:
        try:
            section = _elf_section(data, b".go.buildinfo")
        except (ValueError, struct.error, IndexError):
            section = (0, len(data))
        if section is None:
            return -1
        offset, size = section
        pos = data.find(MAGIC, offset, offset + size)
        while pos >= 0 and pos % 16:
            pos = data.find(MAGIC, pos + 1, offset + size)
        return pos
    pos = data.find(MAGIC)
    while pos >= 0 and pos % 16:
        pos = data.find(MAGIC, pos + 1)
    return pos


def parse(data: bytes) -> GoBuildInfo | None:
    """The build info of a Go binary, or None when ``data`` is not one. Raises BuildInfoError when unreadable."""
    start = find_header(data)
    if start < 0:
        return None
    if start + _HEADER > len(data):
        raise BuildInfoError("truncated build info header")
    ptr_size, flags = data[start + 14], data[start + 15]
    if flags & _FLAG_INLINE:
        version, pos = _inline_string(data, start + _HEADER)
        modinfo, _ = _inline_string(data, pos)
    else:
        if ptr_size not in (4, 8):
            raise BuildInfoError(f"build info pointer size {ptr_size} is neither 4 nor 8")
        version, modinfo = _pointer_strings(data, start, ptr_size, bool(flags & _FLAG_BIG_ENDIAN))
    # The module info is framed by 16-byte sentinels, and its last line ends with a newline.
    if len(modinfo) >= 33 and modinfo[-17:-16] == b"\n":
        modinfo = modinfo[16:-16]
    else:
        modinfo = b""
    return parse_modinfo(version.decode("utf-8", "replace"), modinfo.decode("utf-8", "replace"))


def parse_modinfo(go_version: str, text: str) -> GoBuildInfo:
    path = ""
    main: GoModule | None = None
    deps: list[GoModule] = []
    settings: list[tuple[str, str]] = []
    last: str | None = None  # which module a "=>" line replaces
    for number, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        kind, _, rest = line.partition("\t")
        fields = rest.split("\t")
        if kind == "path":
            path = rest
        elif kind in ("mod", "dep"):
            if len(fields) < 2 or not fields[0]:
                raise BuildInfoError(f"build info line {number}: {kind} needs a module path and version: {line!r}")
            module = GoModule(fields[0], fields[1], fields[2] if len(fields) > 2 else "")
            if kind == "mod":
                main, last = module, "mod"
            else:
                deps.append(module)
                last = "dep"
        elif kind == "=>":
            if last is None or len(fields) < 2:
                raise BuildInfoError(f"build info line {number}: a replacement without a module above it")
            replacement = f"{fields[0]}@{fields[1]}" if fields[1] else fields[0]
            if last == "mod" and main is not None:
                main = GoModule(main.path, main.version, fields[2] if len(fields) > 2 else "", replacement)
            elif deps:
                old = deps.pop()
                # a module replaced by another module is compiled from the replacement's version
                deps.append(GoModule(old.path, fields[1] or old.version, fields[2] if len(fields) > 2 else "", replacement))
        elif kind == "build":
            key, _, value = rest.partition("=")
            settings.append((key, value))
    return GoBuildInfo(go_version=go_version, path=path, main=main, deps=tuple(deps), settings=tuple(settings))
