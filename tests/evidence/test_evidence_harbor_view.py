"""Issue 37.5: Harbor's own viewer opens a published release's trials. A consumer downloads
``evidence-logs.tar.gz`` and ``evidence-SHA256SUMS`` (and ``SHA256SUMS``, which signs the archive), checks
them with ``sha256sum -c``, extracts the archive and runs ``harbor view --jobs evidence`` (docs/evidence.md,
"The trials in Harbor's viewer"). The test does exactly that with the venv's Harbor 0.26 on a sealed release
(tests.fixtures.sigstore.signed_release: Harbor result.json files made from a real one), starts the viewer on
127.0.0.1, reads its JSON API (no browser) and stops it by pid: every planned trial is listed under the job
``harbor`` with its task and the reward its result.json gives, and each trial's detail is served.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.layout import CHECKSUMS, EVIDENCE_ARCHIVE, NESTED_SUMS

pytestmark = pytest.mark.slow

HARBOR = Path(sys.executable).with_name("harbor")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy


def _get(port: int, path: str) -> Any:
    with _LOOPBACK.open(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def downloaded(signed_release: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three assets a consumer downloads, checked and extracted as docs/evidence.md says."""
    here = tmp_path_factory.mktemp("harbor-view")
    for name in (CHECKSUMS, EVIDENCE_ARCHIVE, NESTED_SUMS):
        shutil.copyfile(signed_release / name, here / name)
    for argv in (["sha256sum", "--ignore-missing", "-c", CHECKSUMS], ["tar", "-xzf", EVIDENCE_ARCHIVE],
                 ["sha256sum", "--strict", "-c", NESTED_SUMS]):
        done = subprocess.run(argv, cwd=here, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return here


@pytest.fixture(scope="module")
def viewer(downloaded: Path) -> Iterator[int]:
    """``harbor view --jobs evidence`` on a free loopback port, answering; stopped by its pid."""
    port = _free_port()
    env = {**os.environ, "HARBOR_TELEMETRY": "0", "NO_PROXY": "127.0.0.1,localhost"}
    process = subprocess.Popen([str(HARBOR), "view", "evidence", "--jobs", "--host", "127.0.0.1", "--port", str(port),
                                "--no-build"], cwd=downloaded, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # until its health endpoint answers (or it exits, or a minute passes)
            if process.poll() is not None:
                output = process.stdout.read().decode(errors="replace") if process.stdout else ""
                pytest.fail(f"harbor view exited {process.returncode}: {output[-2000:]}")
            try:
                if _get(port, "/api/health") == {"status": "ok"}:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "harbor view did not answer within 60 s"
            time.sleep(0.2)
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # its own session: the server and nothing else
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=20)
        if process.stdout:
            process.stdout.close()


def test_the_published_trials_open_in_harbor_view(downloaded: Path, viewer: int) -> None:
    plan = json.loads((downloaded / "evidence" / "trials.json").read_text())["trials"]
    assert len(plan) == 2
    jobs = {job["name"] for job in _get(viewer, "/api/jobs")["items"]}
    assert "harbor" in jobs  # evidence/harbor: every trial directory, as one Harbor job
    listed = {t["name"]: t for t in _get(viewer, "/api/jobs/harbor/trials?page_size=100")["items"]}
    assert set(listed) == {p["trial_name"] for p in plan}
    for entry in plan:
        result = json.loads((downloaded / "evidence" / "harbor" / entry["trial_name"] / "result.json").read_text())
        trial = listed[entry["trial_name"]]
        assert trial["reward"] == result["verifier_result"]["rewards"]["reward"]
        assert trial["task_name"] == result["task_name"] and trial["started_at"] is not None
        detail = _get(viewer, f"/api/jobs/harbor/trials/{entry['trial_name']}")
        assert detail["trial_name"] == entry["trial_name"] and detail["id"] == result["id"]
    assert {t["reward"] for t in listed.values()} == {1.0, 0.0}  # the resolved and the unresolved trial
