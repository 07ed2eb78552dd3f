"""The production-shaped chain: a token-auth registry is the only registry, images have configured names.

What a team on GitHub with ghcr.io does, on this machine:

* the project's own token server and ``docker-registry`` (pipeline.local.authregistry) are the
  registry; nothing here names the plain local registry (127.0.0.1:5055);
* ``benchseal build`` pushes under ``$BENCHSEAL_IMAGE_PREFIX = 127.0.0.1:PORT/acme/benchseal-``
  (runner, api and both bases) with the CI's push credentials from a Docker config
  (``$DOCKER_CONFIG``, as docker/login-action leaves it);
* the images are signed and attested as tag.yml would (cosign, same Docker config);
* ``dispatch_and_wait`` goes through the GitHub emulator; the emulated benchmark.yml job runs
  ``benchseal infra accept`` with a policy listing exactly these names, then the worker, whose
  Docker config holds a different, pull-only identity: it pulls the runner and the base, checks
  the signatures, runs the smoke suite, reads the SBOMs from the registry, signs the evidence;
* ``benchseal publish --pending`` publishes to the GitHub Release; the downloaded assets verify.

While it runs, every process's /proc/PID/cmdline and environ and every container's
configuration are scanned for the passwords, their Basic forms and every bearer token the
token server issued; afterwards every output file and the registry log are scanned too.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from pipeline.core.paths import REPO_ROOT
from pipeline.dispatch.client import make_client
from pipeline.infra.worker.containers import CONTAINER_PREFIX
from pipeline.infra.worker.loop import LABEL_RUN
from pipeline.local import authregistry
from pipeline.local import registry as reg
from pipeline.local.tokenserver import TokenServer
from tests.fixtures.github import tag_release_commit
from tests.fixtures.infra import proc_hits, sandbox_engine, wait_terminal
from tests.registry.helpers import basic_entry, free_port, write_docker_config

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SOURCE = "acme/widget"
INFRA = "acme/bench-infra"
TAG = "v3.1.4"
# Unique per session: the run id (and so the labels of its containers on the shared engines) is this run's own.
CORRELATION = f"e2e-prod-v3.1.4-{uuid.uuid4().hex[:8]}"
BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
PLAIN_REGISTRY = "127.0.0.1:5055"
# The plain registry's address, not a longer port that starts with the same digits (a client's
# ephemeral port such as 127.0.0.1:50552 in the auth registry's request log).
PLAIN_REGISTRY_RE = re.compile(re.escape(PLAIN_REGISTRY).encode() + rb"(?![0-9])")


class RecordingTokenServer(TokenServer):
    """The project's token server, remembering every token it signs (canaries for the scans)."""

    tokens: list[str]

    def sign(self, subject: str, access: list[tuple[str, tuple[str, ...]]]) -> tuple[str, int]:
        token, expires = super().sign(subject, access)
        self.tokens.append(token)
        return token, expires


class SecretScanner:
    """Scans /proc/*/cmdline, /proc/*/environ and every container's configuration for secrets."""

    def __init__(self, secrets: list[str], tokens: list[str]) -> None:
        self.secrets = secrets
        self.tokens = tokens  # grows while the run goes on
        self.hits: list[str] = []
        self.proc_scans = 0
        self.container_scans = 0
        self.runner_runs: set[str] = set()  # the run labels of the worker's runner containers inspected (any run's)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def needles(self) -> list[bytes]:
        return [s.encode() for s in [*self.secrets, *list(self.tokens)]]

    def _scan_proc(self, needles: list[bytes]) -> None:
        self.hits.extend(proc_hits(needles))
        self.proc_scans += 1

    def _scan_containers(self, client: Any, needles: list[bytes]) -> None:
        import docker.errors

        try:
            containers = client.containers.list(all=True)
        except docker.errors.DockerException:
            return
        for container in containers:
            run = (container.attrs.get("Config", {}).get("Labels") or {}).get(LABEL_RUN)
            if run and container.name.startswith(CONTAINER_PREFIX):
                self.runner_runs.add(run)
            data = json.dumps(container.attrs).encode()
            if any(n in data for n in needles):
                self.hits.append(f"container {container.name}")
        self.container_scans += 1

    def _run(self) -> None:
        import docker

        # Both engines: the host's (pulls) and the sandbox's (where the runner and trials run).
        clients = [docker.from_env(timeout=30), sandbox_engine()]
        try:
            last = 0.0
            while not self._stop.is_set():
                needles = self.needles()
                self._scan_proc(needles)
                if time.monotonic() - last > 1.0:
                    for client in clients:
                        self._scan_containers(client, needles)
                    last = time.monotonic()
                self._stop.wait(0.05)
        finally:
            for client in clients:
                client.close()

    def __enter__(self) -> SecretScanner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class World:
    address: str
    prefix: str
    secrets: list[str]
    tokens: list[str]
    token_server: RecordingTokenServer
    registry: reg.Registry
    digests: dict[str, Any]
    home: Path
    outputs: list[Path]
    scanner: SecretScanner
    state: str
    score: float | None
    artifacts: Path
    downloaded: Path
    dispatch: Any
    build_stderr: str
    plain_log_before: int


