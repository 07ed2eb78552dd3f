"""The npm resolver against a real npm registry (verdaccio on 127.0.0.1), with tarballs made by npm pack.

Hostile cases tamper with what the registry stores (its tarballs and stored packuments) or put a
hostile mirror (a stdlib HTTP server) in front of it; each must end in one clear line before
anything is returned, with nothing left in the destination.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import socket
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pipeline.agent import npm
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError, ValidationError
from pipeline.local.npmregistry import LocalNpmRegistry, npm_pack

SCOPE = "@bs-test"


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNpmRegistry]:
    with LocalNpmRegistry(tmp_path_factory.mktemp("verdaccio")) as started:  # fails loudly if it cannot start
        yield started


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, str]]:
    root = tmp_path_factory.mktemp("packages")

    def pack(name: str, version: str) -> tuple[Path, str]:
        """npm pack of a tiny package ``name@version`` (a bin with its exec bit, an index, a nested file)."""
        source = root / "src" / f"{name.replace('/', '+')}-{version}"
        (source / "lib").mkdir(parents=True)
        (source / "package.json").write_text(json.dumps(
            {"name": name, "version": version, "license": "MIT", "main": "index.js", "bin": {"hello": "cli.js"}}))
        (source / "cli.js").write_text(f"#!/usr/bin/env node\nconsole.log('{name}@{version}')\n")
        (source / "cli.js").chmod(0o755)
        (source / "index.js").write_text("module.exports = require('./lib/util.js')\n")
        (source / "lib" / "util.js").write_text(f"module.exports = {json.dumps(version)}\n")
        return npm_pack(source, root / "tgz")

    return pack


def _sri(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def _patch_stored(registry: LocalNpmRegistry, package: str, version: str, **dist: Any) -> None:
    """Change the stored packument's dist of ``version`` (a value of None deletes the key)."""
    stored = registry.storage_packument(package)
    document = json.loads(stored.read_text())
    entry = document["versions"][version]["dist"]
    for key, value in dist.items():
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value
    stored.write_text(json.dumps(document))


def _refused(registry: str, package: str, version: str, dest: Path, match: str, **kwargs: Any) -> CheckFailed:
    with pytest.raises(CheckFailed, match=match) as caught:
        npm.fetch_release(registry, package, version, dest, wait_seconds=kwargs.pop("wait_seconds", 0), **kwargs)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("npm: ")
    assert not dest.exists() or list(dest.iterdir()) == [], "a refused fetch left files behind"
    return caught.value


# --- the happy path -------------------------------------------------------------------------------


def test_fetch_checks_and_unpack_gives_the_package(registry: LocalNpmRegistry, packs: Callable[..., tuple[Path, str]],
                                                   tmp_path: Path) -> None:
    package = f"{SCOPE}/happy"
    tarball, packed_integrity = packs(package, "1.2.3")
    assert registry.publish(tarball) == packed_integrity == _sri(tarball)

    got = npm.fetch_release(registry.url, package, "1.2.3", tmp_path / "dl", wait_seconds=5, poll_seconds=0.2)
    assert got == npm.NpmTarball(package=package, version="1.2.3", integrity=packed_integrity,
                                 path=tmp_path / "dl" / "bs-test-happy-1.2.3.tgz")
    assert got.path.read_bytes() == tarball.read_bytes() and sorted(os.listdir(tmp_path / "dl")) == [got.path.name]

    root = npm.unpack(got.path, tmp_path / "one")
    assert root == tmp_path / "one" / "package"
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    assert files == ["cli.js", "index.js", "lib", "lib/util.js", "package.json"]
    assert (root / "cli.js").stat().st_mode & 0o777 == 0o755
    assert (root / "index.js").stat().st_mode & 0o777 == 0o644
    assert (root / "lib").stat().st_mode & 0o777 == 0o755
    assert (root / "lib" / "util.js").read_text() == 'module.exports = "1.2.3"\n'
    assert {int(p.stat().st_mtime) for p in [root, *root.rglob("*")]} == {npm.NPM_MTIME}

    def tree(top: Path) -> list[tuple[str, int, int, bytes]]:
        return [(p.relative_to(top).as_posix(), p.stat().st_mode, int(p.stat().st_mtime),
                 p.read_bytes() if p.is_file() else b"") for p in sorted(top.rglob("*"))]

    assert tree(npm.unpack(got.path, tmp_path / "two")) == tree(root)  # deterministic
    with pytest.raises(UsageError, match="already exists"):
        npm.unpack(got.path, tmp_path / "one")
    assert [p.name for p in (tmp_path / "one").iterdir()] == ["package"]  # no staging dir left


