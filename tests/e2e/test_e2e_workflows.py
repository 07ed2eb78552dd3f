"""The adoption path end to end: two scratch repositories call benchseal's reusable workflows of
this checkout, run by the Actions harness (tests/workflows/harness.py).

* **benchseal** ``benchseal/benchseal``: a snapshot of this working tree plus the base lock of the
  test registry (what benchseal's maintainers commit), at commit ``B``. Nobody forks it: the
  callers name ``benchseal/benchseal/.github/workflows/<file>@B``, which the harness maps to
  that snapshot.
* **The adopter** ``acme/widget``: only examples/hello-agent (its code, its benchseal.toml) and
  the example caller workflow with ``BENCHSEAL_COMMIT`` replaced by ``B``, tagged v0.1.0.
* **The infra repository** ``acme/bench-infra``: only examples/bench-infra (its policy, pinning
  the builder ``release.yml@B`` for acme/widget), a copy of suites/smoke and its caller.

A pushed tag runs the adopter's caller: benchseal's release.yml builds the runner with the
adopter's own agent (a wheel built from the tag's commit), pushes under the adopter's prefix with
the bases of benchseal's lock, signs as ``release.yml@B``, dispatches; the emulated GitHub starts
the infra caller, whose benchseal benchmark.yml accepts through the sudo-admitted wrappers,
waits while the worker service (the deploy unit's command: real Harbor trials of the adopter's
agent against the scripted model) grades, and seals as ``benchmark.yml@B`` for the infra
repository. The consumer runs the body's commands exactly as printed (real cosign and
benchseal), pinning builder and source separately. A Switchboard-style dispatch of the caller to
an infra that refuses the agent is not promoted, and a copy of release.yml with one output name
misspelt fails the reference check the other runs pass.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.digests import parse_ref
from pipeline.core.documents import BASE_LOCK_SCHEMA, base_lock_path
from pipeline.imaging.names import ImageNames
from tests.registry.helpers import free_port
from tests.workflows.harness import Runner, RunResult, Trigger, references, run_workflow

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
EXAMPLES = REPO_ROOT / "examples"
BENCHSEAL = "benchseal/benchseal"
SOURCE = "acme/widget"
INFRA = "acme/bench-infra"
TAG = "v0.1.0"  # examples/hello-agent's version
CALLER = ".github/workflows/release.yml"
INFRA_CALLER = ".github/workflows/benchmark.yml"
PLACEHOLDER = "BENCHSEAL_COMMIT"
NOTES = "## What's new\n\n* faster widgets\n"
VENV_BIN = Path(sys.executable).parent
GIT_ENV = {"GIT_AUTHOR_NAME": "benchseal tests", "GIT_AUTHOR_EMAIL": "tests@benchseal.invalid",
           "GIT_COMMITTER_NAME": "benchseal tests", "GIT_COMMITTER_EMAIL": "tests@benchseal.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
RELEASE_JOBS = ("builder", "build", "attest", "resolve_images", "dispatch_infra", "promote_marker", "attach_result",
                "hold_back", "summarize")
SKIPPED_ON_SUCCESS = ("hold_back",)


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False, timeout=120,
                          env={**os.environ, **GIT_ENV})
    if done.returncode != 0:
        raise AssertionError(f"git {args}: {done.stderr}")
    return done.stdout.strip()


def _snapshot(dest: Path) -> str:
    """benchseal as a repository whose one commit is this working tree (tracked and new files)."""
    _git(REPO_ROOT.parent, "clone", "--quiet", "--no-hardlinks", str(REPO_ROOT), str(dest))
    listed = _git(REPO_ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for name in filter(None, listed):
        if name.split("/")[0] in (".benchseal", ".venv", "node_modules"):
            continue
        src, dst = REPO_ROOT / name, dest / name
        if not src.exists() and not src.is_symlink():
            (dst.unlink() if dst.exists() else None)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    _git(dest, "add", "-A")
    _git(dest, "commit", "--quiet", "--allow-empty", "-m", "the working tree under test")
    return _git(dest, "rev-parse", "HEAD")


def _commit_base_lock(builder: Path, registry: str, base_refs: Any) -> str:
    """What benchseal's maintainers commit (docs/build.md): the lock of the bases they published,
    here under the test registry's benchseal/ prefix; adopters release under their own prefix."""
    local = json.loads(base_lock_path().read_text())["images"]
    entries = {name: local[name] for name in base_refs}
    for name, ref in base_refs.items():
        assert entries[name]["ref"] == ref.ref and ref.name == ImageNames.for_registry(registry).name(name)
    (builder / "images" / "base.production.lock.json").write_text(
        json.dumps({"schema": BASE_LOCK_SCHEMA, "images": entries}, indent=2, sort_keys=True) + "\n")
    _git(builder, "commit", "--quiet", "-am", "the base lock of the published bases")
    return _git(builder, "rev-parse", "HEAD")