def _env(base: dict[str, str], **extra: str) -> dict[str, str]:
    # Nothing inherited may name another registry or prefix: the configured one is the only one.
    env = {k: v for k, v in os.environ.items()
           if k not in ("BENCHSEAL_REGISTRY", "BENCHSEAL_IMAGE_PREFIX", "REGISTRY_AUTH_FILE", "DOCKER_CONFIG",
                        "BENCHSEAL_HOME", "GH_TOKEN")}
    return {**env, **base, **extra, "NO_PROXY": "127.0.0.1,localhost", "HARBOR_TELEMETRY": "0"}


def _policy(path: Path, prefix: str) -> Path:
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    registry, _, repo_prefix = prefix.partition("/")
    data["sources"] = [{"repository": SOURCE, "signer": {"workflow": "tag.yml"},
                        "images": {role: [{"registry": registry, "repository": repo_prefix + role}]
                                   for role in ("runner", "api")}}]
    path.write_text(yaml.safe_dump(data))
    return path


def _plain_registry_log() -> Path:
    return reg.default_registry().log_path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, sign_release_images: Any) -> Iterator[World]:
    from pipeline.core import paths
    from pipeline.dispatch.correlate import PollConfig
    from pipeline.dispatch.dispatch import dispatch_and_wait
    from pipeline.local import sigstore as sigstore_local
    from tests.doubles.github import GitHubEmulator

    root = tmp_path_factory.mktemp("e2e-prod")
    home = root / "home"
    home.mkdir()
    if (paths.home() / "tools").is_dir():  # cosign, installed by make setup
        (home / "tools").symlink_to(paths.home() / "tools", target_is_directory=True)
    import secrets as rand

    users = {"ci": "ci-" + rand.token_urlsafe(18), "infra": "infra-" + rand.token_urlsafe(18)}
    server = RecordingTokenServer(root / "token-server")
    server.tokens = []
    server.add_user("ci", users["ci"], {"acme/*": {"pull", "push"}})
    server.add_user("infra", users["infra"], {"acme/*": {"pull"}})  # the infra host only pulls
    server.start()
    registry = reg.Registry(address=f"127.0.0.1:{free_port()}", state=root / "registry")
    secrets = [*users.values(), *(base64.b64encode(f"{u}:{p}".encode()).decode() for u, p in users.items())]
    prefix = f"{registry.address}/acme/benchseal-"
    ci_config = write_docker_config(root / "docker-ci", {"auths": {registry.address: basic_entry("ci", users["ci"])}})
    infra_config = write_docker_config(root / "docker-infra",
                                       {"auths": {registry.address: basic_entry("infra", users["infra"])}})
    lock = root / "base.lock.json"
    digests_path = root / "digests.json"
    db = home / "infra" / "queue.sqlite3"
    logs = root / "logs"
    logs.mkdir()
    policy = _policy(root / "infra.yaml", prefix)
    plain_log = _plain_registry_log()
    plain_before = plain_log.stat().st_size if plain_log.is_file() else 0
    patch = pytest.MonkeyPatch()
    try:
        authregistry.start_token(registry, server)
        with SecretScanner(secrets, server.tokens) as scanner:
            # tag.yml's build job: docker/login-action left a Docker config; the names are configuration.
            build_env = _env({"DOCKER_CONFIG": str(ci_config), "BENCHSEAL_IMAGE_PREFIX": prefix,
                              "BENCHSEAL_BASE_LOCK": str(lock), "GITHUB_REPOSITORY": SOURCE,
                              "GITHUB_REF": f"refs/tags/{TAG}"})
            built = subprocess.run([BENCHSEAL, "build", "--out", str(digests_path)], cwd=REPO_ROOT, env=build_env,
                                   capture_output=True, text=True, timeout=1800, check=False)
            (logs / "build.log").write_text(built.stdout + built.stderr)
            assert built.returncode == 0, built.stderr[-3000:]
            digests = json.loads(digests_path.read_text())
            # tag.yml's attest step, with the same login (cosign reads $DOCKER_CONFIG).
            patch.setenv("DOCKER_CONFIG", str(ci_config))
            # Signed at the commit the tag resolves to: the worker pins the payload's commit.
            trust = sign_release_images(SOURCE, TAG, [e["ref"] for e in digests["images"].values()],
                                        commit=digests["source"]["commit"])
            patch.delenv("DOCKER_CONFIG")
            # The infra host: its own state dir, pull-only login, the policy naming these images.
            patch.setenv("BENCHSEAL_HOME", str(home))
            infra_env_base = {"DOCKER_CONFIG": str(infra_config), "BENCHSEAL_IMAGE_PREFIX": prefix,
                              "BENCHSEAL_BASE_LOCK": str(lock), "BENCHSEAL_HOME": str(home)}
            states: list[str] = []
            with GitHubEmulator() as emu:
                emu.add_repo(SOURCE)
                emu.add_repo(INFRA)
                # The infra repository's caller (benchseal's own benchmark.yml is workflow_call only).
                emu.add_workflow(INFRA, ".github/workflows/benchmark.yml",
                                 (REPO_ROOT / "examples/bench-infra/.github/workflows/benchmark.yml").read_text("utf-8"))
                gh = make_client(base_url=emu.base_url, token=emu.token, backoff_factor=0.0)
                tag_release_commit(emu, SOURCE, TAG, digests["source"]["commit"])
                gh.get_repo(SOURCE).create_git_release(tag=TAG, name=TAG, message="notes\n")
                infra_env = _env(infra_env_base, GITHUB_TOKEN=emu.token, GITHUB_API_URL=emu.base_url)

                def benchmark_job(handle: Any, event: Any) -> None:
                    handle.start()
                    accepted = subprocess.run(
                        [BENCHSEAL, "infra", "accept", "--payload", "-", "--json", "--db", str(db),
                         "--policy", str(policy)],
                        input=json.dumps(dict(handle.payload)), capture_output=True, text=True, env=infra_env,
                        check=False, timeout=60)
                    (logs / "accept.log").write_text(accepted.stdout + accepted.stderr)
                    if accepted.returncode != 0:
                        handle.complete("failure")
                        raise AssertionError(f"infra accept failed: {accepted.stderr}")
                    with (logs / "worker.log").open("wb") as log:
                        worker = subprocess.run(
                            [BENCHSEAL, "worker", "--once", "--publish", "github", "--signer", "local",
                             "--db", str(db), "--policy", str(policy), "--api-url", emu.base_url,
                             "--sigstore-url", str(trust.fulcio_url), "--trusted-root", str(trust.trusted_root)],
                            env=infra_env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, timeout=1200,
                            check=False)
                    state = wait_terminal(db, CORRELATION, timeout=5)
                    states.append(state)
                    if worker.returncode != 0 and state != "SUCCEEDED":
                        handle.complete("failure")
                        return
                    published = subprocess.run([BENCHSEAL, "publish", "--pending", "--json", "--db", str(db)],
                                               capture_output=True, text=True, env=infra_env, check=False,
                                               timeout=300)
                    (logs / "publish.log").write_text(published.stdout + published.stderr)
                    handle.complete("success" if state == "SUCCEEDED" and published.returncode == 0 else "failure")

                emu.on_dispatch(benchmark_job)
                from pipeline.core.contracts import DigestsFile
                from pipeline.dispatch.dispatch import build_payload

                payload = build_payload(DigestsFile.model_validate(digests), correlation_id=CORRELATION, tag=TAG,
                                        repository=SOURCE)
                error: BaseException | None = None
                result = None
                try:
                    result = dispatch_and_wait(gh, INFRA, payload, workflow=None, timeout_s=1200,
                                               poll=PollConfig(attempts=120, interval_s=1.0, skew_s=5.0))
                except BaseException as exc:  # reported after the job thread finished
                    error = exc
                emu.wait_callbacks(timeout=1200)
                worker_log = (logs / "worker.log").read_text(errors="replace") if (logs / "worker.log").exists() else ""
                assert emu.callback_errors == [], (emu.callback_errors, worker_log[-3000:])
                if error is not None:
                    raise error
                from pipeline.core.contracts import run_id_for
                from pipeline.infra.queue.sql import SqliteQueue

                with SqliteQueue(db) as queue:
                    record = queue.get_run(run_id_for(CORRELATION))
                    artifacts = queue.run_dir(record.run_id) / "artifacts"
                downloaded = root / "downloaded"
                downloaded.mkdir()
                for asset in emu.release(SOURCE, TAG).assets:
                    url = f"{emu.origin}/{SOURCE}/releases/download/{TAG}/{asset.name}"
                    (downloaded / asset.name).write_bytes(requests.get(url, timeout=30).content)
                assert emu.violations == [], emu.violations
        # Everything this run wrote (the Docker configs, which hold the logins by design, excepted).
        outputs = [home, logs, downloaded, lock, digests_path, registry.log_path, policy]
        yield World(registry.address, prefix, secrets, server.tokens, server, registry, digests, home, outputs,
                    scanner, states[0] if states else "none", record.grading.score if record.grading else None,
                    artifacts, downloaded, result, built.stderr, plain_before)
    finally:
        sigstore_local.stop(home / "sigstore")  # the instance the worker started, by its pid
        patch.undo()
        authregistry.stop(registry)
        server.stop()


