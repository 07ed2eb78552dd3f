"""A real browser for page tests: Debian's ``chromium``, headless, no driver.

* ``dump_dom`` and ``screenshot``: chromium's own ``--dump-dom`` / ``--screenshot`` (the DOM after the
  page loaded, as the browser built it; a PNG of the rendered page).
* ``page_errors``: the page loaded over the DevTools protocol on ``--remote-debugging-pipe`` (file
  descriptors 3 and 4, NUL-separated JSON), collecting everything the browser reports as an error
  for it: uncaught exceptions (``Runtime.exceptionThrown``), ``console.error``/``console.assert``
  calls (``Runtime.consoleAPICalled``) and the browser's own error entries (``Log.entryAdded``:
  Content-Security-Policy violations, failed subresource loads).

Every run gets its own ``--user-data-dir`` and the flags that keep chromium off the (closed) network.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-default-apps", "--no-default-browser-check"]


def _argv(profile: Path, *extra: str) -> list[str]:
    assert CHROMIUM is not None
    profile.mkdir(parents=True, exist_ok=True)
    return [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra]


def dump_dom(url: str, profile: Path) -> str:
    done = subprocess.run(_argv(profile, "--dump-dom", url), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip(), f"chromium --dump-dom failed: {done.stderr[-2000:]}"
    return done.stdout


def screenshot(url: str, target: Path, profile: Path, size: tuple[int, int] = (1200, 900)) -> None:
    done = subprocess.run(_argv(profile, f"--screenshot={target}", f"--window-size={size[0]},{size[1]}",
                                "--hide-scrollbars", url), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and target.is_file(), f"chromium --screenshot failed: {done.stderr[-2000:]}"


def png_facts(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values of the decoded scanlines) of a PNG: a blank page has few."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    idat, offset = b"", 8
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        if kind == b"IDAT":
            idat += data[offset + 8:offset + 8 + length]
        offset += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


class _Pipe:
    """The DevTools protocol over chromium's pipe: requests by id, events collected as they come."""

    def __init__(self, proc: subprocess.Popen[bytes], to_browser: int, from_browser: int) -> None:
        self.proc, self.to_browser, self.from_browser = proc, to_browser, from_browser
        self.events: list[dict[str, Any]] = []
        self._buffer = b""
        self._next = 0

    def _read_one(self, deadline: float) -> dict[str, Any] | None:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.from_browser], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.from_browser, 1 << 16)
            assert chunk, "chromium closed the DevTools pipe"
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        parsed: dict[str, Any] = json.loads(message)
        return parsed

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 60) -> dict[str, Any]:
        self._next += 1
        request: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session is not None:
            request["sessionId"] = session
        os.write(self.to_browser, json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            message = self._read_one(deadline)
            assert message is not None, f"no answer to {method} in {timeout} s"
            if message.get("id") == self._next:
                assert "error" not in message, f"{method}: {message['error']}"
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            message = self._read_one(deadline)
            assert message is not None, f"no {method} in {timeout} s"
            self.events.append(message)

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (message := self._read_one(deadline)) is not None:
            self.events.append(message)


def _describe(event: dict[str, Any]) -> str | None:
    """One line for an event that reports an error of the page, else None."""
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        text = details.get("exception", {}).get("description") or details.get("text", "")
        return f"uncaught: {text}"
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
        return f"console.{params['type']}: {args}"
    if method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
        entry = params["entry"]
        return f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".rstrip()
    return None


def _devtools_pipes() -> tuple[int, int, int, int, Callable[[], None]]:
    """The DevTools pipe pair and the child's pre-exec step that puts them where chromium reads them: its
    commands on fd 3, its answers on fd 4."""
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()

    def fds() -> None:
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]  # never 3 or 4 itself
        os.dup2(high[0], 3)
        os.dup2(high[1], 4)

    return to_browser_r, to_browser_w, from_browser_r, from_browser_w, fds