def test_an_unscoped_prerelease_too(registry: LocalNpmRegistry, packs: Callable[..., tuple[Path, str]],
                                    tmp_path: Path) -> None:
    tarball, integrity = packs("bs-test-plain", "2.0.0-rc.1")
    registry.publish(tarball)
    got = npm.fetch_release(registry.url.rstrip("/"), "bs-test-plain", "2.0.0-rc.1", tmp_path, wait_seconds=0)
    assert got.integrity == integrity and got.path.name == "bs-test-plain-2.0.0-rc.1.tgz"


def test_a_version_published_during_the_wait_is_taken(registry: LocalNpmRegistry,
                                                      packs: Callable[..., tuple[Path, str]], tmp_path: Path) -> None:
    package = f"{SCOPE}/late"
    first, _ = packs(package, "1.0.0")
    registry.publish(first)  # the package exists; the version asked for does not, yet
    later, integrity = packs(package, "1.1.0")
    errors: list[BaseException] = []

    def publish_later() -> None:
        time.sleep(1.0)
        try:
            registry.publish(later)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=publish_later)
    started = time.monotonic()
    thread.start()
    try:
        got = npm.fetch_release(registry.url, package, "1.1.0", tmp_path, wait_seconds=20, poll_seconds=0.2)
    finally:
        thread.join()
    assert errors == []
    assert got.integrity == integrity and got.version == "1.1.0"
    assert 1.0 <= time.monotonic() - started < 10


# --- hostile registries ---------------------------------------------------------------------------


def test_the_wait_is_bounded(registry: LocalNpmRegistry, packs: Callable[..., tuple[Path, str]],
                             tmp_path: Path) -> None:
    package = f"{SCOPE}/never"
    registry.publish(packs(package, "1.0.0")[0])
    for name, version in [(package, "9.9.9"), (f"{SCOPE}/no-such-package", "1.0.0")]:  # a version, a 404
        started = time.monotonic()
        error = _refused(registry.url, name, version, tmp_path / "dl", "was not published",
                         wait_seconds=1, poll_seconds=0.2)
        assert str(error) == f"npm: {name}@{version} was not published on {registry.url} within 1 s"
        assert 1.0 <= time.monotonic() - started < 3.0


def test_tarball_bytes_must_match_dist_integrity(registry: LocalNpmRegistry,
                                                 packs: Callable[..., tuple[Path, str]], tmp_path: Path) -> None:
    package = f"{SCOPE}/tampered"
    tarball, integrity = packs(package, "1.0.0")
    registry.publish(tarball)
    stored = registry.storage_tarball(package, "1.0.0")
    assert stored.read_bytes() == tarball.read_bytes()

    with stored.open("ab") as handle:  # bytes appended
        handle.write(b"\0" * 17)
    error = _refused(registry.url, package, "1.0.0", tmp_path / "a", "does not match its dist.integrity")
    assert integrity in str(error)

    # A valid tarball of the same name and version, other content.
    stored.write_bytes(packs(package, "1.0.0-other")[0].read_bytes())
    _refused(registry.url, package, "1.0.0", tmp_path / "b", "does not match its dist.integrity")


@pytest.mark.parametrize(("package", "impostor", "impostor_version"), [
    (f"{SCOPE}/named-a", f"{SCOPE}/impostor", "1.0.0"),  # another package
    (f"{SCOPE}/named-b", f"{SCOPE}/named-b", "1.0.1"),  # another version
])
def test_the_tarball_must_name_the_package_and_version(registry: LocalNpmRegistry,
                                                       packs: Callable[..., tuple[Path, str]], tmp_path: Path,
                                                       package: str, impostor: str, impostor_version: str) -> None:
    registry.publish(packs(package, "1.0.0")[0])
    other, other_integrity = packs(impostor, impostor_version)
    # The registry serves another tarball, with a dist.integrity that matches it.
    registry.storage_tarball(package, "1.0.0").write_bytes(other.read_bytes())
    _patch_stored(registry, package, "1.0.0", integrity=other_integrity,
                  shasum=hashlib.sha1(other.read_bytes()).hexdigest())  # npm's legacy field
    error = _refused(registry.url, package, "1.0.0", tmp_path, "says it is")
    assert str(error) == f"npm: the tarball of {package}@1.0.0 says it is {impostor}@{impostor_version}"


