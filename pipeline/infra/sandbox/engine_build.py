"""The engine proxy's ``/build`` checks: the context tar is read and its Dockerfile may not make the engine fetch."""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
import tarfile
from typing import IO, Literal

from pipeline.infra.sandbox.engine_refusal import Refused

_MAX_DOCKERFILE = 1 << 20
_BUILD_QUERY = frozenset({"t", "dockerfile", "q", "nocache", "rm", "forcerm", "memory", "memswap", "cpushares",
                          "cpusetcpus", "cpuperiod", "cpuquota", "buildargs", "shmsize", "labels", "networkmode",
                          "target", "cachefrom", "pull", "version", "squash", "extrahosts", "buildid"})
_FALSE = ("", "0", "no", "false", "none")  # what the engine's BoolValue reads as false
_ASCII_SPACE = " \t\v\f\r"  # a subset of what Go's parser trims: a comment here is one there too
_ADD_UNSAFE = re.compile(r"://|[$\\`'\"]|git@|^github\.com/", re.IGNORECASE)


def _instructions(text: str, escape: str) -> list[tuple[str, str]]:
    """(keyword, arguments) of each instruction, joined at ``escape`` line continuations as the engine joins them.

    Lines split at "\\n" only (as Go's scanner); comment and blank lines inside a continuation are skipped,
    as the engine skips them. Where this parser and the engine could differ it ends an instruction earlier
    (it sees more instructions, never fewer)."""
    continuation = re.compile(re.escape(escape) + r"[ \t]*$")
    found: list[tuple[str, str]] = []
    current: str | None = None
    for raw in text.split("\n"):
        line = raw.removesuffix("\r")
        stripped = line.lstrip(_ASCII_SPACE)
        if not stripped or stripped.startswith("#"):
            continue
        match = continuation.search(line)
        current = (current or "") + (line[:match.start()] if match else line)
        if not match:
            found.append(_split_instruction(current))
            current = None
    if current is not None:
        found.append(_split_instruction(current))
    return found


def _split_instruction(line: str) -> tuple[str, str]:
    words = line.strip().split(None, 1)
    keyword = words[0] if words else ""
    if not keyword.isascii():  # Go lowercases U+0130 to "i" (ONBUİLD): a non-ASCII keyword is no keyword here
        raise Refused(f"Dockerfile instruction {keyword!r} is not allowed")
    return keyword.upper(), words[1] if len(words) > 1 else ""


def _check_add(args: str) -> None:
    words = args.split()
    while words and words[0].startswith("--"):
        if _ADD_UNSAFE.search(words.pop(0)):
            raise Refused(f"Dockerfile ADD {args!r}: a flag with a URL, variable, quote or escape is not allowed")
    rest = " ".join(words)
    sources: list[str] = [rest]
    if rest.startswith("["):
        with contextlib.suppress(ValueError):
            parsed = json.loads(rest)
            if isinstance(parsed, list) and all(isinstance(s, str) for s in parsed):
                sources = parsed
    for source in sources:
        if _ADD_UNSAFE.search(source):
            raise Refused(f"Dockerfile ADD {args!r}: a URL or git source (the engine would fetch it on the host "
                          "network), or a variable, quote or escape that could make one, is not allowed")


def _check_label(args: str) -> None:
    """A Dockerfile LABEL may not name benchseal's labels: read with quotes, escapes and continuations removed
    (what the engine's word processing could join into the name), and no variable (its value is not seen here)."""
    if "$" in args:
        raise Refused(f"Dockerfile LABEL {args!r}: a variable is not allowed")
    if re.search("benchseal", re.sub(r"[\s\\`'\"]", "", args), re.IGNORECASE):
        raise Refused(f"Dockerfile LABEL {args!r}: labels naming benchseal are the worker's and the proxy's own")


def _dockerfile_names(name: str) -> set[str]:
    """The context paths the engine reads the Dockerfile from (``Dockerfile`` falls back to ``dockerfile``)."""
    wanted = posixpath.normpath("/" + (name or "Dockerfile")).lstrip("/")
    return {wanted, "dockerfile"} if wanted == "Dockerfile" else {wanted}


def _require_archive_end(archive: tarfile.TarFile) -> None:
    """Nothing but the end-of-archive zeros after the last member tarfile read (the engine would read on)."""
    stream = archive.fileobj
    assert stream is not None
    stream.seek(archive.offset)
    while chunk := stream.read(65536):
        if chunk.strip(b"\0"):
            raise Refused("build context: data after the end of the archive")


def _compression(spool: IO[bytes]) -> Literal["r:", "r:gz", "r:bz2", "r:xz"]:
    """The tarfile mode for the compression the engine detects by magic bytes (never tarfile's own guess:
    a gzip stream can be made to look like a plain tar too, and the engine would read the gzip)."""
    spool.seek(0)
    magic = spool.read(6)
    spool.seek(0)
    if magic.startswith(b"BZh"):
        return "r:bz2"
    if magic.startswith(b"\x1f\x8b\x08"):
        return "r:gz"
    if magic.startswith(b"\xfd7zXZ\x00"):
        return "r:xz"
    if magic.startswith(b"\x28\xb5\x2f\xfd"):
        raise Refused("build context: zstd is not read by the proxy")
    return "r:"


def _context_dockerfiles(spool: IO[bytes], name: str) -> list[str]:
    """Every Dockerfile the engine could read from the context; Refused for a link on their path."""
    wanted = _dockerfile_names(name)
    spool.seek(0)
    found: list[str] = []
    try:
        with tarfile.open(fileobj=spool, mode=_compression(spool)) as archive:
            members = archive.getmembers()
            _require_archive_end(archive)
            for member in members:
                norm = posixpath.normpath("/" + member.name).lstrip("/")
                for path in wanted:
                    if norm == path and member.isreg():
                        data = archive.extractfile(member).read(_MAX_DOCKERFILE + 1)  # type: ignore[union-attr]
                        if len(data) > _MAX_DOCKERFILE:
                            raise Refused("build context: Dockerfile too large")
                        found.append(data.decode("utf-8-sig", errors="surrogateescape"))
                    elif (norm == path or path.startswith(norm + "/")) and not member.isdir():
                        raise Refused(f"build context: {member.name!r} (a link or special file) is on the "
                                      "Dockerfile's path")
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        raise Refused(f"build context is not a tar archive the proxy can read: {exc}") from None
    finally:
        spool.seek(0)
    if not found:
        raise Refused(f"build context has no Dockerfile at {sorted(wanted)}")
    return found


def _tagged(name: str) -> str:
    """``name`` with an explicit tag (``:latest`` when none)."""
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last or "@" in last else f"{name}:latest"
