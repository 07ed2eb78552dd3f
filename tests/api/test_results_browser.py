"""The results page in a real browser: Debian's headless ``chromium`` loads it from the real
``benchseal api serve`` (uvicorn on 127.0.0.1) over a queue holding a repository's history of three
scored releases (the third gated, a task name and a gate reason that are markup if not escaped); the
test reads the DOM the browser built, takes a screenshot, and finds no error the browser reports
for the page. First it proves the error capture catches what it must, on a page with deliberate
errors served by a throwaway server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from pipeline.core.paths import REPO_ROOT
from pipeline.infra.queue.sql import SqliteQueue
from tests.api import chromium
from tests.api.dom import Element, parse
from tests.api.history import (
    AMP_TASK,
    CANARY,
    CRASH_REASON,
    HOSTILE_TASK,
    RELEASES,
    REPOSITORY,
    SCRIPT_REASON,
    seed,
    seed_outcomes,
)
from tests.registry.helpers import free_port, serve_http, wait_listening

pytestmark = pytest.mark.skipif(chromium.CHROMIUM is None, reason="chromium is not installed (make setup installs it)")


class _Deliberate(BaseHTTPRequestHandler):
    """A page with one of each error: console.error, an uncaught exception, a CSP violation, a 404."""

    PAGE = (b"<!DOCTYPE html><html><head><title>errors</title><script src=\"/missing.js\"></script></head>"
            b"<body><p>deliberate errors</p><img src=\"/pixel.png\">"
            b"<script>console.error('deliberate console error'); notDefinedAnywhere();</script></body></html>")

    def do_GET(self) -> None:
        if self.path == "/":
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Security-Policy", "default-src 'none'; script-src 'self' 'unsafe-inline'")
            self.send_header("Content-Length", str(len(self.PAGE)))
            self.end_headers()
            self.wfile.write(self.PAGE)
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_error_capture_catches_console_errors_exceptions_csp_and_failed_loads(tmp_path: Path) -> None:
    with serve_http(_Deliberate) as address:
        errors = chromium.page_errors(f"http://{address}/", tmp_path / "profile")
    text = "\n".join(errors)
    assert "console.error: deliberate console error" in text, errors
    assert "uncaught: ReferenceError: notDefinedAnywhere is not defined" in text, errors
    assert "violates the following Content Security Policy directive" in text and "pixel.png" in text, errors
    assert "404" in text and "missing.js" in text, errors


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    root = tmp_path_factory.mktemp("results-browser")
    db = root / "infra" / "queue.sqlite3"
    with SqliteQueue(db) as queue:
        seeded = seed(queue)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "api", "serve", "--port", str(port), "--queue-db", str(db)],
                            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, "api serve", alive=lambda: proc.poll() is None)
        yield f"http://127.0.0.1:{port}", seeded.run_ids
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _page_dom(served: tuple[str, dict[str, str]], tmp_path: Path) -> Element:
    base, _ = served
    return parse(chromium.dump_dom(f"{base}/repos/acme/widget", tmp_path / "profile"))


def test_the_browser_builds_the_chart_one_point_per_release_with_intervals(served: tuple[str, dict[str, str]],
                                                                           tmp_path: Path) -> None:
    dom = _page_dom(served, tmp_path)
    svg = dom.find("svg", "chart")
    releases = svg.find_all("g", "release")
    assert [g.attrs["data-tag"] for g in releases] == list(RELEASES), "one group per release, oldest first"
    assert [g.attrs["data-run"] for g in releases] == list(served[1].values())
    points = svg.find_all(cls="point")
    assert len(points) == len(RELEASES) == 3
    assert [p.tag for p in points] == ["circle", "circle", "path"]
    assert [g.attrs["data-tag"] for g in releases if "gated" in g.classes] == ["v1.2.0"]
    assert "gated" in points[2].classes and all("gated" not in p.classes for p in points[:2])
    for group in releases:
        assert len(group.find_all("line", "interval")) == 3, "the interval: a bar and its two caps"
        assert "95 % interval" in group.find("title").text
    # Scores read off the chart: y of a point is higher (smaller) for a higher score.
    ys = [float(p.attrs["cy"]) for p in points[:2]]
    assert ys[1] < ys[0], "v1.1.0 (1.0) is drawn above v1.0.0 (0.667)"


def test_the_browser_shows_the_matrix_releases_and_escaped_text(served: tuple[str, dict[str, str]],
                                                               tmp_path: Path) -> None:
    dom = _page_dom(served, tmp_path)
    matrix = dom.find("table", "matrix")
    rows = matrix.find("tbody").find_all("tr")
    newest = RELEASES["v1.2.0"]
    assert sorted(r.attrs["data-task"] for r in rows) == sorted(set(newest) | set(RELEASES["v1.1.0"]))
    by_task = {r.attrs["data-task"]: [c.text for c in r.find_all("td")] for r in rows}
    assert by_task[HOSTILE_TASK] == [HOSTILE_TASK, "1 / 1 resolved", "0 / 1 resolved", "regressed"]
    assert by_task["hello"][3] == "unchanged"
    assert by_task[AMP_TASK] == [AMP_TASK, "not run", "0 / 1 resolved", "added"]
    # The hostile task name is text everywhere: the browser made no <img>, ran no handler.
    assert dom.find_all("img") == [] and dom.find_all("script") == []
    assert all("onerror" not in e.attrs for e in dom.iter())
    table = dom.find("table", "releases")
    tags = [r.attrs["data-tag"] for r in table.find("tbody").find_all("tr")]
    assert tags == ["v1.2.0", "v1.1.0", "v1.0.0"], "newest first"
    gated = table.find("tr", "gated")
    reasons = [li.text for li in gated.find_all("li")]
    assert reasons[1] == f"resolved in v1.1.0, failing now: {HOSTILE_TASK}"
    assert "lies below v1.1.0's score 1" in reasons[0]
    links = [a.attrs["href"] for a in table.find_all("a", "evidence")]
    assert links == [f"https://github.com/{REPOSITORY}/releases/tag/{tag}" for tag in tags]
    runs = served[1]
    assert [a.attrs["href"] for a in table.find_all("a", "drill")] == [
        f"/repos/{REPOSITORY}/runs/{runs[tag]}" for tag in tags]


def test_the_page_renders_and_the_browser_reports_no_error(served: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    base, _ = served
    assert chromium.page_errors(f"{base}/repos/acme/widget", tmp_path / "profile-results") == []
    assert chromium.page_errors(f"{base}/", tmp_path / "profile-index") == []
    # The 404 page: nothing but the document's own 404 status.
    errors = chromium.page_errors(f"{base}/repos/acme/unknown", tmp_path / "profile-404")
    assert all("404" in e for e in errors), errors
    shot = tmp_path / "page.png"
    chromium.screenshot(f"{base}/repos/acme/widget", shot, tmp_path / "profile-shot")
    width, height, variety = chromium.png_facts(shot)
    assert (width, height) == (1200, 900) and shot.stat().st_size > 20_000
    assert variety > 50, "the screenshot is (nearly) one colour: nothing rendered"
    print(f"screenshot: {shot}")


def test_one_browser_session_reads_every_run_drills_into_one_and_compares_two(tmp_path: Path) -> None:
    """A history with a FAILED run (the tamper canary passed, a trial reason holding <script>), a gated one,
    an INFRA_ERROR one and two runs of one tag, served by the real ``api serve`` with its verify pins; one
    chromium loads the page, follows the failed run's link, goes back and submits the comparison form.
    No page reports an error (a form the CSP refused would); each step's screenshot is kept and printed."""
    db = tmp_path / "infra" / "queue.sqlite3"
    with SqliteQueue(db) as queue:
        run_ids = seed(queue).run_ids
        outcomes = seed_outcomes(queue)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "api", "serve", "--port", str(port), "--queue-db", str(db),
                             "--infra-repo", "acme/bench-infra", "--builder", "benchseal/benchseal@refs/tags/v1.0.0"],
                            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shots: list[Path] = []
    try:
        wait_listening(port, "api serve", alive=lambda: proc.poll() is None)
        base = f"http://127.0.0.1:{port}"
        with chromium.Session(tmp_path / "profile") as browser:
            assert browser.navigate(f"{base}/repos/acme/widget") == []
            dom = parse(browser.dom())
            rows = {r.attrs["data-run"]: r for r in dom.find("table", "releases").find("tbody").find_all("tr")}
            verdicts = {run: row.attrs["data-verdict"] for run, row in rows.items()}
            assert verdicts[outcomes.failed] == "failed" and verdicts[outcomes.crashed] == "infra-error"
            assert verdicts[run_ids["v1.2.0"]] == "gated" and len(rows) == 6
            assert rows[outcomes.failed].attrs["data-reason"].startswith("tampered: ")
            assert rows[outcomes.crashed].attrs["data-reason"] == "infrastructure: " + CRASH_REASON
            assert [rows[r].find("a", "drill").text for r in (run_ids["v1.1.0"], outcomes.rerun)] == ["v1.1.0 #1",
                                                                                                     "v1.1.0 #2"]
            labels = [t.text for t in dom.find("svg", "chart").find_all("text", "tag")]
            assert labels == ["v1.0.0", "v1.1.0 #1", "v1.2.0", "v1.1.0 #2"]
            assert dom.find("pre", "verify").text == ("benchseal verify acme/widget@v1.4.0 --infra-repo acme/bench-infra "
                                                      "--builder benchseal/benchseal@refs/tags/v1.0.0")
            assert dom.find_all("script") == [] and dom.find_all("img") == [] and dom.find_all("b") == []
            shots.append(browser.screenshot(tmp_path / "results.png"))

            # Drill into the failed run by its link.
            assert browser.click(f"a.drill[href$='/runs/{outcomes.failed}']") == []
            assert browser.url() == f"{base}/repos/acme/widget/runs/{outcomes.failed}"
            dom = parse(browser.dom())
            trials = {r.attrs["data-task"]: r for r in dom.find("table", "trials").find("tbody").find_all("tr")}
            assert trials["fail-me"].find("td", "reason").text == SCRIPT_REASON
            assert "canary" in trials[CANARY].classes and "not counted" in trials[CANARY].text
            assert dom.find_all("script") == [], "the reason's <script> is text in the browser's DOM too"
            assert browser.evaluate("document.querySelectorAll('script').length") == 0
            shots.append(browser.screenshot(tmp_path / "run.png"))

            # Back, pick the two runs of v1.1.0 and submit the form (a GET back to this server: CSP form-action).
            assert browser.navigate(f"{base}/repos/acme/widget") == []
            browser.evaluate(f"document.querySelector('form.compare select[name=a]').value = {run_ids['v1.1.0']!r}; "
                             f"document.querySelector('form.compare select[name=b]').value = {outcomes.rerun!r}; true")
            assert browser.click("form.compare button[type=submit]") == []
            assert browser.url() == f"{base}/repos/acme/widget?a={run_ids['v1.1.0']}&b={outcomes.rerun}"
            dom = parse(browser.dom())
            section = dom.find("section", "compare")
            assert section.find("h2").text == "v1.1.0 #1 against v1.1.0 #2"
            shots.append(browser.screenshot(tmp_path / "compare.png"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    for shot in shots:
        width, height, variety = chromium.png_facts(shot)
        assert width == 1200 and height >= 900 and variety > 50, (shot, width, height, variety)
        print(f"screenshot: {shot}")