def _new_repository(path: Path, files: dict[str, Path | str]) -> str:
    """A repository holding exactly ``files`` (relative path -> source file or text), one commit."""
    path.mkdir(parents=True)
    _git(path, "init", "--quiet", "-b", "main")
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copy2(content, target)
        else:
            target.write_text(content)
    _git(path, "add", "-A")
    _git(path, "commit", "--quiet", "-m", "initial")
    return _git(path, "rev-parse", "HEAD")


def _tree(root: Path, prefix: str = "") -> dict[str, Path | str]:
    return {prefix + str(p.relative_to(root)): p for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def _pinned(path: Path, commit: str) -> str:
    text = path.read_text()
    assert text.count(PLACEHOLDER) >= 1, path
    return text.replace(PLACEHOLDER, commit)


def _adopter(path: Path, builder_commit: str) -> str:
    """examples/hello-agent as its own repository: its code, its project file, the caller."""
    files = _tree(EXAMPLES / "hello-agent")
    files[CALLER] = _pinned(EXAMPLES / "hello-agent" / CALLER, builder_commit)
    commit = _new_repository(path, files)
    _git(path, "tag", TAG)
    assert sorted({name.split("/")[0] for name in files}) == [".github", "README.md", "benchseal.toml",
                                                             "hello_agent", "pyproject.toml"]
    return commit


def _infra(path: Path, builder_commit: str, registry: str, model_port: int, *, refusing: bool = False) -> str:
    """examples/bench-infra as its own repository, its policy naming the test registry and the
    scripted model's port; ``refusing``: a policy that does not admit the adopter's agent."""
    policy = _pinned(EXAMPLES / "bench-infra" / "policies" / "infra.yaml", builder_commit)
    policy = policy.replace("registry: ghcr.io", f"registry: {registry}")
    policy = policy.replace("http://127.0.0.1:18431/v1", f"http://127.0.0.1:{model_port}/v1")
    if refusing:
        admitted = policy
        policy = re.sub(r"  - name: hello-agent\n(    .*\n)+", "", policy)
        assert policy != admitted, "examples/bench-infra/policies/infra.yaml no longer lists hello-agent"
    files: dict[str, Path | str] = {"README.md": EXAMPLES / "bench-infra" / "README.md",
                                    "policies/infra.yaml": policy,
                                    INFRA_CALLER: _pinned(EXAMPLES / "bench-infra" / INFRA_CALLER, builder_commit)}
    files.update(_tree(REPO_ROOT / "suites" / "smoke", "suites/smoke/"))
    return _new_repository(path, files)


@dataclass
class World:
    emulator: Any
    builder: Path
    builder_commit: str
    adopter: Path
    commit: str
    registry: str
    infra_home: Path
    root: Path
    infra_repos: dict[str, Path]
    sigstore: Any
    infra_mode: str = "accepting"
    published: bool = False
    infra_runs: list[tuple[str, RunResult]] = field(default_factory=list)
    switchboard_runs: list[RunResult] = field(default_factory=list)
    events: list[tuple[str, int]] = field(default_factory=list)  # (what, emulator request count)
    caller_override: dict[str, Path] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return f"{self.registry}/acme/widget-"

    def use_infra(self, mode: str) -> None:
        """Which infra repository answers the next dispatch (its main is what the caller runs on)."""
        self.infra_mode = mode
        self.emulator.set_ref(INFRA, "refs/heads/main", _git(self.infra_repos[mode], "rev-parse", "HEAD"))

    def trigger(self, **fields: Any) -> Trigger:
        # The dispatch token as docs/github.md says: fine-grained, the infra repository, Actions: write.
        dispatch_token = self.emulator.add_token([INFRA], {"actions": "write"})
        return Trigger(token=self.emulator.token, api_url=self.emulator.base_url, server_url=self.emulator.origin,
                       vars={"BENCHSEAL_INFRA_REPOSITORY": INFRA, "BENCHSEAL_IMAGE_PREFIX": self.prefix,
                             "BENCHSEAL_SIGSTORE_URL": self.sigstore.url,
                             "BENCHSEAL_TRUSTED_ROOT": str(self.sigstore.trusted_root)},
                       secrets={"BENCHSEAL_INFRA_DISPATCH_TOKEN": dispatch_token}, **fields)

    def release_runner(self, name: str) -> Runner:
        # A hosted runner of the adopter; BENCHSEAL_HOME: the shared build caches. Each job's
        # GITHUB_TOKEN has exactly the job's (capped) permissions; ghcr.io stands for the test registry.
        from pipeline.core import paths
        from tests.workflows.harness import local_issuer

        def job_token(repository: str, permissions: dict[str, str]) -> str:
            return str(self.emulator.add_token([repository], permissions, kind="github-token"))

        return Runner(root=self.root / name, source=self.adopter, repositories={BENCHSEAL: self.builder},
                      env={"BENCHSEAL_HOME": str(paths.home())}, oidc=local_issuer(self.sigstore),
                      github_token=job_token, ghcr=(self.registry, "e2e-ghcr", "e2e-ghcr-password"))

    def caller(self) -> Path:
        return self.caller_override.get("path", self.adopter / CALLER)


def _service(unit: str, home: Path, log: Path, env_file: dict[str, str], policy: Path,
             extra: tuple[str, ...] = (), options: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A deploy/ unit's ExecStart and Environment= on this machine: /opt/benchseal -> this
    checkout and venv, /var/lib/benchseal -> ``home``, /etc/benchseal/infra.yaml -> ``policy``,
    ``env_file`` the unit's EnvironmentFile; ``extra`` arguments appended, ``options`` replaced."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    text = (REPO_ROOT / "deploy" / unit).read_text()
    parser.read_string(text)
    argv = shlex.split(parser["Service"]["ExecStart"].replace("/opt/benchseal/.venv/bin/", f"{VENV_BIN}/"))
    for option, value in (options or {}).items():
        argv[argv.index(option) + 1] = value
    argv += list(extra)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "GH_"))}
    for line in text.splitlines():
        if line.startswith("Environment="):
            key, _, value = line.removeprefix("Environment=").partition("=")
            env[key] = value.replace("/var/lib/benchseal", str(home)).replace("/etc/benchseal/infra.yaml", str(policy))
    env.update(env_file)
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, image_registry: str, base_refs: object,
          sigstore_instance: Any) -> Iterator[World]:
    from pipeline.dispatch.client import make_client
    from pipeline.local.model_server import ModelServer
    from tests.doubles.github import GitHubEmulator

    root = tmp_path_factory.mktemp("workflows-e2e")
    builder = root / "benchseal"
    _snapshot(builder)
    builder_commit = _commit_base_lock(builder, image_registry, base_refs)
    adopter = root / "widget"
    commit = _adopter(adopter, builder_commit)
    model_port = free_port()
    infra_repos = {"accepting": root / "bench-infra", "refusing": root / "bench-infra-refusing"}
    for mode, path in infra_repos.items():
        _infra(path, builder_commit, image_registry, model_port, refusing=mode == "refusing")
    infra_home = root / "infra-home"
    infra_home.mkdir()
    (infra_home / "tmp").mkdir()  # the worker unit's TMPDIR, which benchseal host install makes
    from pipeline.core import paths
    from pipeline.local import sigstore as sigstore_local

    if (paths.home() / "tools").is_dir():  # cosign, installed by make setup
        (infra_home / "tools").symlink_to(paths.home() / "tools", target_is_directory=True)
    # The model's real key lives only in the worker's environment (its EnvironmentFile).
    model_key = "bs-" + secrets.token_urlsafe(32)
    services: list[subprocess.Popen[bytes]] = []
    try:
        with GitHubEmulator() as emu, ModelServer(key=model_key, suite="smoke", mode="right", port=model_port):
            # The infra host's services, as their units run them, with the infra repository's policy
            # and suites (what the operator installs): the worker grades and signs nothing.
            policy = infra_repos["accepting"] / "policies" / "infra.yaml"
            services.append(_service("benchseal-worker.service", infra_home, root / "worker.log",
                                     {"GITHUB_API_URL": emu.base_url, "BENCHSEAL_SIGSTORE_URL": sigstore_instance.url,
                                      "BENCHSEAL_TRUSTED_ROOT": str(sigstore_instance.trusted_root),
                                      "BENCHSEAL_AGENT_API_KEY": model_key}, policy,
                                     extra=("--suites-dir", str(infra_repos["accepting"] / "suites"))))
            services.append(_service("benchseal-publisher.service", infra_home, root / "publisher.log",
                                     {"GITHUB_TOKEN": emu.token, "GITHUB_API_URL": emu.base_url}, policy,
                                     options={"--interval": "1"}))
            emu.add_repo(SOURCE)
            emu.add_repo(INFRA)
            emu.set_ref(SOURCE, f"refs/tags/{TAG}", commit)
            emu.set_ref(SOURCE, "refs/heads/main", commit)
            make_client(base_url=emu.base_url, token=emu.token).get_repo(SOURCE).create_git_release(
                tag=TAG, name=TAG, message=NOTES)
            emu.add_workflow(INFRA, INFRA_CALLER, (infra_repos["accepting"] / INFRA_CALLER).read_text())
            emu.add_workflow(SOURCE, CALLER, (adopter / CALLER).read_text())
            world = World(emu, builder, builder_commit, adopter, commit, image_registry, infra_home, root,
                          infra_repos, sigstore_instance)
            emu.on_dispatch(lambda handle, event: _on_dispatch(world, handle, event))
            yield world
            emu.wait_callbacks(timeout=60)
            assert emu.callback_errors == [], emu.callback_errors
            assert emu.violations == [], emu.violations
    finally:
        for service in services:
            _stop(service)
        sigstore_local.stop(infra_home / "sigstore")  # the instance the worker service started, by its pid


