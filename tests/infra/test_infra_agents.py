"""A model-backed agent (Harbor's terminus-2) through the real worker, runner image and Harbor.

The scripted model server replays a trajectory; terminus-2 really runs its loop
(model calls over the worker's relay socket, commands in the task container
through tmux, the verifier grades). A canary key is planted and searched for in
every argv, every container the run creates (docker inspect, while in flight),
every file of the run dir and artifacts, the queue DB and the model server log.
The key is the worker's relay's alone: the runner gets no secret file of it and no
argument naming it, its agents hold a placeholder, and the model server (which
refuses any other key) still answers every call.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from pipeline.core.contracts import DigestsFile, trial_short_id
from pipeline.core.errors import UsageError, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.evidence.artifacts import build_summary
from pipeline.infra.intake.accept import accept_payload
from pipeline.infra.intake.policy import load_policy
from pipeline.infra.queue.sql import SqliteQueue
from pipeline.infra.sandbox.agents import LOCK_MARKER, MODEL_MOUNT, SECRETS_MOUNT, prepare_runner_agent
from pipeline.infra.worker.loop import LABEL_RUN, WorkerConfig, run_once
from pipeline.local.model_server import ModelServer
from pipeline.publish.body import facts_from_summary, markdown_cell, render_section
from tests.fixtures.infra import built_images_source, host_pid, sandbox_engine, wait_for
from tests.registry.helpers import free_port

CANARY = "bs-model-canary-" + hashlib.sha256(f"agents-{os.getpid()}".encode()).hexdigest()[:24]
KEY_ENV = "BENCHSEAL_AGENT_API_KEY"
# A secret that is not the model key: still delivered to the runner as a 0400 file.
EXTRA_ENV = "BENCHSEAL_EXTRA_SECRET"
EXTRA_CANARY = "bs-extra-canary-" + hashlib.sha256(f"extra-{os.getpid()}".encode()).hexdigest()[:24]


def _policy_data(port: int = 18431) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data["suites"] = {"smoke": data["suites"]["smoke"]}  # the tests' suites roots hold smoke only
    data["suites"]["smoke"]["model"]["endpoint"] = f"http://127.0.0.1:{port}/v1"
    return data


def _write_policy(tmp: Path, data: dict[str, Any]) -> Path:
    path = tmp / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --- policy: agents by name and version, model per suite (no Docker) -------------------

@pytest.mark.parametrize(("case", "mutate", "needle"), [
    ("unknown bare agent", lambda d: d["agents"].append("terminus-2x"), "bare names are for Harbor's test agents"),
    ("agent without version", lambda d: d["agents"].append({"name": "qwen-code", "model": True}), "version"),
    ("agent listed twice", lambda d: d["agents"].append({"name": "terminus-2", "version": "0.26.0"}), "listed once"),
    ("test agent listed twice", lambda d: d["agents"].append("oracle"), "listed once"),
    ("key not a secret", lambda d: d.update(secret_env=[]), "must be listed in secret_env"),
    ("endpoint not http", lambda d: d["suites"]["smoke"]["model"].update(endpoint="file:///etc/passwd"), "endpoint"),
    ("endpoint port out of range", lambda d: d["suites"]["smoke"]["model"].update(endpoint="http://127.0.0.1:70000/v1"),
     "endpoint"),
    ("endpoint port zero", lambda d: d["suites"]["smoke"]["model"].update(endpoint="http://127.0.0.1:0/v1"), "endpoint"),
    ("endpoint with a query", lambda d: d["suites"]["smoke"]["model"].update(endpoint="https://h/v1?x=1"), "endpoint"),
    ("endpoint host not plain", lambda d: d["suites"]["smoke"]["model"].update(endpoint="https://h_x/v1"), "endpoint"),
    ("endpoint with credentials", lambda d: d["suites"]["smoke"]["model"].update(endpoint="http://u:p@h:1/v1"), "endpoint"),
    ("unknown model key", lambda d: d["suites"]["smoke"]["model"].update(api_key="x"), "api_key"),
    ("bad version", lambda d: d["agents"][2].update(version="latest; rm"), "version"),
])
def test_agent_policy_is_strictly_validated(tmp_path: Path, case: str, mutate: Any, needle: str) -> None:
    data = _policy_data()
    load_policy(_write_policy(tmp_path, data))
    mutate(data)
    with pytest.raises(ValidationError) as info:
        load_policy(_write_policy(tmp_path, data))
    assert needle in info.value.diagnostics(), (case, info.value.diagnostics())


@pytest.mark.parametrize(("endpoint", "expected"), [
    ("https://api.openai.com/v1", ("api.openai.com", 443, True, "/v1")),
    ("http://127.0.0.1/v1", ("127.0.0.1", 80, False, "/v1")),
    ("http://127.0.0.1:18431/v1/", ("127.0.0.1", 18431, False, "/v1")),
])
def test_a_model_endpoint_is_taken_as_its_provider_writes_it(tmp_path: Path, endpoint: str,
                                                            expected: tuple[str, int, bool, str]) -> None:
    """The port is implied by the scheme (issue 38: https://api.openai.com/v1 was refused with a regex)."""
    data = _policy_data()
    data["suites"]["smoke"]["model"]["endpoint"] = endpoint
    model = load_policy(_write_policy(tmp_path, data)).suites["smoke"].model
    assert model is not None and (*model.host_port, model.path) == expected


def test_a_bad_model_endpoint_is_one_line_naming_the_rule_not_a_pattern(tmp_path: Path) -> None:
    data = _policy_data()
    data["suites"]["smoke"]["model"]["endpoint"] = "ftp://api.openai.com/v1"
    with pytest.raises(ValidationError) as info:
        load_policy(_write_policy(tmp_path, data))
    said = info.value.diagnostics()
    assert len(said.splitlines()) == 1 and "suites.smoke.model.endpoint" in said, said
    assert "http(s)://HOST[:PORT][/PATH]" in said and "^https" not in said and "pattern" not in said, said


def test_accept_admits_model_agents_only_for_suites_with_a_model(tmp_path: Path, make_payload: Any) -> None:
    data = _policy_data()
    data["suites"]["nomodel"] = {"timeout_seconds": 60, "dataset": data["suites"]["smoke"]["dataset"]}
    policy = load_policy(_write_policy(tmp_path, data))
    accept_payload(make_payload(agent="terminus-2"), db=tmp_path / "q.sqlite3", policy=policy)
    with pytest.raises(ValidationError) as info:
        accept_payload(make_payload(agent="terminus-2", suite="nomodel", correlation_id="corr-nomodel-0001"),
                       db=tmp_path / "q.sqlite3", policy=policy)
    assert info.value.field == "payload.agent" and "configures none" in info.value.rule
    with pytest.raises(ValidationError) as info:
        accept_payload(make_payload(agent="claude-code", correlation_id="corr-unknown-0001"),
                       db=tmp_path / "q.sqlite3", policy=policy)
    assert "not allowed by policy" in info.value.rule and "terminus-2" in info.value.rule


def test_runner_gets_secret_files_and_names_never_values(tmp_path: Path, make_payload: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Secrets other than the model key reach the runner as 0400 files; the model key never does: the
    relay holds it, and the runner's argv names neither the key's variable nor its value."""
    from pipeline.core.contracts import DispatchPayload

    data = _policy_data()
    data["secret_env"] = [KEY_ENV, EXTRA_ENV]
    policy = load_policy(_write_policy(tmp_path, data))
    payload = DispatchPayload.model_validate(make_payload(agent="terminus-2"))
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv(EXTRA_ENV, EXTRA_CANARY)
    with pytest.raises(UsageError, match=KEY_ENV):
        prepare_runner_agent(policy, payload)
    monkeypatch.setenv(KEY_ENV, "")  # set but empty is no key either
    with pytest.raises(UsageError, match=KEY_ENV):
        prepare_runner_agent(policy, payload)
    monkeypatch.setenv(KEY_ENV, CANARY)
    setup = prepare_runner_agent(policy, payload)
    try:
        assert CANARY not in json.dumps(setup.args) and CANARY not in json.dumps(setup.volumes)
        assert EXTRA_CANARY not in json.dumps(setup.args) and EXTRA_CANARY not in json.dumps(setup.volumes)
        # Neither the key's value nor its variable's name reaches the runner's argv (no --model-key-env).
        assert KEY_ENV not in json.dumps(setup.args) and not any("key-env" in a for a in setup.args), setup.args
        assert setup.args[:2] == ["--agent-version", "0.26.0"]
        assert setup.args[setup.args.index("--secret-env") + 1] == EXTRA_ENV and setup.args.count("--secret-env") == 1
        secrets = next(Path(src) for src, m in setup.volumes.items() if m["bind"] == SECRETS_MOUNT)
        assert setup.volumes[str(secrets)]["mode"] == "ro"
        assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
        # The secret dir holds the other secret only: never the model key, under any name.
        assert sorted(p.name for p in secrets.iterdir() if p.name != LOCK_MARKER) == [EXTRA_ENV]
        assert stat.S_IMODE((secrets / EXTRA_ENV).stat().st_mode) == 0o400
        assert (secrets / EXTRA_ENV).read_text() == EXTRA_CANARY
        # The model key lives in the host-side relay alone.
        assert setup.relay is not None and setup.relay.api_key == CANARY
        mounted = [Path(src) for src in setup.volumes]
        assert not any(CANARY.encode() in p.read_bytes() for d in mounted if d.is_dir()
                       for p in d.rglob("*") if p.is_file())
        dirs = list(setup.dirs)
    finally:
        setup.close()
    assert not any(d.exists() for d in dirs)
    # With the model key as the only secret, the runner gets no secret dir at all.
    policy = load_policy(_write_policy(tmp_path, _policy_data()))
    setup = prepare_runner_agent(policy, payload)
    try:
        assert SECRETS_MOUNT not in [m["bind"] for m in setup.volumes.values()]
        assert "--secret-env" not in setup.args and "--secret-dir" not in setup.args
        assert KEY_ENV not in json.dumps(setup.args) and CANARY not in json.dumps(setup.args)
        assert setup.relay is not None and setup.relay.api_key == CANARY
    finally:
        setup.close()
    # A test agent gets no model relay and no version pin.
    setup = prepare_runner_agent(policy, DispatchPayload.model_validate(make_payload(agent="oracle")))
    try:
        assert setup.relay is None and "--agent-version" not in setup.args and "--model-socket" not in setup.args
    finally:
        setup.close()


def test_runner_refuses_an_agent_version_its_harbor_does_not_ship(tmp_path: Path) -> None:
    pytest.importorskip("harbor")
    from pipeline.runner.trial import run_suite

    with pytest.raises(ValidationError) as info:
        run_suite(REPO_ROOT / "suites" / "smoke", tmp_path, run_id="r", agent="terminus-2", agent_version="0.25.9")
    assert info.value.field == "--agent-version" and "0.26.0" in info.value.rule
    assert not (tmp_path / "trials.json").exists()


# --- the real thing: worker + runner + Harbor + terminus-2 + scripted model ------------

class Scanner(threading.Thread):
    """While the run is in flight, over and over: every /proc/*/cmdline; docker inspect (Env, Labels,
    everything) of every container on the engine, and of EVERY container created meanwhile, inspected
    the moment its create event arrives (with the event's own attributes); the logs of the
    containers created meanwhile; every file under ``roots`` (run dir, Harbor trial configs, logs,
    artifacts, the queue database and its WAL); the runner container's /tmp (Harbor's compose env
    files) through /proc/<pid>/root."""

    def __init__(self, needle: str, roots: list[Path]) -> None:
        super().__init__(daemon=True)
        self.needle = needle.encode()
        self.roots = roots
        self.stop = threading.Event()
        self.argv_hits: list[str] = []
        self.inspect_hits: list[str] = []
        self.file_hits: set[str] = set()
        self.log_hits: set[str] = set()
        self.containers: dict[str, str] = {}  # name -> image, every container seen
        self.runner_starts: dict[str, dict[str, list[str]]] = {}  # runner name -> argv, env, mount points
        self.created: dict[str, str] = {}  # id -> name, from create events while in flight
        self.created_runs: dict[str, str] = {}  # id -> the run label its create event carried ("" if none)
        self.inspected: set[str] = set()  # ids inspected at least once
        self.files_seen: set[str] = set()
        self.runner_tmp_files: set[str] = set()
        self.runner_tmp_scans = 0
        self.scans = 0
        self._client = sandbox_engine()
        self._events = self._client.events(decode=True, filters={"type": "container", "event": "create"})
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    def _check_container(self, client: Any, ident: str) -> None:
        try:
            info = client.api.inspect_container(ident)
        except docker.errors.APIError:
            return  # removed meanwhile
        self.inspected.add(info["Id"])
        self.containers[info["Name"]] = info["Config"]["Image"]
        if info["Name"].startswith("/benchseal-infra-"):  # the runner: what it was started with
            self.runner_starts[info["Name"]] = {
                "argv": [*(info["Config"].get("Entrypoint") or []), *(info["Config"].get("Cmd") or [])],
                "env": list(info["Config"].get("Env") or []),
                "mounts": sorted(m.get("Destination", "") for m in info.get("Mounts") or []),
                "sources": sorted(m.get("Source", "") for m in info.get("Mounts") or []),
                "run": [(info["Config"].get("Labels") or {}).get(LABEL_RUN, "")]}
        if self.needle in json.dumps(info).encode():
            self.inspect_hits.append(info["Name"])

    def _watch(self) -> None:
        client = sandbox_engine()
        try:
            for event in self._events:
                ident = event.get("id") or event.get("Actor", {}).get("ID")
                attributes = event.get("Actor", {}).get("Attributes", {})
                self.created[ident] = attributes.get("name", "")
                self.created_runs[ident] = attributes.get(LABEL_RUN, "")
                if self.needle in json.dumps(event).encode():  # labels, name, image of the create
                    self.inspect_hits.append(f"event {self.created[ident]}")
                self._check_container(client, ident)
        except Exception:  # the stream is closed by stop_all()
            pass

    def stop_all(self) -> None:
        self.stop.set()
        self.join()
        self._events.close()
        self._watcher.join(timeout=10)

    def _scan_files(self, paths: list[Path], into: set[str]) -> None:
        for path in paths:
            try:
                if path.is_symlink() or not path.is_file() or path.stat().st_size > 20_000_000:
                    continue
                into.add(str(path))
                if self.needle in path.read_bytes():
                    self.file_hits.add(str(path))
            except OSError:
                continue

    def run(self) -> None:
        self._watcher.start()
        client = self._client
        while not self.stop.is_set():
            for entry in os.scandir("/proc"):
                if entry.name.isdigit():
                    try:
                        cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
                    except OSError:
                        continue
                    if self.needle in cmdline:
                        self.argv_hits.append(cmdline.replace(b"\0", b" ")[:3000].decode(errors="replace"))
            try:
                for container in client.api.containers(all=True):
                    self._check_container(client, container["Id"])
            except docker.errors.APIError:
                pass
            for ident, name in list(self.created.items()):
                try:
                    if self.needle in client.api.logs(ident, stdout=True, stderr=True):
                        self.log_hits.add(name)
                    if name.startswith("benchseal-infra-"):
                        pid = host_pid(client.api.inspect_container(ident)["State"]["Pid"])
                        tmp = Path(f"/proc/{pid}/root/tmp")
                        if pid and tmp.is_dir():
                            self._scan_files(list(tmp.rglob("*")), self.runner_tmp_files)
                            self.runner_tmp_scans += 1
                except (docker.errors.APIError, OSError):
                    continue
            self._scan_files([p for root in self.roots if root.exists() for p in root.rglob("*")], self.files_seen)
            self.scans += 1


@pytest.fixture(scope="module")
def agent_setup(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile,
                sign_release_images: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("infra-agents")
    runner, api = built_images.images["runner"], built_images.images["api"]
    trust = sign_release_images("acme/benchseal", "v9.9.9", [runner.ref, api.ref])
    data = _policy_data()
    data["sources"] = [built_images_source("acme/benchseal", built_images)]
    data["suites"]["smoke"]["timeout_seconds"] = 400
    suites = root / "suites"
    shutil.copytree(REPO_ROOT / "suites" / "smoke", suites / "smoke")
    return {"root": root, "data": data, "suites": suites, "runner": runner.ref, "api": api.ref, "trust": trust}


# Run ids derive from correlation ids: unique per session on a shared Docker Engine.
SESSION = uuid.uuid4().hex[:8]


def _run(setup: dict[str, Any], mode: str, correlation: str) -> dict[str, Any]:
    root: Path = setup["root"] / mode
    root.mkdir()
    log = root / "model-requests.jsonl"
    with ModelServer(key=CANARY, mode=mode, log_path=log) as server:  # type: ignore[arg-type]
        data = json.loads(json.dumps(setup["data"]))
        data["suites"]["smoke"]["model"]["endpoint"] = server.base_url
        policy = load_policy(_write_policy(root, data))
        db = root / "queue.sqlite3"
        payload = {"schema": "benchseal.dispatch/v1", "correlation_id": f"{correlation}-{SESSION}",
                   "source": {"repository": "acme/benchseal", "commit": "0123456789abcdef0123456789abcdef01234567",
                              "tag": "v9.9.9"},
                   "runner": setup["runner"], "api": setup["api"], "suite": "smoke", "agent": "terminus-2"}
        accepted = accept_payload(payload, db=db, policy=policy)
        def private_dirs() -> set[Path]:
            tmp = Path(tempfile.gettempdir())
            return set(tmp.glob("benchseal-secrets-*")) | set(tmp.glob("benchseal-model-*"))

        before = private_dirs()
        # The queue DB, its WAL and the run dir (Harbor's trial configs, logs, artifacts) live under db.parent.
        scanner = Scanner(CANARY, [db.parent])
        old = os.environ.get(KEY_ENV)
        os.environ[KEY_ENV] = CANARY
        scanner.start()
        try:
            outcome = run_once(WorkerConfig(db=db, policy=policy, suites_dir=setup["suites"], image_trust=setup["trust"]))
        finally:
            scanner.stop_all()
            if old is None:
                os.environ.pop(KEY_ENV, None)
            else:
                os.environ[KEY_ENV] = old
    with SqliteQueue(db) as q:
        run_dir = q.run_dir(accepted.run_id)
    return {"outcome": outcome, "run_id": accepted.run_id, "scanner": scanner, "private_dirs_before": before, "private_dirs_after": private_dirs(), "log": log, "db": db, "run_dir": run_dir, "policy": policy,
            "payload": payload, "requests": [json.loads(line) for line in log.read_text().splitlines()]}


@pytest.fixture(scope="module")
def right_run(agent_setup: dict[str, Any]) -> dict[str, Any]:
    return _run(agent_setup, "right", "agent-right-000001")


@pytest.mark.docker
@pytest.mark.slow
def test_terminus2_scores_one_with_the_right_script(right_run: dict[str, Any]) -> None:
    outcome = right_run["outcome"]
    assert outcome is not None and outcome.state == "SUCCEEDED", outcome and outcome.reason
    grading = outcome.grading
    assert grading.score == 1.0 and grading.counts.resolved == 3 == grading.counts.total
    assert grading.agent == "terminus-2" and grading.agent_version_pin == "0.26.0" == grading.harbor_version
    assert grading.model == "openai/benchseal-scripted"
    requests = right_run["requests"]
    assert requests and all(r["status"] == 200 for r in requests)  # the key always matched
    for trial in grading.trials:
        assert trial.agent_name == "terminus-2" and trial.agent_version == "2.0.0"
        mine = [r for r in requests if r.get("task") == trial.task]
        # Token usage is what the model server counted, per trial; every model call went through the relay.
        assert trial.model_calls == len(mine) >= 3
        assert trial.input_tokens == sum(r["prompt_tokens"] for r in mine)
        assert trial.output_tokens == sum(r["completion_tokens"] for r in mine)
        trial_dir = right_run["run_dir"] / "harbor" / trial.trial_name
        # The agent really drove the container: its terminal shows the scripted commands' output.
        trajectory = (trial_dir / "agent" / "trajectory.json").read_text()
        assert "task_complete" in trajectory
    pane = (right_run["run_dir"] / "harbor").glob("write-answer__*/agent/terminus_2.pane")
    assert "1041" in next(pane).read_text()
    model = build_summary(grading, _payload_model(right_run["payload"]))
    summary = model.to_json_dict()
    # A Harbor built-in agent: no release artifact of the source's own.
    assert summary["agent"] == {"name": "terminus-2", "version": "2.0.0", "version_pin": "0.26.0",
                                "model": "openai/benchseal-scripted", "release": None}
    assert summary["model_usage"]["model_calls"] == len(requests)
    assert summary["model_usage"]["input_tokens"] == sum(r["prompt_tokens"] for r in requests)
    body = render_section(facts_from_summary(model, "v9.9.9"))
    # Cells are escaped Markdown (body.markdown_cell): look for the escaped text.
    assert markdown_cell("terminus-2 2.0.0 (model openai/benchseal-scripted;") in body
    assert markdown_cell("0.26.0") in body


def _payload_model(payload: dict[str, Any]) -> Any:
    from pipeline.core.contracts import DispatchPayload

    return DispatchPayload.model_validate(payload)


@pytest.mark.docker
@pytest.mark.slow
def test_model_key_never_in_argv_inspect_files_or_queue(right_run: dict[str, Any]) -> None:
    scanner: Scanner = right_run["scanner"]
    assert scanner.scans >= 5
    # The scan saw this run's runner and trial containers while they ran (their names carry the run's id or
    # its trials' short id; other workers' containers on the shared engine are not counted).
    names = [n for n in scanner.containers if right_run["run_id"] in n or trial_short_id(right_run["run_id"]) in n]
    assert any(n.startswith("/benchseal-infra-") for n in names), names
    assert sum("__" in n or "main" in n for n in names) >= 1, names
    assert scanner.argv_hits == [], scanner.argv_hits[:3]
    assert scanner.inspect_hits == []
    # The runner was started without the model key in any form: no secret dir (the key is the policy's
    # only secret and it stays with the relay), and its argv and Env name neither the key nor its variable.
    # This run's runner (other tests' runs share the sandbox engine and the scan sees theirs too).
    starts = {name: start for name, start in scanner.runner_starts.items() if right_run["run_id"] in name}
    assert starts, "the runner container was never inspected"
    for name, start in starts.items():
        assert SECRETS_MOUNT not in start["mounts"], (name, start["mounts"])
        assert MODEL_MOUNT in start["mounts"], (name, start["mounts"])
        words = json.dumps(start)
        assert KEY_ENV not in words and CANARY not in words and "--model-key-env" not in words, (name, start)
        assert "--secret-env" not in start["argv"] and "--model-socket" in start["argv"], (name, start["argv"])
    # EVERY container this run created (runner, trial containers, model gateways: the worker and the engine
    # proxy label each with the run, so the create event names it) was inspected while it existed; none of
    # the logs of any container created meanwhile held the key. Other tests share the engine: their
    # unlabelled, short-lived containers (a classic build's step containers) may be gone before a scan;
    # their create events were still searched for the key above.
    created = {i: n for i, n in scanner.created.items() if scanner.created_runs.get(i) == right_run["run_id"]}
    assert any(n.startswith("benchseal-infra-") for n in created.values()), created
    assert sum(n.endswith("-model-gateway") for n in created.values()) >= 3, created
    assert sum("__" in n or "main" in n for n in created.values()) >= 3, created  # Harbor's trial containers, through the proxy
    assert set(created) <= scanner.inspected, {i: n for i, n in created.items() if i not in scanner.inspected}
    assert scanner.log_hits == set()
    # Files were searched while in flight too: Harbor's trial configs, the queue DB, the runner's /tmp.
    assert scanner.file_hits == set(), scanner.file_hits
    assert any(p.endswith("/config.json") for p in scanner.files_seen)
    assert any(p.endswith("queue.sqlite3") for p in scanner.files_seen)
    assert scanner.runner_tmp_scans >= 1, "the runner's /tmp was never searched"
    roots = [right_run["run_dir"], right_run["db"].parent]
    files = [p for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.name == "config.json" for p in files) and any(p.suffix == ".sqlite3" for p in files)
    leaked = [p for p in files if CANARY.encode() in p.read_bytes()]
    assert leaked == []
    # Harbor hands AgentConfig.env to the task container (terminus-2: `tmux new-session -e K=V`):
    # a model-backed agent's env stays empty; the key lives in the runner process only.
    for config_path in (right_run["run_dir"] / "harbor").glob("*/config.json"):
        assert not json.loads(config_path.read_text())["agent"].get("env"), config_path
    # The relay and engine directories of this attempt (what its runner had mounted) are gone. Other
    # workers on this host may hold dirs of their own meanwhile: this attempt's are named by its mounts.
    tmp = Path(tempfile.gettempdir())
    ours = [start for start in scanner.runner_starts.values() if start["run"] == [right_run["run_id"]]]
    assert len(ours) == 1, scanner.runner_starts
    mine = {tmp / Path(src).relative_to(tmp).parts[0] for src in ours[0]["sources"]
            if Path(src).is_relative_to(tmp) and Path(src).relative_to(tmp).parts[0].startswith("benchseal-")}
    assert {p.name.rsplit("-", 1)[0] for p in mine} == {"benchseal-model", "benchseal-engine"}, mine
    assert not [p for p in mine if p.exists()] and not mine & right_run["private_dirs_after"]
    assert not mine & right_run["private_dirs_before"]  # made by this attempt


@pytest.mark.docker
@pytest.mark.slow
def test_terminus2_scores_zero_with_the_wrong_script(agent_setup: dict[str, Any]) -> None:
    run = _run(agent_setup, "wrong", "agent-wrong-000001")
    outcome = run["outcome"]
    assert outcome is not None and outcome.state == "SUCCEEDED", outcome and outcome.reason
    grading = outcome.grading
    # Completed, graded 0 by the verifier: not an infrastructure error, not an agent crash.
    assert grading.score == 0.0 and grading.counts.unresolved == 3 and grading.counts.infra_errors == 0
    assert all(t.exception_type is None and t.reward == 0.0 and (t.model_calls or 0) >= 2 for t in grading.trials)
    stdout = next((run["run_dir"] / "harbor").glob("fix-mean__*/verifier/test-stdout.txt")).read_text()
    # The agent's change was applied (the empty case passes now) but the fraction is still wrong.
    assert "test_empty (__main__.MeanTest.test_empty) ... ok" in stdout
    assert "test_fraction (__main__.MeanTest.test_fraction) ... FAIL" in stdout and "('value', 1.5)" in stdout


def test_local_release_scripted_model_is_explicit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import urllib.request

    from pipeline.local.model import scripted_model_for

    port = free_port()
    policy = load_policy(_write_policy(tmp_path, _policy_data(port)))
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(UsageError, match=f"set {KEY_ENV}, or pass --scripted-model"), \
            scripted_model_for("terminus-2", "smoke", None, policy):
        pass
    with pytest.raises(UsageError, match="calls no model"), scripted_model_for("oracle", "smoke", "right", policy):
        pass
    with pytest.raises(ValidationError, match="--scripted-model"), scripted_model_for("terminus-2", "smoke", "maybe", policy):
        pass
    with pytest.raises(ValidationError, match="not allowed by policy"), scripted_model_for("gpt-agent", "smoke", None, policy):
        pass
    with scripted_model_for("oracle", "smoke", None, policy) as none:
        assert none is None
    with scripted_model_for("terminus-2", "smoke", "right", policy) as server:
        assert server is not None and server.port == port
        key = os.environ[KEY_ENV]
        assert len(key) > 32
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert urllib.request.urlopen(request, timeout=5).status == 200
    assert KEY_ENV not in os.environ
    # Port taken: a clear usage error, nothing half-started.
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the last run's connections are in TIME_WAIT
        busy.bind(("127.0.0.1", port))
        busy.listen()
        with pytest.raises(UsageError, match="cannot listen"), scripted_model_for("terminus-2", "smoke", "right", policy):
            pass
    remote = _policy_data()
    remote["suites"]["smoke"]["model"]["endpoint"] = "https://models.example.test:443/v1"
    with pytest.raises(UsageError, match="PORT only"), \
            scripted_model_for("terminus-2", "smoke", "right", load_policy(_write_policy(tmp_path, remote))):
        pass


# --- egress: from inside the runner, the model and nothing else -----------------------

_EGRESS_PROBE = r"""
import json, os, socket, sys, urllib.request
from pathlib import Path
from pipeline.core.project import PLACEHOLDER_KEY
from pipeline.infra.sandbox.relay import TcpToUnixRelay

# What the worker mounts: the model socket, and no secret dir (the model key is the relay's alone).
out = {"mounted": sorted(os.listdir("/run/benchseal"))}
relay = TcpToUnixRelay(Path("/run/benchseal/model/model.sock"))
relay.start()
chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "probe"}]}).encode()
# The runner's agents hold the placeholder; a sandbox process may also send nothing: the relay adds the key.
for name, headers in [("model", {"Authorization": "Bearer " + PLACEHOLDER_KEY}), ("model_no_auth", {})]:
    req = urllib.request.Request(f"http://127.0.0.1:{relay.port}/v1/chat/completions", data=chat,
                                 headers={**headers, "Content-Type": "application/json"})
    out[name] = json.loads(urllib.request.urlopen(req, timeout=10).read())["model"]
# Anything but the model call (another path or host, another method) is refused by the host's relay.
for name, url, data, headers in [("steer", "/v2/", None, {"Host": "127.0.0.1:5055"}),
                                 ("foreign_host", "/v1/chat/completions", chat, {"Host": "127.0.0.1.example:5055"}),
                                 ("models", "/v1/models", None, {})]:
    try:
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{relay.port}{url}", data=data,
                                                      headers=headers), timeout=10)
        out[name] = "reached"
    except urllib.error.HTTPError as exc:
        out[name] = exc.code
for name, addr in [("registry", ("127.0.0.1", int(sys.argv[1]))), ("model_direct", ("127.0.0.1", int(sys.argv[2]))),
                   ("bridge_gateway", ("172.17.0.1", int(sys.argv[1]))), ("metadata", ("169.254.169.254", 80)),
                   ("internet", ("1.1.1.1", 443))]:
    try:
        socket.create_connection(addr, timeout=3).close()
        out[name] = "connected"
    except OSError as exc:
        out[name] = type(exc).__name__ + ":" + str(exc.errno)
try:
    socket.getaddrinfo("example.com", 443)
    out["dns"] = "resolved"
except OSError as exc:
    out["dns"] = "failed"
print(json.dumps(out))
"""


@pytest.mark.docker
@pytest.mark.slow
def test_runner_reaches_the_model_and_nothing_else(tmp_path: Path, make_payload: Any, local_images: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner container exactly as the worker starts it (network none, relay socket, no model key)."""
    from pipeline.core.contracts import DispatchPayload

    registry_port = int(local_images["runner"].registry.rpartition(":")[2])
    with ModelServer(key=CANARY, log_path=tmp_path / "log.jsonl") as server:
        data = _policy_data(server.port)
        policy = load_policy(_write_policy(tmp_path, data))
        monkeypatch.setenv(KEY_ENV, CANARY)
        setup = prepare_runner_agent(policy, DispatchPayload.model_validate(make_payload(agent="terminus-2")))
        client = docker.from_env()
        try:
            output = client.containers.run(
                local_images["runner"].ref, entrypoint=["python3", "-c", _EGRESS_PROBE],
                command=[str(registry_port), str(server.port)], volumes=setup.volumes, network_mode="none",
                environment={"HARBOR_TELEMETRY": "0"}, remove=True, stdout=True, stderr=True)
        finally:
            setup.close()
    assert CANARY.encode() not in output
    result = json.loads(output.decode().strip().splitlines()[-1])
    assert result["mounted"] == ["model"], result  # no secrets dir: the key is the only secret, and the relay's
    # The model answered both (it refuses any key but its own): the relay added the real key.
    assert result["model"] == "benchseal-scripted" == result["model_no_auth"]
    assert (result["steer"], result["foreign_host"], result["models"]) == (405, 400, 405)  # refused by the relay
    for name in ("registry", "model_direct", "bridge_gateway", "metadata", "internet"):
        assert result[name] != "connected", (name, result)
    assert result["dns"] == "failed"
    requests = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    # The refused ones never reached it; both admitted calls carried the real key.
    assert [(r["path"], r["status"]) for r in requests] == [("/v1/chat/completions", 200)] * 2


# --- egress from inside a trial container: the model gateway and nothing else ----------

_TRIAL_PROBE = r"""
import json, os, socket, sys, urllib.error, urllib.request
out = {"interfaces": sorted(os.listdir("/sys/class/net"))}
try:
    # A key of the trial's own choosing: the relay drops it and adds the real one.
    req = urllib.request.Request("http://127.0.0.1:%s/v1/chat/completions" % sys.argv[1], data=b'{"messages": []}',
                                 headers={"Authorization": "Bearer sk-trial-guess", "X-Api-Key": "sk-trial-guess"})
    out["model"] = "200 " + json.loads(urllib.request.urlopen(req, timeout=10).read())["model"]
except urllib.error.HTTPError as exc:
    out["model"] = "%d %s" % (exc.code, json.loads(exc.read())["error"]["message"])
except OSError as exc:
    out["model"] = "unreachable " + str(exc)
targets = [("registry", "127.0.0.1", sys.argv[2]), ("loopback_service", "127.0.0.1", sys.argv[3]),
           ("model_direct", "127.0.0.1", sys.argv[4]), ("host_via_bridge", "172.17.0.1", sys.argv[5]),
           ("registry_via_bridge", "172.17.0.1", sys.argv[2]), ("metadata", "169.254.169.254", "80"),
           ("internet", "1.1.1.1", "443")]
for name, host, port in targets:
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        out[name] = "connected"
    except OSError as exc:
        out[name] = "refused " + type(exc).__name__
try:
    socket.getaddrinfo("example.com", 443)
    out["dns"] = "resolved"
except OSError:
    out["dns"] = "failed"
print("PROBE " + json.dumps(out))
"""


class _Listener:
    """A TCP service on the host that must stay unreachable (counts the connections it accepts)."""

    def __init__(self, host: str) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


@pytest.mark.docker
@pytest.mark.slow
def test_trial_container_reaches_the_model_and_nothing_else(tmp_path: Path, make_payload: Any, local_images: Any,
                                                            base_refs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task container started THROUGH the runner's engine proxy (as Harbor's compose does): the
    proxy forces it into its own model gateway's network namespace; the model answers there, while
    the registry, two other host services (loopback and all-interfaces), the metadata address, the
    internet and DNS are refused."""
    from pipeline.core.contracts import DispatchPayload
    from pipeline.imaging.build import ensure_local
    from pipeline.infra.sandbox.agents import trial_usage
    from pipeline.infra.sandbox.engine_proxy import GATEWAY_LABEL
    from pipeline.infra.sandbox.relay import GATEWAY_PORT, CallUsage

    base = base_refs["base"]
    ensure_local(base)
    registry_port = int(local_images["runner"].registry.rpartition(":")[2])
    run_label = f"egress-{SESSION}-{uuid.uuid4().hex[:6]}"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    loopback, anywhere = _Listener("127.0.0.1"), _Listener("0.0.0.0")
    client = docker.from_env()
    try:
        with ModelServer(key=CANARY, log_path=tmp_path / "log.jsonl") as server:
            policy = load_policy(_write_policy(tmp_path, _policy_data(server.port)))
            monkeypatch.setenv(KEY_ENV, CANARY)
            setup = prepare_runner_agent(policy, DispatchPayload.model_validate(make_payload(agent="terminus-2")),
                                         run_dir=run_dir, runner_image=local_images["runner"].ref,
                                         labels={LABEL_RUN: run_label})
            try:
                # Started, probed with exec and removed with DELETE, as Harbor's compose does (an
                # AutoRemove container's gateway goes when the proxy stops). The runner may not touch
                # the gateway itself.
                script = ('docker run -d --name "$1" --label com.docker.compose.project="$1" "$2" sleep 300 >/dev/null; '
                          'echo "run=$?"; '
                          'docker exec "$1" python3 -c "$3" "$4" "$5" "$6" "$7" "$8"; echo "exit=$?"; '
                          'gw=$(docker inspect -f \'{{index .Config.Labels "benchseal.engine-proxy.gateway"}}\' "$1"); '
                          'echo "gateway=$gw"; '
                          'if out=$(docker exec "$gw" true 2>&1); then echo gw_exec=ok; '
                          'else echo "gw_exec=refused:$(echo "$out" | grep -c \'benchseal engine proxy\')"; fi; '
                          'if out=$(docker kill "$gw" 2>&1); then echo gw_kill=ok; '
                          'else echo "gw_kill=refused:$(echo "$out" | grep -c \'benchseal engine proxy\')"; fi; '
                          'docker rm -f "$1" >/dev/null; echo "rm=$?"; '
                          'docker run --rm --network bridge "$2" true; echo "bridge_exit=$?"')
                output = client.containers.run(
                    local_images["runner"].ref, entrypoint=["sh", "-c", script, "probe"],
                    command=[f"egress-trial-{run_label}", base.ref, _TRIAL_PROBE, str(GATEWAY_PORT), str(registry_port),
                             str(loopback.port), str(server.port), str(anywhere.port)],
                    volumes={str(run_dir): {"bind": str(run_dir), "mode": "rw"}, **setup.volumes},
                    network_mode="none", environment={"DOCKER_BUILDKIT": "0"}, remove=True, stdout=True,
                    stderr=True).decode()
                engine = setup.engine
                assert engine is not None
                # The proxy removes a gateway once the engine answered its container's DELETE (after
                # the reply reached the client, so a moment later): before the proxy stops, not by it.
                wait_for(lambda: not engine.gateways, "the gateway's removal after `docker rm`", limit=30)
            finally:
                setup.close()
        leftovers = client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_label}"})
    finally:
        loopback.close()
        anywhere.close()
    line = next((x for x in output.splitlines() if x.startswith("PROBE ")), None)
    assert line is not None, output
    result = json.loads(line[len("PROBE "):])
    # Only a loopback interface: the gateway's namespace, no bridge, no route anywhere.
    assert result["interfaces"] == ["lo"], result
    # The model server itself answered, through the gateway and the relay, which replaced the trial's
    # guess with the real key (the server refuses any other); the key itself never entered the trial.
    assert result["model"] == "200 benchseal-scripted", result
    assert CANARY not in output
    for name in ("registry", "loopback_service", "model_direct", "host_via_bridge", "registry_via_bridge",
                 "metadata", "internet"):
        assert result[name].startswith("refused"), (name, result)
    assert result["dns"] == "failed"
    assert loopback.accepted == 0 and anywhere.accepted == 0
    assert "run=0" in output and "exit=0" in output and "rm=0" in output
    results = dict(x.split("=", 1) for x in output.splitlines() if "=" in x and not x.startswith("PROBE "))
    assert len(results.get("gateway", "")) == 64, output
    assert results["gw_exec"] == "refused:1" and results["gw_kill"] == "refused:1", output
    # Asking for a network is refused outright.
    assert "bridge_exit=125" in output and "benchseal engine proxy" in output, output
    requests = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [(r["path"], r["status"]) for r in requests] == [("/v1/chat/completions", 200)]
    # The gateway had a relay socket of its own, which counted the call under the container's compose project
    # (its trial): the usage the model answered with, as the worker records it for a release's own agent.
    trial = f"egress-trial-{run_label}".lower()
    assert trial_usage(setup.usage, trial, [trial]) == CallUsage(1, requests[0]["prompt_tokens"],
                                                                 requests[0]["completion_tokens"])
    # The gateway went with its container (waited for above), and nothing of the run is left.
    assert leftovers == []
    assert not [c for c in client.containers.list(all=True, filters={"label": GATEWAY_LABEL})
                if c.labels.get(LABEL_RUN) == run_label]


# --- engine access: from inside the runner, its own containers only --------------------

_ENGINE_PROBE = r"""
set -u
base="$1"; victim="$2"; run="$3"; pull="$4"; vol="$5"
try() { name="$1"; shift; if out=$("$@" 2>&1); then echo "$name=ok"; else echo "$name=refused:$(echo "$out" | grep -c 'benchseal engine proxy')"; fi; }
try privileged_root docker run --rm --privileged -v /:/host "$base" true
try bind_root docker run --rm -v /:/host "$base" true
try bind_etc docker run --rm -v /etc:/x "$base" true
try mount_etc docker run --rm --mount type=bind,source=/etc,target=/x "$base" true
ln -s / "$run/escape"
try bind_symlink docker run --rm -v "$run/escape:/x" "$base" true
try host_net docker run --rm --network host "$base" true
try host_pid docker run --rm --pid host "$base" true
try cap_add docker run --rm --cap-add SYS_ADMIN "$base" true
try volumes_from docker run --rm --volumes-from "$victim" "$base" true
try exec_other docker exec "$victim" true
try inspect_other docker container inspect "$victim"
try kill_other docker kill "$victim"
try pull docker pull "$pull"
try bind_volume docker volume create --opt type=none --opt o=bind --opt device=/ "$vol"
mkdir -p "$run/ok"
try own_run docker run --rm --network none -v "$run/ok:/ok" "$base" sh -c 'echo inside > /ok/out.txt'
echo "own_out=$(cat "$run/ok/out.txt" 2>/dev/null)"
"""


@pytest.mark.docker
@pytest.mark.slow
def test_runner_engine_access_is_filtered(tmp_path: Path, make_payload: Any, local_images: Any,
                                          base_refs: Any) -> None:
    """docker CLI inside the runner, through the worker's engine proxy: only its own, unprivileged containers."""
    from pipeline.core.contracts import DispatchPayload
    from pipeline.imaging.build import ensure_local

    base = base_refs["base"]
    ensure_local(base)
    client = docker.from_env()
    victim = client.containers.run(base.ref, ["sleep", "120"], detach=True, network_mode="none",
                                   labels={"benchseal.test": "engine-victim"})
    escape = f"escape-vol-{SESSION}-{uuid.uuid4().hex[:6]}"  # this test's own name: the engine is shared
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    policy = load_policy(_write_policy(tmp_path, _policy_data()))
    setup = prepare_runner_agent(policy, DispatchPayload.model_validate(make_payload(agent="oracle")), run_dir=run_dir)
    try:
        output = client.containers.run(
            local_images["runner"].ref, entrypoint=["sh", "-c", _ENGINE_PROBE, "probe"],
            command=[base.ref, victim.name, str(run_dir), local_images["runner"].ref, escape],
            volumes={str(run_dir): {"bind": str(run_dir), "mode": "rw"}, **setup.volumes}, network_mode="none",
            environment={"DOCKER_BUILDKIT": "0"}, remove=True, stdout=True, stderr=True).decode()
        refused = list(setup.engine.refused) if setup.engine else []
    finally:
        setup.close()
        victim.reload()
        victim_status = victim.status
        victim.remove(force=True)
    results = dict(line.split("=", 1) for line in output.strip().splitlines() if "=" in line)
    for name in ("privileged_root", "bind_root", "bind_etc", "mount_etc", "bind_symlink", "host_net", "host_pid",
                 "cap_add", "volumes_from", "exec_other", "inspect_other", "kill_other", "pull", "bind_volume"):
        assert results.get(name, "").startswith("refused:") and results[name] != "refused:0", (name, output)
    assert victim_status == "running"  # untouched
    # Not a proxy that refuses everything: its own unprivileged container under the run dir works.
    assert results["own_run"] == "ok" and results["own_out"] == "inside", output
    assert (run_dir / "ok" / "out.txt").read_text() == "inside\n"
    assert any("privileged" in r for r in refused) and any("/etc" in r for r in refused)
    assert escape not in [v.name for v in client.volumes.list(filters={"name": escape})]


# --- secret files outlive no worker: kill -9 before the runner planned, then recovery -----

@pytest.fixture
def private_tmp() -> Any:
    """A TMPDIR of this test's own directly under /tmp: the relay's socket goes below it, and a socket
    path is at most 107 bytes (an xdist worker's basetemp, /tmp/pytest-of-USER/pytest-N/popen-gwN/...,
    leaves too little of them for a long test name)."""
    path = Path(tempfile.mkdtemp(prefix="bs-tmp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_reaper_spares_a_live_attempts_dirs_and_takes_a_dead_ones(tmp_path: Path, make_payload: Any,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    private_tmp: Path) -> None:
    import subprocess
    import sys

    from pipeline.core.contracts import DispatchPayload
    from pipeline.infra.sandbox.agents import reap_private_dirs

    private = private_tmp
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    monkeypatch.setenv(KEY_ENV, CANARY)
    monkeypatch.setenv(EXTRA_ENV, EXTRA_CANARY)
    data = _policy_data()
    data["secret_env"] = [KEY_ENV, EXTRA_ENV]  # a secret besides the model key: the runner gets a secret dir
    policy = load_policy(_write_policy(tmp_path, data))
    setup = prepare_runner_agent(policy, DispatchPayload.model_validate(make_payload(agent="terminus-2")),
                                 run_dir=tmp_path)
    try:
        live = sorted(private.iterdir())
        assert [p.name.rsplit("-", 1)[0] for p in live] == ["benchseal-engine", "benchseal-model", "benchseal-secrets"]
        assert [p for p in private.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()] == []
        assert reap_private_dirs() == [] and all(p.exists() for p in live)  # held by this attempt
    finally:
        setup.close()
    # A process that made its dirs and died with -9 (its locks gone with it): the next reap removes them.
    code = ("import os, signal, sys\nfrom pathlib import Path\nfrom pipeline.infra.sandbox.agents import _private_dir\n"
            "locks = []\nd = _private_dir('benchseal-secrets-', locks)\n(d / 'K').write_text(sys.argv[1])\n"
            "print(d, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code, CANARY], env={**os.environ, "TMPDIR": str(private)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -9
    dead = Path(done.stdout.strip())
    assert (dead / "K").read_text() == CANARY
    # A directory of the same name without the lock marker (not made by _private_dir) is never touched.
    foreign = private / "benchseal-secrets-foreign"
    foreign.mkdir()
    assert reap_private_dirs() == [dead] and not dead.exists() and foreign.is_dir()


def test_reaper_takes_a_dead_workers_dir_whose_lock_a_forked_child_still_holds(private_tmp: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed while a child it forked has not exec'd yet: the child holds the lock (the same open
    file), the owner named in the directory's name is gone, so the directory goes; a held dir whose name
    says another pid namespace is kept (a pid there says nothing here), as is one without a name tag."""
    import fcntl
    import signal
    import subprocess
    import sys

    from pipeline.infra.sandbox import agents

    private = private_tmp
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    code = ("import os, signal, sys, time\nfrom pipeline.infra.sandbox.agents import _private_dir\n"
            "d = _private_dir('benchseal-secrets-', [])\n(d / 'K').write_text(sys.argv[1])\n"
            "r, w = os.pipe()\nif os.fork() == 0:\n    os.close(r); os.close(w); time.sleep(600); os._exit(0)\n"
            "print(d, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    worker = subprocess.Popen([sys.executable, "-c", code, CANARY], env={**os.environ, "TMPDIR": str(private)},
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert worker.stdout is not None
        dead = Path(worker.stdout.readline().strip())
        assert worker.wait(timeout=60) == -9
        assert dead.name.startswith(f"benchseal-secrets-{agents._pid_namespace()}.{worker.pid}."), dead.name
        probe = os.open(dead, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(BlockingIOError):  # still held: by the forked child, which lives on
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(probe)
        # Held dirs this process made: one named for another pid namespace (the same dead pid), one untagged.
        elsewhere = private / dead.name.replace(f"-{agents._pid_namespace()}.", f"-{agents._pid_namespace() + 1}.")
        untagged = private / "benchseal-secrets-plain"
        locks = []
        for path in (elsewhere, untagged):
            path.mkdir(mode=0o700)
            (path / agents.LOCK_MARKER).touch()
            locks.append(os.open(path, os.O_RDONLY | os.O_DIRECTORY))
            fcntl.flock(locks[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            assert agents.reap_private_dirs() == [dead] and not dead.exists()
            assert elsewhere.is_dir() and untagged.is_dir()
        finally:
            for fd in locks:
                os.close(fd)
        assert set(agents.reap_private_dirs()) == {elsewhere, untagged}  # their locks free now: the ordinary case
    finally:
        os.killpg(worker.pid, signal.SIGKILL)


@pytest.mark.docker
@pytest.mark.slow
def test_worker_killed_9_before_planning_leaves_no_secret_after_recovery(agent_setup: dict[str, Any],
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          private_tmp: Path) -> None:
    """A real `benchseal worker` is frozen the moment its secret file exists and killed with -9 (so
    it never drops the file); the next worker on the host removes it, and the dead attempt's
    runner, trial and gateway containers, before anything else. The secret is one besides the
    model key: the model key itself is never written to a file at all."""
    import signal
    import subprocess
    import sys

    root: Path = agent_setup["root"] / "kill9-secrets"
    root.mkdir()
    private = private_tmp
    with ModelServer(key=CANARY, mode="right", log_path=root / "model.jsonl") as server:
        data = json.loads(json.dumps(agent_setup["data"]))
        data["suites"]["smoke"]["model"]["endpoint"] = server.base_url
        data["max_attempts"], data["lease_seconds"] = 1, 4
        data["secret_env"] = [KEY_ENV, EXTRA_ENV]
        policy_path = _write_policy(root, data)
        policy = load_policy(policy_path)
        db = root / "queue.sqlite3"
        payload = {"schema": "benchseal.dispatch/v1", "correlation_id": f"agent-kill9-secrets-{SESSION}",
                   "source": {"repository": "acme/benchseal", "commit": "0123456789abcdef0123456789abcdef01234567",
                              "tag": "v9.9.9"},
                   "runner": agent_setup["runner"], "api": agent_setup["api"], "suite": "smoke", "agent": "terminus-2"}
        run_id = accept_payload(payload, db=db, policy=policy).run_id
        trust = agent_setup["trust"]
        cmd = [sys.executable, "-m", "pipeline", "worker", "--once", "--db", str(db), "--policy", str(policy_path),
               "--suites-dir", str(agent_setup["suites"]), "--sigstore-url", str(trust.fulcio_url),
               "--trusted-root", str(trust.trusted_root)]
        env = {**os.environ, "TMPDIR": str(private), KEY_ENV: CANARY, EXTRA_ENV: EXTRA_CANARY,
               "PYTHONPATH": str(REPO_ROOT)}
        worker = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        secret: list[Path] = []
        try:
            def secret_written() -> bool:
                secret[:] = [p for p in private.glob(f"benchseal-secrets-*/{EXTRA_ENV}")]
                return bool(secret)

            wait_for(secret_written, "the worker's secret file", limit=240)
            worker.send_signal(signal.SIGSTOP)  # frozen: it can no longer drop the file itself
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        assert worker.returncode == -signal.SIGKILL
        assert secret[0].read_text() == EXTRA_CANARY  # left behind by the dead worker
        left = sorted(p.name.rsplit("-", 1)[0] for p in private.iterdir())
        assert "benchseal-secrets" in left and "benchseal-model" in left
        # The model key is in none of them: not as a secret file, not under another name.
        assert not list(private.glob(f"benchseal-secrets-*/{KEY_ENV}"))
        assert [p for p in private.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()] == []
        # Recovery: the next worker on this host (same temp dir) polls the queue.
        monkeypatch.setattr(tempfile, "tempdir", str(private))
        outcomes: list[Any] = []

        def recovered() -> bool:
            got = run_once(WorkerConfig(db=db, policy=policy, suites_dir=agent_setup["suites"], image_trust=trust))
            if got is not None:
                outcomes.append(got)
            return bool(outcomes)

        # Its very first poll (before the lease expires, nothing to claim yet) already removed the files.
        assert run_once(WorkerConfig(db=db, policy=policy, suites_dir=agent_setup["suites"], image_trust=trust)) is None
        assert not secret[0].exists() and list(private.iterdir()) == []
        wait_for(recovered, "the lease to expire and the run to be finalized", limit=60)
    assert outcomes[0].run_id == run_id and outcomes[0].state == "INFRA_ERROR"
    client = sandbox_engine()
    assert client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"}) == []
    roots = [db.parent]
    files = [p for r in roots for p in r.rglob("*") if p.is_file() and not p.is_symlink()]
    assert [p for p in files if CANARY.encode() in p.read_bytes() or EXTRA_CANARY.encode() in p.read_bytes()] == []
