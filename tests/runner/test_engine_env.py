"""benchseal's Harbor environment (pipeline.runner.engine_env) against the real sandbox engine, through the
engine proxy exactly as the runner reaches it (the proxy's socket is its Docker socket): start, exec, the
archive transfers, stop, and what must never change (network none, SIGKILL, no value in any argv or inspect,
the agent's read-only bind, nothing refused by the proxy, nothing left after the teardowns)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from pipeline.infra.sandbox import engine as sandbox
from pipeline.infra.sandbox.engine_proxy import LABEL, EnginePolicy, EngineProxy
from pipeline.runner import engine_env, envshared
from pipeline.runner.trial import COMPOSE_IMPORT_PATH, ENGINE_IMPORT_PATH, environment_import_path
from pipeline.runner.tunings import DISABLE_ENV
from tests.fixtures.infra import base_in_sandbox as copy_base
from tests.fixtures.infra import proc_hits, sandbox_engine

pytestmark = [pytest.mark.docker]

CANARY = "canary-" + os.urandom(8).hex()


@pytest.fixture(scope="module")
def base_in_sandbox(base_refs: Any) -> str:
    """The base image (bash, coreutils) in the sandbox engine, by id."""
    return copy_base(sandbox_engine(), base_refs)


@pytest.fixture
def proxied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineProxy]:
    """An engine proxy in front of the sandbox engine, as the worker serves it to a runner (binds under tmp_path)."""
    box = sandbox.default_sandbox()
    sandbox.start(box)
    sock_dir = tmp_path / "engine"
    sock_dir.mkdir()
    proxy = EngineProxy(sock_dir / "docker.sock", EnginePolicy(bind_roots=(tmp_path,)),
                        upstream=str(box.socket)).start()
    monkeypatch.setenv(engine_env.ENGINE_ENV, f"unix://{sock_dir / 'docker.sock'}")
    monkeypatch.setattr(engine_env, "_client", None)
    monkeypatch.setattr(envshared, "_agent_mount", None)
    try:
        yield proxy
    finally:
        proxy.stop()
        engine_env._client = None


def _environment(tmp_path: Path, image: str, name: str, **config: Any) -> engine_env.EngineEnvironment:
    env_dir = tmp_path / "task" / "environment"
    env_dir.mkdir(parents=True, exist_ok=True)
    trial_dir = tmp_path / "trial"
    paths = TrialPaths(trial_dir)
    paths.mkdir()
    return engine_env.EngineEnvironment(
        environment_dir=env_dir, environment_name="probe", session_id=f"{name}__{os.urandom(3).hex()}__env",
        trial_paths=paths, task_env_config=EnvironmentConfig(docker_image=image, **config),
        persistent_env={"TASK_SETTING": "from-task"},
        # What Trial passes (never bound: auto_mounting stays off): the dirs start() creates.
        auto_mounts=[{"type": "bind", "source": str(trial_dir / name), "target": f"/logs/{name}"}
                     for name in ("agent", "verifier", "artifacts")])


def _containers(project: str) -> list[Any]:
    return list(sandbox_engine().containers.list(all=True, filters={"label": f"com.docker.compose.project={project}"}))


def _count_execs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | int | None]]:
    """Every exec an engine environment makes from now on, as (its session, the user it runs as), in order."""
    execs: list[tuple[str, str | int | None]] = []
    exec_ = engine_env.EngineEnvironment._exec

    async def counted(self: engine_env.EngineEnvironment, argv: list[str], **kwargs: Any) -> Any:
        execs.append((self.session_id, kwargs.get("user")))
        return await exec_(self, argv, **kwargs)

    monkeypatch.setattr(engine_env.EngineEnvironment, "_exec", counted)
    return execs


def test_a_create_answer_without_an_id_is_named_not_a_key_error() -> None:
    ident = "a" * 64
    assert envshared.created_id({"Id": ident, "Warnings": []}, "container") == ident
    for answer in ({"ID": ident}, {"Id": "a" * 12}, {"Id": ident.upper()}, {"Id": None}, [ident], "ok", None):
        with pytest.raises(envshared.EngineAnswerError, match="the engine's answer to the container create has no id"):
            envshared.created_id(answer, "container")
    with pytest.raises(envshared.EngineAnswerError, match=r"'ApiVersion': '1\.41'"):
        envshared.created_id({"ApiVersion": "1.41"}, "container")


def test_start_exec_transfer_and_stop(tmp_path: Path, proxied: EngineProxy, base_in_sandbox: str) -> None:
    env = _environment(tmp_path, base_in_sandbox, "lifecycle", cpus=1, memory_mb=512)
    project = env._project
    host = tmp_path / "host"
    (host / "src" / "sub").mkdir(parents=True)
    (host / "src" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (host / "src" / "run.sh").chmod(0o755)
    (host / "src" / "sub" / "data.txt").write_text("data\n")
    (host / "file.txt").write_text("one file\n")

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        await env.start(force_build=False)
        [container] = _containers(project)
        # Harbor's log dirs (ensure_dirs at start): 0777, parents 0755.
        seen["dirs"] = await env.exec("stat -c '%a %u %n' /logs /logs/agent /logs/verifier /logs/artifacts")
        seen["attrs"] = container.attrs
        # A secret value travels in the exec's request body only.
        result = await env.exec('echo "$SECRET $TASK_SETTING"; echo err >&2; exit 3', env={"SECRET": CANARY})
        seen["exec"] = result
        seen["argv_hits"] = proc_hits([CANARY.encode()], parts=("cmdline",))
        seen["inspect_hits"] = CANARY in json.dumps(sandbox_engine().api.inspect_container(container.id))
        seen["cwd_user"] = await env.exec("pwd; id -u", cwd="/tmp", user="nobody")
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="timed out"):
            await env.exec("sleep 30", timeout_sec=1)
        seen["timeout_seconds"] = time.monotonic() - started
        # Uploads: into a missing dir (created), into an existing one (kept), a file into a missing parent.
        await env.upload_dir(host / "src", "/opt/up")
        await env.upload_dir(host / "src", "/tmp")
        await env.upload_file(host / "file.txt", "/deep/er/file.txt")
        seen["uploaded"] = await env.exec("/opt/up/run.sh; cat /opt/up/sub/data.txt /deep/er/file.txt; "
                                          "stat -c '%a %u' /tmp /opt/up/run.sh; ls /tmp/sub")
        seen["kinds"] = [await env.is_dir("/opt/up"), await env.is_file("/opt/up"), await env.is_file("/deep/er/file.txt"),
                         await env.is_dir("/missing")]
        # Downloads: a tree (a link leaving it is skipped) and a file.
        await env.exec("mkdir -p /out/d && echo x > /out/d/x && ln -s /etc/passwd /out/evil && ln -s d/x /out/ok")
        await env.download_dir("/out", host / "down")
        await env.download_file("/deep/er/file.txt", host / "got.txt")
        await env.stop(delete=True)
        await envshared.drain_teardowns()
        return seen

    seen = asyncio.run(scenario())
    config, hostconfig = seen["attrs"]["Config"], seen["attrs"]["HostConfig"]
    assert hostconfig["NetworkMode"] == "none"
    assert config["StopSignal"] == "SIGKILL"
    assert hostconfig["NanoCpus"] == 1_000_000_000 and hostconfig["Memory"] == 512 * 1024 * 1024
    assert config["Labels"][LABEL] == proxied.policy.token
    assert not [e for e in config["Env"] or [] if "TASK_SETTING" in e or "SECRET" in e]
    assert seen["dirs"].stdout.splitlines() == ["755 0 /logs", "777 0 /logs/agent", "777 0 /logs/verifier",
                                                "777 0 /logs/artifacts"]
    result = seen["exec"]
    assert (result.return_code, result.stdout, result.stderr) == (3, f"{CANARY} from-task\n", "err\n")
    assert seen["argv_hits"] == [] and seen["inspect_hits"] is False
    assert seen["cwd_user"].stdout == "/tmp\n65534\n"
    assert seen["timeout_seconds"] < 5
    assert seen["uploaded"].stdout.splitlines() == ["ran", "data", "one file", "1777 0", "755 0", "data.txt"]
    assert seen["kinds"] == [True, False, True, False]
    assert (host / "down" / "d" / "x").read_text() == "x\n"
    assert (host / "down" / "ok").is_symlink() and not (host / "down" / "evil").exists()
    assert (host / "got.txt").read_text() == "one file\n"
    assert proxied.refused == []
    assert _containers(project) == []
    timings = [json.loads(line) for line in (tmp_path / "trial" / envshared.TIMINGS_FILE).read_text().splitlines()]
    ops = [t["op"] for t in timings]
    assert ops.count("start") == 1 and ops.count("stop") == 1 and "build" not in ops
    assert all(t["session"] == env.session_id for t in timings)


def test_an_empty_directory_is_uploaded_without_an_archive(tmp_path: Path, proxied: EngineProxy,
                                                           base_in_sandbox: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Harbor re-uploads an agent's empty artifacts dir into every verifier environment: into a directory that is
    there, nothing is sent (an archive upload costs the engine a helper process); a missing one is still created."""
    env = _environment(tmp_path, base_in_sandbox, "emptyup")
    empty = tmp_path / "empty"
    empty.mkdir()
    empty.chmod(0o700)
    puts: list[str] = []
    put = env._put

    def counted(path: str, data: bytes) -> bool:
        puts.append(path)
        return put(path, data)

    monkeypatch.setattr(env, "_put", counted)

    async def scenario() -> Any:
        await env.start(force_build=False)
        try:
            await env.exec("mkdir -p /there && touch /there/kept")
            await env.upload_dir(empty, "/there")
            await env.upload_dir(empty, "/new/deep")
            return await env.exec("ls -A /there; stat -c '%a %u' /new/deep; ls -A /new/deep")
        finally:
            await env.stop(delete=True)
            await envshared.drain_teardowns()

    result = asyncio.run(scenario())
    assert result.stdout.splitlines() == ["kept", "700 0"]
    assert "/there" not in puts and puts[0] == "/new/deep"
    assert proxied.refused == []