def _on_dispatch(world: World, handle: Any, event: Any) -> None:
    """What GitHub does on a dispatch: run the workflow it names, conclude the run with its result."""
    emu = world.emulator
    handle.start()
    if event.repo == INFRA:
        mode = world.infra_mode
        from tests.workflows.harness import local_issuer

        # The infra repository's variables name the private instance (production: none, public-good);
        # its publish token may write the source repository's releases.
        infra = world.infra_repos[mode]
        trigger = Trigger(event_name=event.kind, repository=INFRA, sha=handle.run.head_sha, ref="refs/heads/main",
                          event={"action": event.event_type, "client_payload": dict(event.client_payload or {})},
                          inputs=dict(event.inputs or {}), token=emu.token, api_url=emu.base_url,
                          server_url=emu.origin,
                          vars={"BENCHSEAL_SIGSTORE_URL": world.sigstore.url,
                                "BENCHSEAL_TRUSTED_ROOT": str(world.sigstore.trusted_root)},
                          secrets={"BENCHSEAL_PUBLISH_TOKEN": emu.token})
        runner = Runner(root=world.root / f"infra-{handle.run_id}", source=infra,
                        repositories={BENCHSEAL: world.builder}, sudo_home=world.infra_home,
                        oidc=local_issuer(world.sigstore))
        result = run_workflow(infra / INFRA_CALLER, trigger, runner)
        world.infra_runs.append((mode, result))
    elif event.repo == SOURCE and event.workflow_path == CALLER:
        trigger = world.trigger(event_name="workflow_dispatch", repository=SOURCE, sha=handle.run.head_sha,
                                ref="refs/heads/main", inputs=dict(event.inputs or {}))
        result = run_workflow(world.caller(), trigger, world.release_runner(f"release-{handle.run_id}"))
        world.switchboard_runs.append(result)
    else:
        raise AssertionError(f"no workflow for {event}")
    handle.complete(result.conclusion)
    world.events.append((f"completed {event.repo} {result.conclusion}", len(emu.requests)))


