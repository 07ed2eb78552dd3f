"""A wait for the agent's npm release says what it waits for and how long of how long (issue 38.4).

The registry is an in-process HTTP server on 127.0.0.1 that answers 404 for the packument until the
test publishes (an event set from the reporter once it has reported, never after a sleep), then the
packument and a real tarball. Lines are asserted as written: an updating line on a TTY (``\\r`` and
erase-line), plain lines without control characters elsewhere, and what ``release --local``'s stages
show (the stage's own line on a terminal, plain lines on a log).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pipeline.agent import npm
from pipeline.core.errors import CheckFailed
from pipeline.core.paths import REPO_ROOT
from pipeline.core.waiting import WaitLines, current_reporter, reporting
from pipeline.local.stages import StageClock

PACKAGE, VERSION = "@bs-wait/tern-cli", "1.0.1"


def _tarball() -> bytes:
    manifest = json.dumps({"name": PACKAGE, "version": VERSION}).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("package/package.json")
        info.size, info.mode = len(manifest), 0o644
        tar.addfile(info, io.BytesIO(manifest))
    return raw.getvalue()


class _Registry:
    """404 for the packument until ``published`` is set; ``on_miss`` runs at every 404 (the test's probe)."""

    def __init__(self) -> None:
        self.published = threading.Event()
        self.on_miss: Callable[[], None] = lambda: None
        self.misses = 0
        tarball = _tarball()
        integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                if self.path.endswith(".tgz"):
                    status, body = 200, tarball
                elif not registry.published.is_set():
                    registry.misses += 1
                    registry.on_miss()
                    status, body = 404, b'{"error": "not found"}'
                else:
                    status, body = 200, json.dumps({"name": PACKAGE, "versions": {VERSION: {"dist": {
                        "integrity": integrity, "tarball": f"{registry.url}x/-/tern-cli-{VERSION}.tgz"}}}}).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)


@pytest.fixture
def registry() -> Iterator[_Registry]:
    served = _Registry()
    served.thread.start()
    try:
        yield served
    finally:
        served.server.shutdown()
        served.server.server_close()


class _PublishAfter:
    """A reporter that passes everything on and publishes once ``n`` updates were reported."""

    def __init__(self, inner: WaitLines, registry: _Registry, n: int) -> None:
        self.inner, self.registry, self.n, self.updates = inner, registry, n, 0

    def update(self, what: str, elapsed: float, limit: float) -> None:
        self.inner.update(what, elapsed, limit)
        self.updates += 1
        if self.updates >= self.n:
            self.registry.published.set()

    def done(self, what: str, elapsed: float, found: bool) -> None:
        self.inner.done(what, elapsed, found)


WAITING = re.compile(r"waiting for @bs-wait/tern-cli@1\.0\.1 on http://127\.0\.0\.1:[0-9]+/ \(([0-9]+) s of 60 s\)")
FOUND = re.compile(r"waited [0-9]+ s for @bs-wait/tern-cli@1\.0\.1 on http://127\.0\.0\.1:[0-9]+/: done")


def _fetch(registry: _Registry, tmp_path: Path, progress: Any = None, wait: float = 60) -> npm.NpmTarball:
    return npm.fetch_release(registry.url, PACKAGE, VERSION, tmp_path / "dl", wait_seconds=wait, poll_seconds=0.05,
                             progress=progress)


def test_a_log_gets_plain_lines_naming_the_package_the_registry_and_the_seconds(registry: _Registry,
                                                                                 tmp_path: Path) -> None:
    out = io.StringIO()
    got = _fetch(registry, tmp_path, _PublishAfter(WaitLines(out, tty=False, every=0), registry, 3))
    assert got.version == VERSION and registry.misses >= 3
    *waiting, found = out.getvalue().splitlines()
    assert len(waiting) >= 3 and all(WAITING.fullmatch(line) for line in waiting), waiting
    seconds = [int(WAITING.fullmatch(line)[1]) for line in waiting]  # type: ignore[index]
    assert seconds == sorted(seconds)  # how long so far, never backwards
    assert FOUND.fullmatch(found), found
    assert registry.url in found
    assert all(line.isprintable() for line in out.getvalue().splitlines())  # no \r, no ESC in a log
    assert out.getvalue().endswith("\n")


def test_a_terminal_gets_one_updating_line(registry: _Registry, tmp_path: Path) -> None:
    out = io.StringIO()
    _fetch(registry, tmp_path, _PublishAfter(WaitLines(out, tty=True), registry, 2))
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, rewritten, closed once
    *updates, last = text[:-1].split("\r\x1b[K")[1:]
    assert len(updates) >= 2 and all(WAITING.fullmatch(u) for u in updates), updates
    assert FOUND.fullmatch(last)


def test_a_log_line_every_ten_seconds_not_every_poll() -> None:
    """The throttle on the elapsed seconds it is told (no clock in the test)."""
    out = io.StringIO()
    lines = WaitLines(out, tty=False)
    for elapsed in (0.0, 1.0, 3.0, 9.9, 10.0, 14.0, 19.9, 20.5, 21.0):
        lines.update("x@1 on R", elapsed, 600)
    lines.done("x@1 on R", 21.2, found=False)
    assert out.getvalue().splitlines() == ["waiting for x@1 on R (0 s of 600 s)", "waiting for x@1 on R (10 s of 600 s)",
                                           "waiting for x@1 on R (20 s of 600 s)", "waited 21 s for x@1 on R: gave up"]


def test_no_wait_no_line_and_a_stream_is_a_tty_only_if_it_says_so(registry: _Registry, tmp_path: Path) -> None:
    registry.published.set()
    out = io.StringIO()
    lines = WaitLines(out)
    assert lines.tty is False  # StringIO.isatty() is False: plain lines
    _fetch(registry, tmp_path, lines)
    assert out.getvalue() == "" and registry.misses == 0