def test_release_is_produced_and_verifies(world: World) -> None:
    from pipeline.local.release import run_commands
    from pipeline.verify.external import cosign_commands, local_benchseal
    from pipeline.verify.release import verify_release

    assert world.state == "SUCCEEDED" and world.score == 1.0, world.state
    assert world.dispatch.conclusion == "success"
    trusted_root = world.home / "sigstore" / "trusted_root.json"
    files = {p.name: p.read_bytes() for p in world.artifacts.iterdir() if p.is_file()}
    assert {p.name: p.read_bytes() for p in world.downloaded.iterdir()} == files
    done = verify_release(world.downloaded, repository=SOURCE, tag=TAG, trusted_root=trusted_root, offline=True)
    assert (done.repository, done.tag, done.commit) == (SOURCE, TAG, world.digests["source"]["commit"])
    commands = cosign_commands(world.downloaded, repository=SOURCE, tag=TAG, trusted_root=trusted_root,
                               benchseal=local_benchseal())
    assert len(run_commands(commands, world.downloaded)) >= 8


def test_every_image_has_the_configured_name_in_the_auth_registry(world: World) -> None:
    from pipeline.core.digests import parse_ref

    assert world.prefix == f"{world.address}/acme/benchseal-"
    for role, entry in world.digests["images"].items():
        assert entry["name"] == world.prefix + role and parse_ref(entry["ref"]).registry == world.address
    lock = json.loads(Path(world.outputs[3]).read_text())["images"]
    assert {name: e["name"] for name, e in lock.items()} == {
        "base": world.prefix + "base", "runner-base": world.prefix + "runner-base"}
    summary = json.loads((world.artifacts / "summary.json").read_text())
    assert {role: summary["images"][role]["ref"] for role in ("runner", "api")} == {
        role: world.digests["images"][role]["ref"] for role in ("runner", "api")}
    # The SBOMs were read from the auth registry and name the images there.
    for role in ("runner", "api"):
        sbom = (world.artifacts / f"sbom-{role}.cdx.json").read_text()
        assert world.digests["images"][role]["digest"] in sbom and world.prefix + role in sbom
    # The worker pulled what it ran, as the pull-only identity: the engine holds the runner
    # under exactly the configured name and digest.
    import docker

    client = docker.from_env()
    try:
        runner = client.images.get(world.digests["images"]["runner"]["ref"])
        assert world.digests["images"]["runner"]["ref"] in runner.attrs["RepoDigests"]
    finally:
        client.close()
    subjects = {issued.subject for issued in world.token_server.issued}
    assert subjects == {"ci", "infra"}, subjects
    pulls = [i for i in world.token_server.issued if i.subject == "infra"]
    assert pulls and all(actions == ("pull",) for i in pulls for _, actions in i.granted)