def called(run: RunResult, caller: str = "release") -> dict[str, str]:
    """The results of the called workflow's jobs, by their own names."""
    prefix = f"{caller}/"
    return {job.removeprefix(prefix): r.result for job, r in run.jobs.items() if job.startswith(prefix)}


def assert_every_reference_resolved(run: RunResult, workflow: Path, caller: str = "release") -> None:
    """Every steps.*.outputs.* / needs.*.outputs.* reference that was evaluated got a value its
    step or job actually wrote, and every one in the (called) file was evaluated at least once."""
    assert run.unresolved == [], f"references to outputs never written: {run.unresolved}"
    evaluated = {ref.split(": ", 1)[1] for ref, _ in run.references}
    skipped_jobs = {j.removeprefix(f"{caller}/") for j, r in run.jobs.items() if r.result == "skipped"}
    expected = set(references(workflow))
    assert expected, workflow
    missing = {ref for ref in expected if ref not in evaluated}
    # A reference only in a skipped job is never evaluated (promote_marker after a failure).
    text = workflow.read_text()
    missing = {ref for ref in missing if not all(_job_of(text, i) in skipped_jobs for i in _positions(text, ref))}
    assert missing == set(), f"references never evaluated: {sorted(missing)}"


def _positions(text: str, needle: str) -> list[int]:
    found, start = [], 0
    while (index := text.find(needle, start)) >= 0:
        found.append(index)
        start = index + 1
    return found


