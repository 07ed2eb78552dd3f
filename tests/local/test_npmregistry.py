"""The local npm registry (a real verdaccio on 127.0.0.1): config, publish, storage, background start/stop, CLI."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli.local import local_app
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.local import npmregistry
from pipeline.local.npmregistry import LocalNpmRegistry, npm_pack, read_state, start_background, stop_background


def _package(root: Path, name: str, version: str) -> Path:
    source = root / f"src-{name.replace('/', '+')}-{version}"
    source.mkdir(parents=True)
    (source / "package.json").write_text(json.dumps({"name": name, "version": version, "license": "MIT"}))
    (source / "index.js").write_text("module.exports = 42\n")
    return source


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNpmRegistry]:
    with LocalNpmRegistry(tmp_path_factory.mktemp("verdaccio")) as started:  # fails loudly if it cannot start
        yield started


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"


def test_config_is_loopback_only_with_no_uplink(registry: LocalNpmRegistry) -> None:
    config = json.loads((registry.state_dir / npmregistry.CONFIG_FILE).read_text())
    assert config == registry.config(registry.port)
    assert config["listen"] == [f"127.0.0.1:{registry.port}"] and registry.url == f"http://127.0.0.1:{registry.port}/"
    assert config["uplinks"] == {} and all("proxy" not in rule for rule in config["packages"].values())
    for key in ("storage",):
        assert Path(config[key]).is_relative_to(registry.state_dir)
    assert Path(config["log"]["path"]).is_relative_to(registry.state_dir)
    assert "middlewares" not in config and config["web"] == {"enable": False}
    # A package it was not given is a 404: never looked for elsewhere.
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(registry.url + "left-pad", timeout=10)
    assert caught.value.code == 404


def test_publish_reports_the_integrity_and_stores_the_tarball(registry: LocalNpmRegistry, tmp_path: Path) -> None:
    tarball, packed = npm_pack(_package(tmp_path, "@bs-local/thing", "0.1.0"), tmp_path / "out")
    assert tarball == tmp_path / "out" / "bs-local-thing-0.1.0.tgz"
    assert packed == "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    assert registry.publish(tarball) == packed
    assert registry.storage_tarball("@bs-local/thing", "0.1.0").read_bytes() == tarball.read_bytes()
    stored = json.loads(registry.storage_packument("@bs-local/thing").read_text())
    assert stored["versions"]["0.1.0"]["dist"]["integrity"] == packed
    dist = registry.packument("@bs-local/thing")["versions"]["0.1.0"]["dist"]
    assert dist["tarball"].startswith(registry.url) and dist["integrity"] == packed

    # A version is published once.
    with pytest.raises(CheckFailed, match=r"^npm publish @bs-local/thing@0\.1\.0 exited 1: ") as caught:
        registry.publish(tarball)
    assert "\n" not in str(caught.value)
    with pytest.raises(ValidationError, match="tarball"):
        registry.publish(tmp_path / "src-@bs-local+thing-0.1.0" / "index.js")


def test_background_instance_is_recorded_and_stopped_by_pid(tmp_path: Path) -> None:
    state_dir = tmp_path / "bg"
    state = start_background(state_dir)
    try:
        assert read_state(state_dir) == state and set(state) == {"pid", "port", "url"}
        assert state["url"] == f"http://127.0.0.1:{state['port']}/" and _alive(state["pid"])
        assert start_background(state_dir) == state  # already running: the same instance
        tarball, packed = npm_pack(_package(tmp_path, "bs-local-bg", "1.0.0"), tmp_path / "out")
        assert npmregistry.publish_to(state["url"], tarball) == packed
    finally:
        assert stop_background(state_dir) == state["pid"]
    assert not _alive(state["pid"]) and read_state(state_dir) is None
    assert stop_background(state_dir) is None


def test_stop_background_signals_only_its_own_process(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "30"])  # a pid recorded by mistake, or reused since
    try:
        (tmp_path / npmregistry.STATE_FILE).write_text(json.dumps({"pid": stranger.pid, "port": 1, "url": "x"}))
        assert stop_background(tmp_path) == stranger.pid
        assert stranger.poll() is None and not (tmp_path / npmregistry.STATE_FILE).exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_a_taken_port_fails_loudly(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        registry = LocalNpmRegistry(tmp_path, port=taken.getsockname()[1])
        with pytest.raises(InfrastructureError, match="did not start"):
            registry.start()
    with pytest.raises(ValidationError):
        LocalNpmRegistry(tmp_path, port=70000)


def test_cli_start_publish_stop(tmp_path: Path) -> None:
    state_dir = tmp_path / "cli"
    runner = CliRunner()
    tarball, packed = npm_pack(_package(tmp_path, "bs-local-cli", "3.0.0"), tmp_path / "out")
    published = runner.invoke(local_app, ["npm-registry", "publish", str(tarball), "--state-dir", str(state_dir)])
    assert isinstance(published.exception, CheckFailed)  # none running yet
    started = runner.invoke(local_app, ["npm-registry", "start", "--state-dir", str(state_dir)])
    state = read_state(state_dir)
    assert state is not None
    try:
        assert started.exit_code == 0, started.output
        assert started.output == f"npm registry pid {state['pid']} at {state['url']}\n"
        published = runner.invoke(local_app, ["npm-registry", "publish", str(tarball), "--state-dir", str(state_dir)])
        assert published.exit_code == 0, published.output
        assert published.output == packed + "\n"
    finally:
        stopped = runner.invoke(local_app, ["npm-registry", "stop", "--state-dir", str(state_dir)])
    assert stopped.output == f"stopped npm registry pid {state['pid']}\n" and not _alive(state["pid"])