def test_no_unauthenticated_registry_was_used(world: World) -> None:
    # Nothing of this run names the plain registry, and it received no request for these repositories.
    for path in _files(world.outputs):
        assert not PLAIN_REGISTRY_RE.search(path.read_bytes()), path
    log = _plain_registry_log()
    if log.is_file():
        with log.open("rb") as handle:
            handle.seek(world.plain_log_before)
            assert b"acme/benchseal-" not in handle.read()
    # The auth registry served every repository, and refused anonymous access.
    answer = requests.get(f"http://{world.address}/v2/acme/benchseal-runner/manifests/"
                          f"{world.digests['images']['runner']['digest']}", timeout=10)
    assert answer.status_code == 401 and "Bearer" in answer.headers.get("WWW-Authenticate", "")


def test_no_credential_in_argv_environ_containers_or_outputs(world: World) -> None:
    assert world.tokens, "the token server issued no token: the registry was not the one used"
    assert world.scanner.proc_scans > 50 and world.scanner.container_scans > 5, vars(world.scanner)
    assert world.scanner.hits == [], world.scanner.hits
    # This run's runner container itself was among those inspected while it existed (other workers' runners
    # share the sandbox engine: seeing one of theirs proves nothing).
    from pipeline.core.contracts import run_id_for

    assert run_id_for(CORRELATION) in world.scanner.runner_runs, "the scan never saw the runner container"
    needles = [s.encode() for s in [*world.secrets, *world.tokens]]
    for path in _files(world.outputs):
        data = path.read_bytes()
        assert not any(n in data for n in needles), f"a credential leaked into {path}"
    assert not any(n in world.build_stderr.encode() for n in needles)


def _files(roots: list[Path]) -> list[Path]:
    found: list[Path] = []
    for root in roots:
        if root.is_file():
            found.append(root)
        elif root.is_dir():
            found += [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    return found