class Session:
    """One headless chromium for a whole test, driven over the DevTools pipe: navigate, click a link, read
    the DOM the browser built, take screenshots, and collect each page's errors (as ``page_errors``)."""

    def __init__(self, profile: Path, size: tuple[int, int] = (1200, 900)) -> None:
        to_browser_r, to_browser_w, from_browser_r, from_browser_w, fds = _devtools_pipes()

        self.proc = subprocess.Popen(_argv(profile, "--remote-debugging-pipe", "--hide-scrollbars", "about:blank"),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=fds, pass_fds=(3, 4))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.pipe = _Pipe(self.proc, to_browser_w, from_browser_r)
        self._fds = (to_browser_w, from_browser_r)
        try:
            target = self.pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                self.pipe.call(f"{domain}.enable", session=self.session)
            self.pipe.call("Emulation.setDeviceMetricsOverride", {"width": size[0], "height": size[1],
                                                                  "deviceScaleFactor": 1, "mobile": False},
                           session=self.session)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _errors(self) -> list[str]:
        return [line for event in self.pipe.events if event.get("sessionId") == self.session
                for line in [_describe(event)] if line is not None]

    def _loaded(self, settle: float) -> list[str]:
        self.pipe.wait_for("Page.loadEventFired")
        self.pipe.drain(settle)
        return self._errors()

    def navigate(self, url: str, settle: float = 0.5) -> list[str]:
        """Load ``url``; the errors the browser reported for it."""
        self.pipe.events.clear()
        self.pipe.call("Page.navigate", {"url": url}, session=self.session)
        return self._loaded(settle)

    def evaluate(self, expression: str) -> Any:
        result = self.pipe.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                session=self.session)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def click(self, selector: str, settle: float = 0.5) -> list[str]:
        """Click the element ``selector`` names (a link or a submit button) as a user would, and wait for the
        page it leads to; the errors the browser reported for that page."""
        self.pipe.events.clear()
        found = self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
                              "if (!e) return false; e.click(); return true; })()")
        assert found, f"nothing matches {selector!r} on {self.url()}"
        return self._loaded(settle)

    def url(self) -> str:
        return str(self.evaluate("location.href"))

    def dom(self) -> str:
        return str(self.evaluate("document.documentElement.outerHTML"))

    def screenshot(self, target: Path, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        data = self.pipe.call("Page.captureScreenshot", params, session=self.session)["data"]
        target.write_bytes(base64.b64decode(data))
        return target

    def close(self) -> None:
        try:
            self.pipe.call("Browser.close", timeout=10)
        except (AssertionError, OSError):
            pass
        for fd in self._fds if hasattr(self, "_fds") else ():
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own chromium, by its Popen handle
            self.proc.wait(timeout=20)


def page_errors(url: str, profile: Path, settle: float = 1.0) -> list[str]:
    """Every error the browser reports while it loads ``url`` (and ``settle`` seconds after the load event)."""
    to_browser_r, to_browser_w, from_browser_r, from_browser_w, fds = _devtools_pipes()

    proc = subprocess.Popen(_argv(profile, "--remote-debugging-pipe", "about:blank"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=fds, pass_fds=(3, 4))
    os.close(to_browser_r)
    os.close(from_browser_w)
    pipe = _Pipe(proc, to_browser_w, from_browser_r)
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            pipe.call(f"{domain}.enable", session=session)
        pipe.events.clear()  # what about:blank said is not the page's
        pipe.call("Page.navigate", {"url": url}, session=session)
        pipe.wait_for("Page.loadEventFired")
        pipe.drain(settle)
        found = [line for event in pipe.events if event.get("sessionId") == session
                 for line in [_describe(event)] if line is not None]
        try:
            pipe.call("Browser.close", timeout=10)
        except (AssertionError, OSError):
            pass
        return found
    finally:
        os.close(to_browser_w)
        os.close(from_browser_r)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()  # our own chromium, by its Popen handle
            proc.wait(timeout=20)