def test_dist_integrity_must_be_sha512(registry: LocalNpmRegistry, packs: Callable[..., tuple[Path, str]],
                                       tmp_path: Path) -> None:
    package = f"{SCOPE}/sha1-only"
    tarball, _ = packs(package, "1.0.0")
    registry.publish(tarball)
    assert "shasum" in registry.packument(package)["versions"]["1.0.0"]["dist"]
    _patch_stored(registry, package, "1.0.0", integrity=None)
    error = _refused(registry.url, package, "1.0.0", tmp_path / "a", "no sha512 dist.integrity")
    assert "(only a sha1 shasum)" in str(error)

    sha1 = "sha1-" + base64.b64encode(hashlib.sha1(tarball.read_bytes()).digest()).decode()
    _patch_stored(registry, package, "1.0.0", integrity=sha1)
    _refused(registry.url, package, "1.0.0", tmp_path / "b", "not one sha512 SRI hash")
    _patch_stored(registry, package, "1.0.0", integrity=f"{_sri(tarball)} {sha1}")
    _refused(registry.url, package, "1.0.0", tmp_path / "c", "not one sha512 SRI hash")


class _Mirror:
    """A hostile mirror in front of the registry: it forwards, and rewrites what ``rewrite`` says."""

    def __init__(self, upstream: str, rewrite: Callable[[str, int, bytes], tuple[int, dict[str, str], bytes]]) -> None:
        self.seen: list[tuple[str, str | None]] = []  # (path, Authorization)
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                mirror.seen.append((self.path, self.headers.get("Authorization")))
                try:
                    with urllib.request.urlopen(upstream + self.path.lstrip("/"), timeout=10) as response:
                        status, body = response.status, response.read()
                except urllib.error.HTTPError as exc:
                    status, body = exc.code, exc.read()
                if not self.path.endswith(".tgz"):  # a mirror names itself in the tarball URLs
                    body = body.replace(upstream.encode(), mirror.url.encode())
                status, headers, body = rewrite(self.path, status, body)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Mirror:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_tarball_must_come_from_the_registry_origin(registry: LocalNpmRegistry,
                                                        packs: Callable[..., tuple[Path, str]], tmp_path: Path) -> None:
    package = f"{SCOPE}/elsewhere"
    registry.publish(packs(package, "1.0.0")[0])
    # "localhost" reaches the same verdaccio: the bytes would even match; the origin alone refuses them.
    elsewhere = registry.url.replace("127.0.0.1", "localhost")

    def other_origin(path: str, status: int, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if path.endswith(".tgz"):
            return 200, {}, body
        document = json.loads(body)
        dist = document["versions"]["1.0.0"]["dist"]
        dist["tarball"] = dist["tarball"].replace(mirror.url, elsewhere)
        return 200, {"Content-Type": "application/json"}, json.dumps(document).encode()

    with _Mirror(registry.url, other_origin) as mirror:
        _refused(mirror.url, package, "1.0.0", tmp_path / "a", "is on another origin")

    def redirect(path: str, status: int, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if path.endswith(".tgz"):
            return 302, {"Location": elsewhere + path.lstrip("/")}, b""
        return status, {"Content-Type": "application/json"}, body

    with _Mirror(registry.url, redirect) as mirror:
        _refused(mirror.url, package, "1.0.0", tmp_path / "b", "redirects to another origin", token="s3cret-token")
        assert mirror.seen and {auth for _path, auth in mirror.seen} == {"Bearer s3cret-token"}

    def same_origin(path: str, status: int, body: bytes) -> tuple[int, dict[str, str], bytes]:
        return status, {"Content-Type": "application/json"}, body

    with _Mirror(registry.url, same_origin) as mirror:
        got = npm.fetch_release(mirror.url, package, "1.0.0", tmp_path / "c", wait_seconds=0, token="s3cret-token")
        assert got.path.is_file()
        # The token went to the mirror's packument and tarball requests in the header only.
        assert [auth for _path, auth in mirror.seen] == ["Bearer s3cret-token"] * 2
        assert all("s3cret" not in path for path, _auth in mirror.seen)


def test_answers_that_are_no_packument(registry: LocalNpmRegistry, tmp_path: Path) -> None:
    def garbage(path: str, status: int, body: bytes) -> tuple[int, dict[str, str], bytes]:
        return 200, {}, b"<html>not json</html>"

    def twice(path: str, status: int, body: bytes) -> tuple[int, dict[str, str], bytes]:
        return 200, {}, b'{"versions": {}, "versions": {"1.0.0": {}}}'

    def refused(path: str, status: int, body: bytes) -> tuple[int, dict[str, str], bytes]:
        return 403, {}, b"{}"

    with _Mirror(registry.url, garbage) as mirror:
        _refused(mirror.url, f"{SCOPE}/any", "1.0.0", tmp_path, "is not strict JSON")
    with _Mirror(registry.url, twice) as mirror:
        _refused(mirror.url, f"{SCOPE}/any", "1.0.0", tmp_path, "is not strict JSON")
    with _Mirror(registry.url, refused) as mirror:
        _refused(mirror.url, f"{SCOPE}/any", "1.0.0", tmp_path, "refused the packument of @bs-test/any: HTTP 403",
                 wait_seconds=5)


def test_a_registry_that_does_not_answer(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/"
    started = time.monotonic()
    with pytest.raises(InfrastructureError, match=r"does not answer .* \(waited 0.5 s\)") as caught:
        npm.fetch_release(closed, "left-pad", "1.3.0", tmp_path, wait_seconds=0.5, poll_seconds=0.1)
    assert not isinstance(caught.value, CheckFailed) and "\n" not in str(caught.value)
    assert time.monotonic() - started < 3 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"registry": "ftp://127.0.0.1/"}, "registry"),
    ({"registry": "http://10.0.0.7:4873/"}, "registry"),  # plain http beyond the loopback
    ({"registry": "https://user:pw@127.0.0.1/"}, "registry"),
    ({"registry": "https://127.0.0.1:99999/"}, "registry"),
    ({"registry": "https://127.0.0.1/?x=1"}, "registry"),
    ({"package": "Bad/Name"}, "package"),
    ({"package": "../x"}, "package"),
    ({"package": "@scope/a/b"}, "package"),
    ({"version": "v1.0.0"}, "version"),
    ({"version": "1.0.0/../x"}, "version"),
    ({"wait_seconds": -1}, "wait_seconds"),
    ({"wait_seconds": float("nan")}, "wait_seconds"),
    ({"poll_seconds": 0}, "poll_seconds"),
])
def test_input_rules(kwargs: dict[str, Any], field: str, tmp_path: Path) -> None:
    args: dict[str, Any] = {"registry": "http://127.0.0.1:9/", "package": "@a/b", "version": "1.0.0",
                            "wait_seconds": 0, **kwargs}
    with pytest.raises(ValidationError) as caught:
        npm.fetch_release(args.pop("registry"), args.pop("package"), args.pop("version"), tmp_path, **args)
    assert caught.value.field == field and caught.value.exit_code == 2


