"""A Python release agent's own container (pipeline.runner.agent_box, pipeline.runner.agent_host).

* the probe program (what ``agent_check`` asks before any trial), run as the box runs it: a
  separate interpreter, never the runner's;
* the channel's frames: bounded, JSON objects only;
* the agent's logs copied back into the trial: regular files only, no link followed, bounded;
* in a real container of the runner image through the engine proxy (the sandbox engine): the probe
  answers, and the suites the runner image carries are hidden from a box.
The whole path with real hostile agents: tests/e2e/test_e2e_hostile_agents.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from pipeline.imaging.images import APP_DIRS, APP_ROOT
from pipeline.infra.sandbox import engine as sandbox
from pipeline.infra.sandbox.engine_proxy import LABEL, EnginePolicy, EngineProxy
from pipeline.infra.worker.images import sandbox_image
from pipeline.runner import agent_box, agent_host, engine_env
from tests.fixtures.infra import sandbox_engine


def _probe(package: str, import_path: str) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-m", "pipeline.runner.agent_host", "probe", package, import_path],
                          capture_output=True, text=True, check=True, timeout=60)
    answer: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    return answer


def test_the_probe_reports_the_distribution_or_why_not() -> None:
    from importlib.metadata import version

    assert _probe("pydantic", "pydantic:BaseModel") == {"version": version("pydantic")}
    assert _probe("no-such-distribution", "x:y") == {"missing": "no-such-distribution"}
    assert _probe("pydantic", "pydantic:NoSuchAgent")["import_error"].startswith("AttributeError")
    assert _probe("pydantic", "no_such_module:Agent")["import_error"].startswith("ModuleNotFoundError")


def test_the_runner_image_carries_no_suites_and_a_box_hides_where_older_ones_did() -> None:
    assert "suites" not in APP_DIRS and agent_box.IMAGE_SUITES == f"{APP_ROOT}/suites"


def _frames(data: bytes) -> list[Any]:
    async def read() -> list[Any]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        out = []
        while (frame := await agent_host.read_frame(reader)) is not None:
            out.append(frame)
        return out

    return asyncio.run(read())


def test_frames_are_bounded_json_objects() -> None:
    assert _frames(agent_host.encode_frame({"kind": "done"}) * 2) == [{"kind": "done"}] * 2
    with pytest.raises(agent_host.ChannelError, match="at most"):
        _frames(struct.pack(">I", agent_host.MAX_FRAME_BYTES + 1))
    with pytest.raises(agent_host.ChannelError, match="not a JSON object"):
        _frames(struct.pack(">I", 2) + b"[]")
    with pytest.raises(agent_host.ChannelError, match="inside a frame"):
        _frames(struct.pack(">I", 10) + b"{}")
    with pytest.raises(ValueError, match="at most"):
        agent_host.unb64(agent_host.b64(b"x" * (agent_host.MAX_TRANSFER_BYTES + 1)))


def test_the_agents_logs_come_back_as_regular_files_only(tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    (trial / "agent").mkdir(parents=True)
    box = agent_box._Box(trial / "agent", "t__agent", "image")
    logs = box.dir / agent_host.LOGS_NAME
    (logs / "sub").mkdir(parents=True)
    (logs / "log.txt").write_text("agent log\n")
    (logs / "sub" / "deep.txt").write_text("deep\n")
    secret = tmp_path / "runner-secret"
    secret.write_text("not the agent's\n")
    (logs / "link.txt").symlink_to(secret)  # what the agent's box could plant
    (logs / "linkdir").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(logs / "fifo")
    box._copy_logs()
    copied = sorted(p.relative_to(trial / "agent").as_posix() for p in (trial / "agent").rglob("*"))
    assert copied == ["log.txt", "sub", "sub/deep.txt"]
    assert (trial / "agent" / "log.txt").read_text() == "agent log\n"


# --- in a real container of the runner image, through the engine proxy -------------------------------


@pytest.fixture(scope="module")
def runner_image(local_images: dict[str, Any]) -> str:
    """The runner image (no agent baked) in the sandbox engine, by id (before any proxy is the Docker host)."""
    return sandbox_image(docker.from_env(), sandbox_engine(), local_images["runner"])


@pytest.fixture
def proxied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineProxy]:
    box = sandbox.default_sandbox()
    sandbox.start(box)
    sock_dir = tmp_path / "engine"
    sock_dir.mkdir()
    proxy = EngineProxy(sock_dir / "docker.sock", EnginePolicy(bind_roots=(tmp_path,)), upstream=str(box.socket)).start()
    monkeypatch.setenv(engine_env.ENGINE_ENV, f"unix://{sock_dir / 'docker.sock'}")
    monkeypatch.setattr(engine_env, "_client", None)
    try:
        yield proxy
    finally:
        proxy.stop()
        engine_env._client = None


@pytest.mark.docker
def test_the_probe_runs_in_a_container_of_the_runner_image(runner_image: str, proxied: EngineProxy) -> None:
    image = runner_image
    assert agent_box.probe_in_box(image, "harbor", "harbor.agents.base:BaseAgent") == {"version": "0.26.0"}
    assert agent_box.probe_in_box(image, "no-such-agent", "x:y") == {"missing": "no-such-agent"}
    assert agent_box.probe_in_box(image, "harbor", "no_such:Agent")["import_error"].startswith("ModuleNotFoundError")
    # This test's probes only: the proxy labels what it creates with its token (other workers' probes share the engine).
    left = sandbox_engine().containers.list(all=True, filters={"label": [
        f"com.docker.compose.service={agent_box.PROBE_SERVICE}", f"{LABEL}={proxied.policy.token}"]})
    assert left == [], "every probe container is removed"


@pytest.mark.docker
def test_a_box_sees_no_suite_no_capability_and_cannot_write_its_root(runner_image: str, proxied: EngineProxy) -> None:
    image = runner_image
    api = engine_env.engine()
    script = (f"ls -A {agent_box.IMAGE_SUITES} | wc -l; ls /opt/benchseal; grep CapEff /proc/self/status; "
              "touch /opt/benchseal/x 2>/dev/null && echo root-writable; echo tmp > /tmp/t && cat /tmp/t; "
              "ls /var/run/docker.sock 2>&1 | grep -c 'No such file'")
    created = api.create_container(image, entrypoint=["sh", "-c"], command=[script],
                                   host_config=agent_box.box_host_config(api))
    try:
        api.start(created["Id"])
        assert api.wait(created["Id"], timeout=60)["StatusCode"] == 0
        lines = api.logs(created["Id"]).decode().split()
    finally:
        api.remove_container(created["Id"], force=True)
    # The image carries no suites (issue 36); where older images had them a box sees an empty mount.
    assert lines[0] == "0" and {"pipeline", "policies"} <= set(lines)
    assert "CapEff:" in lines and lines[lines.index("CapEff:") + 1] == "0000000000000000"
    assert "root-writable" not in lines and lines[-2:] == ["tmp", "1"]