def _job_of(text: str, index: int) -> str:
    jobs = [(m.start(), m.group(1)) for m in re.finditer(r"^  ([A-Za-z_][A-Za-z0-9_-]*):\s*$", text, re.M)]
    return next((name for start, name in reversed(jobs) if start < index), "")


def _queued_payload(home: Path, run_id: str) -> dict[str, Any]:
    from pipeline.infra.queue.sql import SqliteQueue

    with SqliteQueue(home / "infra" / "queue.sqlite3") as queue:
        record = queue.get_run(run_id)
        return {"state": record.state, "payload": record.payload.model_dump(mode="json")}


def _describe(world: World, run: RunResult) -> str:
    infra = "\n".join(f"### infra run ({mode})\n{r.describe()}" for mode, r in world.infra_runs)
    logs = "".join(f"\n### {name}\n" + (world.root / name).read_text(errors="replace")[-3000:]
                   for name in ("worker.log", "publisher.log") if (world.root / name).exists())
    return f"{run.describe()}\n{infra}{logs}"


def _builder(world: World, workflow: str) -> str:
    return f"{BENCHSEAL}/.github/workflows/{workflow}@{world.builder_commit}"


# The whole chain of three repositories' workflows, a benchmark run and its seal: about 6 min alone, and it ran
# past the suite's 900 s with the hostile corpus and the newcomer's releases on the other workers (2-core machine).
@pytest.mark.timeout(1800)
def test_adopter_release_runs_every_job_and_promotes_after_the_benchmark(world: World) -> None:
    from pipeline.attest.images import SigstoreEndpoints, image_identity, verify_image
    from pipeline.core.errors import CheckFailed

    emu = world.emulator
    world.use_infra("accepting")
    infra_before, checks_before = len(world.infra_runs), set(emu.repo(SOURCE).check_runs)
    trigger = world.trigger(event_name="push", repository=SOURCE, sha=world.commit, ref=f"refs/tags/{TAG}",
                            event={"ref": f"refs/tags/{TAG}", "after": world.commit,
                                   "repository": {"full_name": SOURCE}})
    run = run_workflow(world.adopter / CALLER, trigger, world.release_runner("tag"))
    emu.wait_callbacks(timeout=60)
    assert run.jobs["release"].result == "success", _describe(world, run)
    assert called(run) == {job: "skipped" if job in SKIPPED_ON_SUCCESS else "success" for job in RELEASE_JOBS}, \
        _describe(world, run)
    assert_every_reference_resolved(run, WORKFLOWS / "release.yml")
    assert run.secret_leaks == []

    # The infra caller ran benchseal's benchmark.yml: validate against its own policy, accept, wait, seal.
    ((mode, infra),) = world.infra_runs[infra_before:]
    assert mode == "accepting" and infra.conclusion == "success", infra.describe()
    assert called(infra, "benchmark") == dict.fromkeys(("builder", "accept", "wait", "seal"), "success")
    assert_every_reference_resolved(infra, WORKFLOWS / "benchmark.yml", "benchmark")
    assert infra.secret_leaks == []
    run_id = infra.jobs["benchmark"].outputs["run_id"]
    queued = _queued_payload(world.infra_home, run_id)
    assert queued["state"] == "SUCCEEDED"
    # The adopter's own agent, built from the tag's commit, is what was scored.
    assert queued["payload"]["agent"] == "hello-agent"
    assert queued["payload"]["agent_artifact"]["source_commit"] == world.commit

    # What was dispatched is what was built, under the adopter's prefix, signed by the builder
    # for this repository, tag and commit; the adopter's own workflow identity is refused.
    merged = json.loads((run.run_dir / "artifacts" / "benchseal-digests-merged" / "digests.json").read_text())  # type: ignore[operator]
    assert merged["source"]["commit"] == world.commit and merged["source"]["repository"] == SOURCE
    endpoints = SigstoreEndpoints.private(world.sigstore.url, world.sigstore.trusted_root)
    for role in ("runner", "api"):
        ref = merged["images"][role]["ref"]
        parse_ref(ref)  # the one validator
        assert ref.startswith(f"{world.prefix}{role}@sha256:")
        verify_image(ref, image_identity(SOURCE, TAG, world.commit, builder=_builder(world, "release.yml")),
                     endpoints, allow_http_registry=True)
        with pytest.raises(CheckFailed):
            verify_image(ref, image_identity(SOURCE, TAG, world.commit), endpoints, allow_http_registry=True)
        assert queued["payload"][role] == ref
        assert f"- {role}: `{ref}`" in run.summary
        assert run.jobs["release"].outputs[f"{role}_ref"] == ref
    assert f"Built by `{BENCHSEAL}@{world.builder_commit}`" in run.summary
    assert f"correlation `{queued['payload']['correlation_id']}`" in run.summary
    assert "| promote_marker | success |" in run.summary and "Not promoted" not in run.summary

    # Promotion: the check run on the released commit, created after the infra run concluded success.
    (check,) = [c for i, c in emu.repo(SOURCE).check_runs.items() if i not in checks_before]
    assert check.head_sha == world.commit and check.conclusion == "success"
    assert check.details_url == run.jobs["release"].outputs["infra_run_url"]
    completed = next(count for what, count in world.events if what == f"completed {INFRA} success")
    posted = [i for i, r in enumerate(emu.requests) if r.operation == "checks/create" and r.status == 201]
    assert posted and posted[0] >= completed

    # The worker service only graded: no signature on the infra host.
    from pipeline.infra.queue.sql import SqliteQueue

    with SqliteQueue(world.infra_home / "infra" / "queue.sqlite3") as queue:
        host_run = queue.run_dir(run_id)
    assert (host_run / "grading.json").is_file()
    assert list(host_run.rglob("*.sigstore.json")) == [], "the worker service signed something"

    release = world.emulator.release(SOURCE, TAG)
    names = {a.name for a in release.assets}
    assert {"summary.json", "SHA256SUMS", "SHA256SUMS.sigstore.json"} <= names, names
    summary_json = json.loads(next(a for a in release.assets if a.name == "summary.json").data)
    assert summary_json["score"] == 1.0, summary_json
    assert release.body.startswith(NOTES) and "benchseal:start" in release.body
    world.published = True