def test_default_registry(monkeypatch: pytest.MonkeyPatch, registry: LocalNpmRegistry) -> None:
    monkeypatch.setenv(npm.REGISTRY_ENV, "http://127.0.0.1:4873")
    assert npm.default_registry() == "http://127.0.0.1:4873/"
    monkeypatch.setenv(npm.REGISTRY_ENV, "http://10.1.2.3/")
    with pytest.raises(ValidationError):
        npm.default_registry()
    monkeypatch.delenv(npm.REGISTRY_ENV)
    monkeypatch.setenv("npm_config_registry", registry.url)  # what npm itself is configured with
    assert npm.default_registry() == registry.url


# --- unpack: hostile tarballs ---------------------------------------------------------------------


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def _entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


_MANIFEST = (_entry("package/package.json"), b'{"name": "x", "version": "1.0.0"}')


@pytest.mark.parametrize(("members", "match"), [
    ([_MANIFEST, (_entry("package/../x"), b"x")], "'package/../x', a name that"),
    ([_MANIFEST, (_entry("package/a/../../x"), b"x")], "a name that"),
    ([_MANIFEST, (_entry("/package/x"), b"x")], "an absolute name"),
    ([_MANIFEST, (_entry("other/x"), b"x")], "a name outside package/"),
    ([_MANIFEST, (_entry("package/link", tarfile.SYMTYPE, "../../etc/passwd"), b"")], "a link"),
    ([_MANIFEST, (_entry("package/link", tarfile.SYMTYPE, "package.json"), b"")], "a link"),
    ([_MANIFEST, (_entry("package/hard", tarfile.LNKTYPE, "/etc/passwd"), b"")], "a link"),
    ([_MANIFEST, (_entry("package/dev", tarfile.CHRTYPE), b"")], "a device"),
    ([_MANIFEST, (_entry("package/fifo", tarfile.FIFOTYPE), b"")], "a device"),
    ([_MANIFEST, (_entry("package/a"), b"1"), (_entry("package/a"), b"2")], "twice"),
    # A file, then a member under it (extraction would end in NotADirectoryError), and the variants.
    ([_MANIFEST, (_entry("package/f"), b"1"), (_entry("package/f/g"), b"2")],
     r"'package/f/g', which is under 'package/f', which is a file"),
    ([_MANIFEST, (_entry("package/f"), b"1"), (_entry("package/f/d/e/g"), b"2")], "which is a file"),
    ([_MANIFEST, (_entry("package/f"), b"1"), (_entry("package/f/d", tarfile.DIRTYPE, mode=0o755), b"")],
     "which is a file"),
    ([_MANIFEST, (_entry("package/d/g"), b"1"), (_entry("package/d"), b"2")], "is a file and a directory"),
    ([_MANIFEST, (_entry("package/d", tarfile.DIRTYPE, mode=0o755), b""), (_entry("package/d"), b"2")],
     "appears twice"),
    ([_MANIFEST, (_entry("package/f"), b"1"), (_entry("package/f", tarfile.DIRTYPE, mode=0o755), b"")],
     "appears twice"),
    ([_MANIFEST, _MANIFEST], "'package/package.json', which appears twice"),
    ([(_entry("package/index.js"), b"")], "no package/package.json"),
])
def test_unpack_refuses_hostile_tarballs(members: list[tuple[tarfile.TarInfo, bytes]], match: str,
                                         tmp_path: Path) -> None:
    tarball = _tar(tmp_path / "hostile.tgz", members)
    with pytest.raises(CheckFailed, match=match) as caught:
        npm.unpack(tarball, tmp_path / "out")
    assert "\n" not in str(caught.value)
    assert list((tmp_path / "out").iterdir()) == []  # nothing unpacked, no staging dir left
    assert not (tmp_path / "x").exists() and not (tmp_path.parent / "x").exists()