def test_the_log_dirs_and_harbors_dir_commands_are_one_exec(tmp_path: Path, proxied: EngineProxy,
                                                            base_in_sandbox: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """start() owes Harbor's log dirs (0777, made as root); Harbor's dir commands issued while they are owed (a
    verifier environment's empty_dirs of /logs/verifier, /logs/artifacts and /app) are deferred and run with them in
    ONE exec, just before the next other operation (three execs fewer a trial); the agent's empty artifacts dir
    uploaded into a dir they make sends nothing. What they do is done: the image's files in an emptied dir are gone,
    the upload lands in the emptied dir. Any other first operation (here an exec as another user) finds the dirs
    made. An agent's environment (``eager_dirs``, set by the runner) whose image has no /logs owes them as archive
    entries for its first upload into / (test_an_agents_log_dirs_ride_with_its_first_upload); its first operation
    here is an exec, which finds them made by an exec just before it."""
    execs = _count_execs(monkeypatch)
    (tmp_path / "v").mkdir()
    (tmp_path / "a").mkdir()
    verifier = _environment(tmp_path / "v", base_in_sandbox, "owedv")
    agent = _environment(tmp_path / "a", base_in_sandbox, "oweda")
    agent.eager_dirs = True
    empty = tmp_path / "empty"
    empty.mkdir()
    app = tmp_path / "app"
    app.mkdir()
    (app / "solution.py").write_text("print(1)\n")
    stat = "stat -c '%a %u %n' /logs/agent /logs/verifier /logs/artifacts"

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        await verifier.start(force_build=False)
        await agent.start(force_build=False)
        try:
            seen["at_start"] = list(execs)
            seen["emptied"] = [await verifier.empty_dirs(["/logs/verifier"]),
                               await verifier.empty_dirs(["/logs/artifacts"])]
            await verifier.upload_dir(empty, "/logs/artifacts")
            seen["emptied"].append(await verifier.empty_dirs(["/etc/skel"]))  # a dir of the image, with files
            seen["deferred"] = [e for e in execs if e[0] == verifier.session_id]
            await verifier.upload_dir(app, "/etc/skel")
            seen["verifier"] = [e for e in execs if e[0] == verifier.session_id]
            seen["agent"] = await agent.exec(stat, user="nobody")
            seen["agent_skel"] = await agent.exec("ls -A /etc/skel")
            seen["verifier_dirs"] = await verifier.exec(stat + " /etc/skel; ls -A /etc/skel /logs/artifacts")
        finally:
            for env in (verifier, agent):
                await env.stop(delete=True)
            await envshared.drain_teardowns()
        return seen

    seen = asyncio.run(scenario())
    dirs = ["777 0 /logs/agent", "777 0 /logs/verifier", "777 0 /logs/artifacts"]
    assert seen["at_start"] == []  # the agent's are owed too (no /logs in the image), and so the verifier's
    assert seen["deferred"] == []  # nothing run yet: three dir commands and an empty upload deferred
    assert seen["verifier"] == [(verifier.session_id, "root")]  # one exec, before the upload that needed them
    assert [r.return_code for r in seen["emptied"]] == [0, 0, 0]
    assert seen["agent"].stdout.splitlines() == dirs
    assert seen["agent_skel"].stdout.strip()  # the image has files there: the emptying below is not vacuous
    assert seen["verifier_dirs"].stdout.splitlines() == [*dirs, "777 0 /etc/skel", "/etc/skel:", "solution.py", "",
                                                         "/logs/artifacts:"]
    assert [user for session, user in execs if session == agent.session_id] == ["root", "nobody", None]
    timings = [json.loads(line) for line in (tmp_path / "v" / "trial" / envshared.TIMINGS_FILE).read_text().splitlines()]
    assert [t["op"] for t in timings if t["session"] == verifier.session_id] == ["start", "exec", "upload", "exec", "stop"]
    assert proxied.refused == []


LOG_DIRS_STAT = "stat -c '%a %u %g %F %n' /logs /logs/agent /logs/verifier /logs/artifacts"


@pytest.mark.slow
def test_an_agents_log_dirs_ride_with_its_first_upload(tmp_path: Path, proxied: EngineProxy, base_in_sandbox: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent's environment (``eager_dirs``) whose image has no /logs: a stat at start, then the log dirs go as
    archive entries with its first upload into / (the oracle's /solution), and no exec makes them. What they make is
    exactly what the exec makes: compared with an environment whose first operation is an exec (the owed dirs made
    by an exec before it), and written out. An image with a /logs of its own (here /logs/agent owned by 65534) gets
    the exec at start, which leaves that owner as it is (an archive entry would make it root's). A dir command of
    Harbor's deferred before the upload, or an upload into /logs itself, settle them with an exec first instead:
    the command still runs before the upload, /logs keeps the mode mkdir gave it."""
    execs = _count_execs(monkeypatch)
    engine = sandbox_engine()
    maker = engine.containers.create(base_in_sandbox, ["sh", "-c", "mkdir -p /logs/agent && chown 65534:65534 /logs/agent"],
                                     network_mode="none")
    try:
        maker.start()
        assert maker.wait()["StatusCode"] == 0
        own = maker.commit()
    finally:
        maker.remove(force=True)
    envs = {}
    for name in ("rode", "execd", "own", "deferred", "intologs"):
        (tmp_path / name).mkdir()
        envs[name] = _environment(tmp_path / name, own.id if name == "own" else base_in_sandbox, name)
        envs[name].eager_dirs = True
    solution = tmp_path / "solution"
    solution.mkdir()
    (solution / "solve.sh").write_text("echo solved\n")
    closed = tmp_path / "closed"  # a source dir whose own mode would show on /logs, were it /logs's entry
    closed.mkdir(mode=0o700)
    (closed / "solve.sh").write_text("echo solved\n")

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        try:
            for name, env in envs.items():
                await env.start(force_build=False)
                seen[f"{name}_at_start"] = [user for session, user in execs if session == env.session_id]
            await envs["rode"].upload_dir(solution, "/solution")
            await envs["own"].upload_dir(solution, "/solution")
            seen["rode_upload"] = [user for session, user in execs if session == envs["rode"].session_id]
            await envs["deferred"].empty_dirs(["/etc/skel"])  # a dir of the image, with files
            await envs["deferred"].upload_dir(solution, "/etc/skel")
            await envs["intologs"].upload_dir(closed, "/logs")
            for name in ("deferred", "intologs"):
                seen[f"{name}_upload"] = [user for session, user in execs if session == envs[name].session_id]
            seen["skel"] = await envs["deferred"].exec("ls -A /etc/skel", user="root")
            seen["logs_file"] = await envs["intologs"].exec("cat /logs/solve.sh", user="root")
            for name, env in envs.items():
                seen[name] = await env.exec(LOG_DIRS_STAT + "; cat /solution/solve.sh", user="root")
        finally:
            for env in envs.values():
                await env.stop(delete=True)
            await envshared.drain_teardowns()
            engine.images.remove(own.id, force=True, noprune=True)  # never its parent, the shared base
        return seen

    seen = asyncio.run(scenario())
    made = ["755 0 0 directory /logs", "777 0 0 directory /logs/agent", "777 0 0 directory /logs/verifier",
            "777 0 0 directory /logs/artifacts"]
    assert seen["rode_at_start"] == seen["execd_at_start"] == [] and seen["rode_upload"] == []
    assert seen["execd"].stdout.splitlines()[:4] == made  # the exec's, made before the first exec
    assert seen["rode"].stdout.splitlines() == [*made, "echo solved"]  # the archive's: the same, and the upload landed
    assert seen["deferred_upload"] == seen["intologs_upload"] == ["root"]  # the exec, before the upload
    assert seen["skel"].stdout.splitlines() == ["solve.sh"]  # emptied, then the upload
    assert seen["deferred"].stdout.splitlines() == made  # (no /solution there)
    assert seen["intologs"].stdout.splitlines() == made and seen["logs_file"].stdout == "echo solved\n"
    assert seen["own_at_start"] == ["root"]
    assert seen["own"].stdout.splitlines() == ["755 0 0 directory /logs", "777 65534 65534 directory /logs/agent",
                                               *made[2:], "echo solved"]
    ops = [json.loads(line)["op"] for line in (tmp_path / "rode" / "trial" / envshared.TIMINGS_FILE).read_text().splitlines()]
    assert ops[:3] == ["stat", "start", "upload"]  # the stat is within start (recorded as it ends)
    assert proxied.refused == []


def test_an_upload_carrying_the_log_dirs_that_fails_is_the_machinerys_failure(tmp_path: Path, proxied: EngineProxy,
                                                                             base_in_sandbox: str) -> None:
    """The upload the log dirs ride with fails (the container gone behind the environment's back): EngineFault, an
    infrastructure error, as the exec's failure in start() would have been, never a trial that goes on."""
    env = _environment(tmp_path, base_in_sandbox, "ridefail")
    env.eager_dirs = True
    solution = tmp_path / "solution"
    solution.mkdir()
    (solution / "solve.sh").write_text("echo solved\n")

    async def scenario() -> None:
        await env.start(force_build=False)
        try:
            assert env._owed_entries is not None  # the ride is what fails below, not an exec
            sandbox_engine().containers.get(env._container).remove(force=True)
            await env.upload_dir(solution, "/solution")
        finally:
            await env.stop(delete=True)
            await envshared.drain_teardowns()

    with pytest.raises(engine_env.EngineFault, match=r"preparing the environment .* uploading /solution with its log"):
        asyncio.run(scenario())


def test_a_deferred_dir_command_that_fails_is_the_machinerys_failure(tmp_path: Path, proxied: EngineProxy,
                                                                     base_in_sandbox: str) -> None:
    """A deferred dir command's status is checked where it runs: the next operation fails with EngineFault (an
    infrastructure error), never goes on as if the directory were emptied (Harbor ignores the status)."""
    verifier = _environment(tmp_path, base_in_sandbox, "owedfail")
    app = tmp_path / "app"
    app.mkdir()
    (app / "solution.py").write_text("print(1)\n")

    async def scenario() -> None:
        await verifier.start(force_build=False)
        try:
            await verifier.empty_dirs(["/sys/kernel"])  # read-only in every container: rm and chmod fail
            await verifier.upload_dir(app, "/app")
        finally:
            await verifier.stop(delete=True)
            await envshared.drain_teardowns()

    with pytest.raises(engine_env.EngineFault, match="directory commands exited"):
        asyncio.run(scenario())
    ops = [json.loads(line)["op"] for line in (tmp_path / "trial" / envshared.TIMINGS_FILE).read_text().splitlines()]
    assert "upload" not in ops


def _tree(root: Path) -> dict[str, Any]:
    """Every entry under ``root``: a link's target, a file's bytes and mode, a directory as such."""
    out: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        key = path.relative_to(root).as_posix()
        out[key] = (("link", os.readlink(path)) if path.is_symlink() else ("dir",) if path.is_dir()
                    else ("file", path.read_bytes(), path.stat().st_mode & 0o777, path.stat().st_nlink))
    return out


def test_downloads_under_the_log_dirs_read_one_snapshot_until_the_container_is_touched(
        tmp_path: Path, proxied: EngineProxy, base_in_sandbox: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the agent phase Harbor copies the agent's log file, /logs/agent and the /logs/artifacts artifact (with an
    is_dir first): one archive of /logs serves them all, each path getting exactly the entries the engine's own
    archive of it holds (checked against those archives, asked again after an exec: anything done in the container
    drops the snapshot, so nothing stale is read). A hard link to outside the path, a link in place of a dir, or a
    snapshot over the download bounds (filled from a dir nobody downloads) send that path to the engine."""
    env = _environment(tmp_path, base_in_sandbox, "snapshot")
    gets: list[str] = []
    get_archive = engine_env.EngineEnvironment._spool

    def counted(self: engine_env.EngineEnvironment, path: str, spool: Any, *limit: int | None) -> None:
        gets.append(path)
        get_archive(self, path, spool, *limit)

    monkeypatch.setattr(engine_env.EngineEnvironment, "_spool", counted)
    fill = ("mkdir -p /logs/agent/sub /logs/artifacts/deep /outside && echo log > /logs/agent/agent.log "
            "&& chmod 640 /logs/agent/agent.log && echo s > /logs/agent/sub/s.txt && ln -s ../agent.log /logs/agent/sub/up "
            "&& ln -s /etc/passwd /logs/agent/evil && echo a > /logs/artifacts/deep/a && ln /logs/agent/agent.log "
            "/logs/agent/hard && ln /logs/agent/sub/s.txt /logs/artifacts/deep/h && echo v > /logs/verifier/v")
    paths = ("agent", "artifacts")

    async def collect(into: Path) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        await env.download_file("/logs/agent/agent.log", into / "file.log")
        for name in paths:
            seen[f"is_dir {name}"] = await env.is_dir(f"/logs/{name}")
            await env.download_dir(f"/logs/{name}", into / name)
        seen["is_file"] = [await env.is_file("/logs/agent/agent.log"), await env.is_dir("/logs/agent/none"),
                           await env.is_file("/logs/agent/evil")]
        return seen

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        await env.start(force_build=False)
        try:
            await env.exec(fill)
            gets.clear()
            seen["snap"] = await collect(tmp_path / "snap")
            seen["snap_gets"] = list(gets)
            await env.exec("echo new > /logs/agent/new.txt")  # drops the snapshot
            gets.clear()
            seen["again"] = await collect(tmp_path / "again")
            seen["again_gets"] = list(gets)
            # What the engine's own archive of each path holds (no snapshot): one GET a path.
            with monkeypatch.context() as patch:
                patch.setattr(env, "_logs_root", lambda: None)
                gets.clear()
                await collect(tmp_path / "engine")
                seen["engine_gets"] = list(gets)
            # A snapshot over the bounds (a dir nobody downloads filled): refused, each path asked of the engine.
            await env.exec("for i in $(seq 1 30); do : > /logs/verifier/f$i; done")
            with monkeypatch.context() as patch:
                patch.setattr(engine_env, "MAX_DOWNLOAD_MEMBERS", 25)
                gets.clear()
                await collect(tmp_path / "bounded")
                seen["bounded_gets"] = list(gets)
            with monkeypatch.context() as patch:
                patch.setattr(engine_env, "SNAPSHOT_MAX_BYTES", 4096)  # /logs is larger: each path on its own
                await env.exec("true")
                gets.clear()
                await collect(tmp_path / "small")
                seen["small_gets"] = list(gets)
            # A directory replaced by a link: the snapshot cannot say what the engine's archive of it would be.
            await env.exec("rm -rf /logs/artifacts && ln -s /outside /logs/artifacts && echo o > /outside/o")
            gets.clear()
            await env.download_dir("/logs/agent", tmp_path / "linked" / "agent")
            seen["linked_is_dir"] = await env.is_dir("/logs/artifacts")
            seen["linked_gets"] = list(gets)
        finally:
            await env.stop(delete=True)
            await envshared.drain_teardowns()
        return seen

    seen = asyncio.run(scenario())
    assert seen["snap"] == {"is_dir agent": True, "is_dir artifacts": True, "is_file": [True, False, True]}  # evil: `test -f` follows it
    assert len({(tmp_path / side / "file.log").read_bytes() for side in ("snap", "engine", "bounded", "small")}) == 1
    for name in paths:
        engine, bounded, small = ({k: v for k, v in _tree(tmp_path / side / name).items() if k != "new.txt"}
                                  for side in ("engine", "bounded", "small"))
        assert _tree(tmp_path / "snap" / name) == engine == bounded == small, name
    assert "new.txt" in _tree(tmp_path / "again" / "agent")  # read after the exec: not the stale snapshot
    assert (tmp_path / "snap" / "file.log").read_bytes() == b"log\n"
    agent = _tree(tmp_path / "snap" / "agent")
    assert agent["agent.log"][1:3] == (b"log\n", 0o640) and agent["sub/up"] == ("link", "../agent.log")
    assert "evil" not in agent and "v" not in agent  # a link leaving the dir skipped; nothing of another dir
    assert _tree(tmp_path / "snap" / "artifacts")["deep/h"][1] == b"s\n"  # a hard link to /logs/agent: its bytes
    # The hard link to outside /logs/artifacts: that one path asked of the engine, as without a snapshot.
    assert seen["snap_gets"] == ["/logs", "/logs/artifacts"] and seen["again_gets"] == ["/logs", "/logs/artifacts"]
    assert seen["engine_gets"] == ["/logs/agent/agent.log", "/logs/agent", "/logs/artifacts"]
    assert seen["bounded_gets"] == ["/logs", "/logs/agent/agent.log", "/logs/agent", "/logs/artifacts"]
    assert seen["small_gets"] == seen["bounded_gets"]
    assert seen["linked_gets"] == ["/logs"] and seen["linked_is_dir"] is True  # the link followed, as the shell does
    assert _tree(tmp_path / "linked" / "agent")["agent.log"][1] == b"log\n"
    assert proxied.refused == []


def test_agent_files_are_bound_read_only(tmp_path: Path, proxied: EngineProxy, base_in_sandbox: str) -> None:
    agent = tmp_path / "agent-copy"
    agent.mkdir()
    (agent / "agent.txt").write_text("agent\n")
    sandbox.grant(agent)
    envshared.set_agent_mount(agent, "/opt/benchseal/agent")
    env = _environment(tmp_path, base_in_sandbox, "agentmount")

    async def scenario() -> Any:
        await env.start(force_build=False)
        try:
            return await env.exec("cat /opt/benchseal/agent/agent.txt; touch /opt/benchseal/agent/x; echo $?")
        finally:
            await env.stop(delete=True)
            await envshared.drain_teardowns()

    result = asyncio.run(scenario())
    assert result.stdout.splitlines() == ["agent", "1"]
    assert "Read-only file system" in (result.stderr or "")
    assert proxied.refused == []
    assert _containers(env._project) == []


def test_an_absent_image_is_never_pulled(tmp_path: Path, proxied: EngineProxy) -> None:
    env = _environment(tmp_path, "sha256:" + "0" * 64, "absent")

    async def scenario() -> None:
        try:
            await env.start(force_build=False)
        finally:
            await env.stop(delete=True)
            await envshared.drain_teardowns()

    # The machinery's failure before any agent code ran: EngineFault (an infrastructure error to the grader).
    with pytest.raises(engine_env.EngineFault, match="ImageNotFound") as caught:
        asyncio.run(scenario())
    assert isinstance(caught.value.__cause__, docker.errors.ImageNotFound)
    assert not [r for r in proxied.refused if "pull" in r]


def test_the_compose_environment_is_the_benchmarks_choice_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DISABLE_ENV, raising=False)
    assert environment_import_path() == ENGINE_IMPORT_PATH == "pipeline.runner.engine_env:EngineEnvironment"
    monkeypatch.setenv(DISABLE_ENV, "engine-api")
    assert environment_import_path() == COMPOSE_IMPORT_PATH


def test_what_leaves_a_container_is_bounded(tmp_path: Path, proxied: EngineProxy, base_in_sandbox: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35.5: an agent's /app too large for the run's evidence (sparse files count in full), or too many
    files, is never copied out (nothing extracted: the trial fails as the agent's, the run is still sealed); an
    exec printing more than the bound keeps the bound and says the rest was dropped."""
    monkeypatch.setattr(engine_env, "MAX_DOWNLOAD_BYTES", 1 << 20)
    monkeypatch.setattr(engine_env, "MAX_DOWNLOAD_MEMBERS", 50)
    monkeypatch.setattr(engine_env, "MAX_EXEC_OUTPUT", 1 << 20)
    env = _environment(tmp_path, base_in_sandbox, "bounds")

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        await env.start(force_build=False)
        try:
            await env.exec("mkdir -p /big /many /small && truncate -s 3M /big/sparse.bin && echo ok > /small/a "
                           "&& for i in $(seq 1 60); do : > /many/f$i; done")
            for name in ("big", "many"):
                with pytest.raises(engine_env.DownloadTooLarge):
                    await env.download_dir(f"/{name}", tmp_path / "down" / name)
            await env.download_dir("/small", tmp_path / "down" / "small")
            seen["loud"] = await env.exec("head -c 3000000 /dev/zero | tr '\\0' x")
        finally:
            await env.stop(delete=True)
            await envshared.drain_teardowns()
        return seen

    seen = asyncio.run(scenario())
    assert list((tmp_path / "down" / "big").iterdir()) == [] and list((tmp_path / "down" / "many").iterdir()) == []
    assert (tmp_path / "down" / "small" / "a").read_text() == "ok\n"
    out = seen["loud"].stdout
    assert out.startswith("x" * (1 << 20)) and out.endswith(f"[... {3_000_000 - (1 << 20)} more bytes of output dropped ...]\n")


def test_a_task_environment_without_an_image_is_built_through_the_proxy_without_a_network(
        tmp_path: Path, proxied: EngineProxy, base_in_sandbox: str) -> None:
    """A task Harbor gets unpinned (no worker prebuilt it: ``trial run`` on its own) is built through the proxy from
    its environment/Dockerfile, with no network in its RUN steps, and the trial's container runs on that image."""
    env_dir = tmp_path / "task" / "environment"
    env_dir.mkdir(parents=True)
    (env_dir / "Dockerfile").write_text(
        f"FROM {base_in_sandbox}\nRUN (cat /sys/class/net/*/operstate 2>/dev/null; ls /sys/class/net) > /net.txt\n")
    env = _environment(tmp_path, None, "built")  # type: ignore[arg-type]  # no docker_image: Harbor builds

    async def scenario() -> str:
        try:
            await env.start(force_build=False)
            result = await env.exec("cat /net.txt")
            return str(result.stdout)
        finally:
            await env.stop(delete=True)
            await envshared.drain_teardowns()

    seen = asyncio.run(scenario())
    assert seen.split() == ["unknown", "lo"], seen  # only the loopback device during the build
    assert not proxied.refused, proxied.refused