def _printed_commands(body: str) -> list[str]:
    """The consumer's commands, as the release body's benchseal section prints them."""
    from pipeline.publish.body import extract

    section = extract(body)
    assert section is not None, body
    return section.split("```sh\n", 1)[1].split("\n```", 1)[0].splitlines()


def _download(world: World, dest: Path) -> Path:
    import requests

    dest.mkdir(parents=True)
    for asset in world.emulator.release(SOURCE, TAG).assets:
        url = f"{world.emulator.origin}/{SOURCE}/releases/download/{TAG}/{asset.name}"
        (dest / asset.name).write_bytes(requests.get(url, timeout=30).content)
    return dest


def test_consumer_runs_the_body_commands_as_printed(world: World, tmp_path: Path, cosign_bin: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The body pins the builder (benchseal at B) and the sources (the infra repository's main for the
    evidence; the adopter's repository, tag and commit for the images) separately; a consumer runs
    it exactly as printed with the real cosign and benchseal."""
    from pipeline.core.errors import CheckFailed
    from pipeline.local.release import run_commands
    from pipeline.verify.release import verify_release

    if not world.published:
        test_adopter_release_runs_every_job_and_promotes_after_the_benchmark(world)
    commands = _printed_commands(world.emulator.release(SOURCE, TAG).body)
    evidence_identity = f"https://github.com/{_builder(world, 'benchmark.yml')}"
    assert commands[0] == "sha256sum -c SHA256SUMS"
    blob_lines = [c for c in commands if c.startswith("cosign verify-blob ")]
    assert blob_lines
    for line in blob_lines:
        assert f"--certificate-identity {evidence_identity} " in line, line
        assert f"--certificate-github-workflow-repository {INFRA}" in line, line
        assert "--certificate-github-workflow-ref refs/heads/main" in line, line
    pin = f"--builder {BENCHSEAL}@{world.builder_commit}"
    [verify_line] = [c for c in commands if c.startswith("benchseal verify ")]
    assert f"--repo {SOURCE} --tag {TAG} --infra-repo {INFRA}" in verify_line and pin in verify_line
    # A consumer's shell: their cosign and benchseal on PATH.
    monkeypatch.setenv("PATH", os.pathsep.join([str(cosign_bin.parent), str(VENV_BIN), os.environ["PATH"]]))
    release = _download(world, tmp_path / "release")
    assert run_commands(commands, release) == commands

    builder = f"{BENCHSEAL}@{world.builder_commit}"
    done = verify_release(release, repository=SOURCE, tag=TAG, infra_repository=INFRA, builder=builder,
                          trusted_root=world.sigstore.trusted_root, offline=True, profile="production")
    assert (done.identity, done.repository, done.tag, done.commit) == (evidence_identity, SOURCE, TAG, world.commit)
    # Another builder version, or the builder for another infra repository: refused.
    for kwargs in ({"builder": f"{BENCHSEAL}@{'0' * 40}", "infra_repository": INFRA},
                   {"builder": builder, "infra_repository": SOURCE}):
        with pytest.raises(CheckFailed):
            verify_release(release, repository=SOURCE, tag=TAG, trusted_root=world.sigstore.trusted_root,
                           offline=True, profile="production", **kwargs)

    # A tampered artifact fails the printed commands: first the checksum line, and with SHA256SUMS
    # rewritten to match, the signature over SHA256SUMS.
    import hashlib

    tampered = _download(world, tmp_path / "tampered")
    summary = json.loads((tampered / "summary.json").read_text())
    summary["score"] = 0.5
    (tampered / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(CheckFailed, match="sha256sum -c SHA256SUMS"):
        run_commands(commands, tampered)
    sums = (tampered / "SHA256SUMS").read_text().splitlines()
    digest = hashlib.sha256((tampered / "summary.json").read_bytes()).hexdigest()
    (tampered / "SHA256SUMS").write_text("".join(
        (f"{digest}  summary.json" if line.endswith("  summary.json") else line) + "\n" for line in sums))
    with pytest.raises(CheckFailed, match=r"cosign verify-blob .*SHA256SUMS"):
        run_commands(commands, tampered)


def _switchboard_release(world: World, correlation: str) -> tuple[RunResult, Any]:
    from pipeline.dispatch.client import make_client

    emu = world.emulator
    gh = make_client(base_url=emu.base_url, token=emu.token, backoff_factor=0.0)
    workflow = gh.get_repo(SOURCE).get_workflow("release.yml")
    before = len(world.switchboard_runs)
    assert workflow.create_dispatch(ref="main", inputs={"deploy_ref": TAG, "switchboard_correlation_id": correlation})
    emu.wait_callbacks(timeout=900)
    assert emu.callback_errors == [], emu.callback_errors
    (run,) = world.switchboard_runs[before:]
    # Switchboard finds its run by the run-name's last token.
    found = [r for r in emu.repo(SOURCE).runs.values() if r.display_title.endswith(" " + correlation)]
    assert len(found) == 1 and found[0].display_title == f"Release {TAG} {correlation}"
    return run, found[0]


def test_switchboard_release_refused_by_infra_is_not_promoted_and_says_why(world: World) -> None:
    world.use_infra("refusing")
    checks_before = len(world.emulator.repo(SOURCE).check_runs)
    run, emulated = _switchboard_release(world, "sb-refused-0001")
    assert called(run) == {"builder": "success", "build": "success", "attest": "success", "resolve_images": "success",
                           "dispatch_infra": "failure", "promote_marker": "skipped", "attach_result": "skipped",
                           "hold_back": "success", "summarize": "success"}, run.describe()
    assert run.jobs["release"].result == "failure" and emulated.conclusion == "failure"
    # Nothing promoted: the one new check run is hold_back's failure (nothing was published to name a gate).
    new_checks = list(world.emulator.repo(SOURCE).check_runs.values())[checks_before:]
    assert [(c.name, c.conclusion, c.output.get("title")) for c in new_checks] == [
        ("benchseal/benchmark", "failure", "benchmark did not succeed")]
    assert_every_reference_resolved(run, WORKFLOWS / "release.yml")
    mode, infra = world.infra_runs[-1]
    assert mode == "refusing"
    assert called(infra, "benchmark") == {"builder": "success", "accept": "failure", "wait": "skipped",
                                          "seal": "skipped"}, infra.describe()  # nothing accepted, nothing signed
    accept_log = infra.jobs["benchmark/accept"].log
    assert "agent" in accept_log and "hello-agent" in accept_log
    # The summary says what happened and why, and names the refs that were resolved.
    summary = run.summary
    assert "| dispatch_infra | failure |" in summary and "| promote_marker | skipped |" in summary
    assert "Not promoted: dispatch_infra ended `failure`." in summary
    error = run.jobs["release/dispatch_infra"].outputs["error"]
    assert error and error in summary and "failure" in error
    merged = json.loads((run.run_dir / "artifacts" / "benchseal-digests-merged" / "digests.json").read_text())  # type: ignore[operator]
    for role in ("runner", "api"):
        assert f"- {role}: `{merged['images'][role]['ref']}`" in summary


def test_a_broken_output_name_fails_the_reference_check(world: World, tmp_path: Path) -> None:
    """The check the tests above pass, on benchseal's release.yml with one output name misspelt where
    the summary reads it (committed to the builder repository, the caller pinned to that commit):
    the run itself goes green, the check does not."""
    original = (WORKFLOWS / "release.yml").read_text()
    broken = original.replace("RESOLVED_RUNNER: ${{ needs.resolve_images.outputs.runner_ref }}",
                              "RESOLVED_RUNNER: ${{ needs.resolve_images.outputs.runner_reff }}")
    assert broken != original
    branch = world.root / "benchseal-broken"
    _git(world.root, "clone", "--quiet", str(world.builder), str(branch))
    (branch / ".github" / "workflows" / "release.yml").write_text(broken)
    _git(branch, "commit", "--quiet", "-am", "a misspelt output")
    broken_commit = _git(branch, "rev-parse", "HEAD")
    _git(world.builder, "fetch", "--quiet", str(branch), f"{broken_commit}:refs/heads/broken")
    caller = tmp_path / "release.yml"
    caller.write_text((world.adopter / CALLER).read_text().replace(world.builder_commit, broken_commit))
    world.use_infra("refusing")
    world.caller_override["path"] = caller
    try:
        run, _ = _switchboard_release(world, "sb-broken-0001")
    finally:
        world.caller_override.clear()
    assert run.jobs["release/summarize"].result == "success"
    assert run.unresolved == ["release/summarize: needs.resolve_images.outputs.runner_reff (never written)"]
    copy = tmp_path / "broken-release.yml"
    copy.write_text(broken)
    with pytest.raises(AssertionError, match="runner_reff"):
        assert_every_reference_resolved(run, copy)