def test_a_published_tarball_unpack_would_refuse_is_not_kept(registry: LocalNpmRegistry, tmp_path: Path) -> None:
    """The check runs when the tarball is fetched too: nothing is kept, no traceback later in the build."""
    package = f"{SCOPE}/file-then-dir"
    manifest = (_entry("package/package.json"), json.dumps({"name": package, "version": "1.0.0"}).encode())
    hostile = _tar(tmp_path / "file-then-dir-1.0.0.tgz",
                   [manifest, (_entry("package/f"), b"1"), (_entry("package/f/g"), b"2")])
    registry.publish(hostile)
    error = _refused(registry.url, package, "1.0.0", tmp_path / "dest", "which is a file")
    assert str(error) == (f"npm: the tarball of {package}@1.0.0 holds 'package/f/g', which is under 'package/f', "
                          "which is a file: refused")


def test_unpack_normalises_modes(tmp_path: Path) -> None:
    tarball = _tar(tmp_path / "modes.tgz", [
        _MANIFEST,
        (_entry("package/bin/run", mode=0o4775), b"#!/bin/sh\n"),  # setuid, group-writable: dropped
        (_entry("package/data", mode=0o600), b"d"),
        (_entry("package/odd", mode=0o010), b"o"),  # any exec bit makes it executable
    ])
    root = npm.unpack(tarball, tmp_path / "out")
    modes = {p.relative_to(root).as_posix(): p.stat().st_mode & 0o7777 for p in root.rglob("*")}
    assert modes == {"package.json": 0o644, "bin": 0o755, "bin/run": 0o755, "data": 0o644, "odd": 0o755}


def test_read_manifest_wants_exactly_one(tmp_path: Path) -> None:
    two = _tar(tmp_path / "two.tgz", [_MANIFEST, _MANIFEST])
    with pytest.raises(CheckFailed, match=r"2 package/package\.json entries"):
        npm.read_manifest(two)
    (tmp_path / "not.tgz").write_bytes(b"plain bytes")
    with pytest.raises(CheckFailed, match="not a readable gzip tar"):
        npm.read_manifest(tmp_path / "not.tgz")