def test_a_wait_that_ends_unfound_says_it_gave_up(registry: _Registry, tmp_path: Path) -> None:
    out = io.StringIO()
    with pytest.raises(CheckFailed, match=r"was not published on http://127\.0\.0\.1:[0-9]+/ within 0\.3 s"):
        _fetch(registry, tmp_path, WaitLines(out, tty=False, every=0), wait=0.3)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"waiting for {PACKAGE}@{VERSION} on {registry.url} (0 s of 0.3 s)")
    assert re.fullmatch(rf"waited [0-9]+ s for {re.escape(PACKAGE)}@1\.0\.1 on {re.escape(registry.url)}: gave up", lines[-1])
    assert not (tmp_path / "dl").exists() or not any((tmp_path / "dl").iterdir())


def test_a_new_what_is_said_at_once_in_a_log() -> None:
    """A workflow run's status changing is news: said at once, not after the next 10 s."""
    out = io.StringIO()
    lines = WaitLines(out, tty=False)
    for elapsed, what in ((0.0, "run 1 (queued)"), (5.0, "run 1 (queued)"), (6.0, "run 1 (in_progress)"),
                          (11.0, "run 1 (in_progress)"), (16.0, "run 1 (in_progress)")):
        lines.update(what, elapsed, 60)
    lines.done("run 1 (completed)", 17.0, found=True)
    lines.done("run 1 (completed)", 17.0, found=True)  # closed once
    assert out.getvalue().splitlines() == ["waiting for run 1 (queued) (0 s of 60 s)",
                                           "waiting for run 1 (in_progress) (6 s of 60 s)",
                                           "waiting for run 1 (in_progress) (16 s of 60 s)",
                                           "waited 17 s for run 1 (completed): done"]


def test_escaped_what_cannot_move_the_cursor() -> None:
    out = io.StringIO()
    lines = WaitLines(out, tty=False)
    lines.update("x\x1b[2J\r", 0, 1)
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue() and "x\\x1b[2J\\x0d (0 s" in out.getvalue()


# --- release --local's stages: the reporter comes from the running stage ------------------------------


def test_a_stage_on_a_log_writes_plain_lines(registry: _Registry, tmp_path: Path) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with StageClock(console) as clock, clock.stage("build", "Building runner and api images"):
        plain = current_reporter()
        assert isinstance(plain, WaitLines) and plain.tty is False
        # fetch_release is given no reporter: the stage's is used. Published after two updates (~10 s apart
        # in a log, so "every" is shortened here to see more than the first line).
        plain.every = 0
        with reporting(_PublishAfter(plain, registry, 2)):
            _fetch(registry, tmp_path)
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text
    lines = [line for line in text.splitlines() if "bs-wait" in line]
    assert len(lines) >= 3 and WAITING.fullmatch(lines[0]) and FOUND.fullmatch(lines[-1]), lines
    assert current_reporter() is None  # the stage's reporter ends with the stage


def test_a_stage_on_a_terminal_says_it_on_its_own_line(registry: _Registry, tmp_path: Path) -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=300)
    seen: list[str] = []
    with StageClock(console) as clock:
        assert clock._progress is not None
        progress = clock._progress

        def probe() -> None:  # at each 404 after the first: the stage's line names the wait, then publish
            description = progress.tasks[0].description
            if "waiting for" in description:
                seen.append(description)
                registry.published.set()

        registry.on_miss = probe
        with clock.stage("build", "Building runner and api images"):
            _fetch(registry, tmp_path)  # no reporter given: the stage's
        final = progress.tasks[0].description
    assert seen and re.fullmatch(r"Building runner and api images \[dim\]\(" + WAITING.pattern + r"\)\[/dim\]",
                                 seen[0]), seen
    assert final == "Building runner and api images [dim]done[/dim]"  # the wait's text is gone once found


# --- the CLI: benchseal build says it on stderr ---------------------------------------------------------


def test_benchseal_build_says_what_it_waits_for_on_stderr(registry: _Registry, tmp_path: Path) -> None:
    """A forgotten npm publish (issue 38): the build names the package, the registry it was given and the
    seconds, then gives up in one line (exit 1) before anything is built. stderr is a pipe: plain lines."""
    source = tmp_path / "adopter"
    source.mkdir()
    (source / "benchseal.toml").write_text(
        'schema = "benchseal.project/v1"\n\n[agent]\nname = "tern"\nkind = "npm"\n'
        f'package = "{PACKAGE}"\nbin = "cli.js"\nargs = ["{{instruction}}"]\npublish_wait_seconds = 1\n')
    git = ["git", "-C", str(source), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for args in (["init", "-q"], ["add", "benchseal.toml"], ["commit", "-q", "-m", "adopter"], ["tag", "v1.0.1"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("GITHUB_", "SOURCE_DATE"))}
    env["BENCHSEAL_NPM_REGISTRY"] = registry.url
    proc = subprocess.run([sys.executable, "-m", "pipeline", "build", "--project", str(source / "benchseal.toml"),
                           "--release-tag", "v1.0.1", "--image", "runner", "--registry", "127.0.0.1:9"],
                          env=env, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert re.fullmatch(rf"waiting for {re.escape(PACKAGE)}@1\.0\.1 on {re.escape(registry.url)} \([0-9]+ s of 1 s\)",
                        lines[0]), lines
    assert re.fullmatch(rf"waited [0-9]+ s for {re.escape(PACKAGE)}@1\.0\.1 on {re.escape(registry.url)}: gave up",
                        lines[1]), lines
    assert "was not published on" in lines[2] and len(lines) == 3, lines
    assert all(line.isprintable() for line in lines) and registry.misses >= 2
