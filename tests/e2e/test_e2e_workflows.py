"""The real workflow files, run by the Actions harness (tests/workflows/harness.py), end to end.

* ``tag.yml`` for a pushed tag: build (matrix, real images into the test registry with the
  shared caches), resolve_images (resolve-ref against the GitHub emulator, merge-digests),
  dispatch_infra (``benchseal dispatch`` to the emulated infra repository), promote_marker
  (the ``gh`` CLI creates the check run), summarize.
* The emulated GitHub starts ``benchmark.yml`` for that dispatch; its jobs run in the harness
  on the "infra host": validate, accept through the sudo-admitted deploy/ wrappers, then
  wait (through the status wrapper) while the worker service (deploy/benchseal-worker.service's
  command, real Harbor trials in the digest-pinned runner image) grades the benchmark, signing
  nothing. The ``seal`` job (``id-token: write``) exports the graded run through the export
  wrapper, signs the evidence with the ambient identity the emulated Actions token endpoint
  serves (benchmark.yml of the infra repository on main, GitHub-shaped certificates from the
  private instance) and publishes it to the source release. The consumer then runs the
  commands the release body prints, exactly as printed, with the real cosign and benchseal,
  and verifies with the pinned infra identity. The run's conclusion is the harness's.
* ``runner-release.yml`` dispatched Switchboard-style (workflow_dispatch with deploy_ref and a
  correlation id, found again by its run-name) to an infra whose policy refuses the release:
  the infra run fails, promotion is skipped and the summary says why.
* A copy of runner-release.yml with one output name broken fails the reference check that
  every other test here passes.
"""

from __future__ import annotations

import configparser
import json
import os
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
from tests.workflows.harness import Runner, RunResult, Trigger, references, run_workflow

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
SOURCE = "acme/widget"
INFRA = "acme/bench-infra"
TAG = "v1.0.0"
NOTES = "## What's new\n\n* faster widgets\n"
VENV_BIN = Path(sys.executable).parent
GIT_ENV = {"GIT_AUTHOR_NAME": "benchseal tests", "GIT_AUTHOR_EMAIL": "tests@benchseal.invalid",
           "GIT_COMMITTER_NAME": "benchseal tests", "GIT_COMMITTER_EMAIL": "tests@benchseal.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False, timeout=120,
                          env={**os.environ, **GIT_ENV})
    if done.returncode != 0:
        raise AssertionError(f"git {args}: {done.stderr}")
    return done.stdout.strip()


def _snapshot(dest: Path) -> str:
    """A repository whose one commit is this working tree (tracked and new files): what the
    workflows check out is the code under test, committed or not."""
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


def _commit_base_lock(source: Path, registry: str, base_refs: Any) -> str:
    """What a maintainer does before a release (docs/build.md): the base lock for the registry the
    release pushes to, committed as images/base.production.lock.json (the build reads it frozen)."""
    local = json.loads(base_lock_path().read_text())["images"]
    entries = {name: local[name] for name in base_refs}
    for name, ref in base_refs.items():
        assert entries[name]["ref"] == ref.ref and ref.name == ImageNames.for_registry(registry).name(name)
    (source / "images" / "base.production.lock.json").write_text(
        json.dumps({"schema": BASE_LOCK_SCHEMA, "images": entries}, indent=2, sort_keys=True) + "\n")
    _git(source, "commit", "--quiet", "-am", "the base lock for the test registry")
    return _git(source, "rev-parse", "HEAD")


@dataclass
class World:
    emulator: Any
    source: Path
    commit: str
    registry: str
    infra_home: Path
    root: Path
    infra_sources: dict[str, Path]
    sigstore: Any  # the private instance: GitHub-shaped OIDC for the release jobs, the worker's image trust
    infra_mode: str = "accepting"
    published: bool = False
    infra_runs: list[tuple[str, RunResult]] = field(default_factory=list)
    switchboard_runs: list[RunResult] = field(default_factory=list)
    events: list[tuple[str, int]] = field(default_factory=list)  # (what, emulator request count)

    def use_infra(self, mode: str) -> None:
        """Which infra repository answers the next dispatch; the emulated repository's main
        branch is its commit (what benchmark.yml's checkout clones)."""
        self.infra_mode = mode
        self.emulator.set_ref(INFRA, "refs/heads/main", _git(self.infra_sources[mode], "rev-parse", "HEAD"))

    def trigger(self, **fields: Any) -> Trigger:
        # The dispatch token as docs/github.md says: fine-grained, the infra repository, Actions: write.
        dispatch_token = self.emulator.add_token([INFRA], {"actions": "write"})
        return Trigger(token=self.emulator.token, api_url=self.emulator.base_url, server_url=self.emulator.origin,
                       vars={"BENCHSEAL_INFRA_REPOSITORY": INFRA, "BENCHSEAL_IMAGE_PREFIX": f"{self.registry}/benchseal/",
                             # the build job signs with cosign against the private instance
                             "BENCHSEAL_SIGSTORE_URL": self.sigstore.url,
                             "BENCHSEAL_TRUSTED_ROOT": str(self.sigstore.trusted_root)},
                       secrets={"BENCHSEAL_INFRA_DISPATCH_TOKEN": dispatch_token}, **fields)

    def release_runner(self, name: str) -> Runner:
        # The release repository's hosted runner; BENCHSEAL_HOME: the shared build caches. Each job's
        # GITHUB_TOKEN has exactly the job's permissions; ghcr.io stands for the test registry.
        from pipeline.core import paths
        from tests.workflows.harness import local_issuer

        def job_token(repository: str, permissions: dict[str, str]) -> str:
            return str(self.emulator.add_token([repository], permissions, kind="github-token"))

        return Runner(root=self.root / name, source=self.source, env={"BENCHSEAL_HOME": str(paths.home())},
                      oidc=local_issuer(self.sigstore), github_token=job_token,
                      ghcr=(self.registry, "e2e-ghcr", "e2e-ghcr-password"))


def _service(unit: str, home: Path, log: Path, env_file: dict[str, str],
             options: dict[str, str]) -> subprocess.Popen[bytes]:
    """A deploy/ unit's ExecStart and Environment= on this machine: /opt/benchseal -> this
    checkout and venv, /var/lib/benchseal -> ``home``, ``env_file`` the unit's EnvironmentFile,
    ``options`` replaces option values (the signer: there is no Actions OIDC on this host)."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    text = (REPO_ROOT / "deploy" / unit).read_text()
    parser.read_string(text)
    argv = shlex.split(parser["Service"]["ExecStart"].replace("/opt/benchseal/.venv/bin/", f"{VENV_BIN}/"))
    for option, value in options.items():
        argv[argv.index(option) + 1] = value
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "GH_"))}
    for line in text.splitlines():
        if line.startswith("Environment="):
            key, _, value = line.removeprefix("Environment=").partition("=")
            env[key] = value.replace("/var/lib/benchseal", str(home)).replace(
                "/etc/benchseal/infra.yaml", str(REPO_ROOT / "policies" / "infra.yaml"))
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
    from tests.doubles.github import GitHubEmulator

    root = tmp_path_factory.mktemp("workflows-e2e")
    source = root / "source"
    _snapshot(source)
    commit = _commit_base_lock(source, image_registry, base_refs)
    _git(source, "tag", TAG)
    # The infra repository runs the same project; a second one has a policy that refuses the oracle agent.
    refusing = root / "infra-refusing"
    _git(root, "clone", "--quiet", str(source), str(refusing))
    policy = refusing / "policies" / "infra.yaml"
    refusing_text = policy.read_text().replace("agents:\n  - oracle\n", "agents:\n")
    assert refusing_text != policy.read_text(), "policies/infra.yaml no longer lists oracle first under agents"
    policy.write_text(refusing_text)
    _git(refusing, "commit", "--quiet", "-am", "refuse the oracle agent")
    infra_home = root / "infra-home"
    infra_home.mkdir()
    (infra_home / "tmp").mkdir()  # the worker unit's TMPDIR, which benchseal host install makes
    from pipeline.core import paths
    from pipeline.local import sigstore as sigstore_local

    if (paths.home() / "tools").is_dir():  # cosign, installed by make setup
        (infra_home / "tools").symlink_to(paths.home() / "tools", target_is_directory=True)
    services: list[subprocess.Popen[bytes]] = []
    try:
        with GitHubEmulator() as emu:
            # The infra host's services, exactly as their units run them: the worker grades and signs
            # nothing. It checks the images' signatures against the private instance the release jobs
            # signed with (its EnvironmentFile names it; production: public-good, nothing set).
            services.append(_service("benchseal-worker.service", infra_home, root / "worker.log",
                                     {"GITHUB_API_URL": emu.base_url, "BENCHSEAL_SIGSTORE_URL": sigstore_instance.url,
                                      "BENCHSEAL_TRUSTED_ROOT": str(sigstore_instance.trusted_root)}, {}))
            services.append(_service("benchseal-publisher.service", infra_home, root / "publisher.log",
                                     {"GITHUB_TOKEN": emu.token, "GITHUB_API_URL": emu.base_url},
                                     {"--interval": "1"}))
            emu.add_repo(SOURCE)
            emu.add_repo(INFRA)
            emu.set_ref(SOURCE, f"refs/tags/{TAG}", commit)
            emu.set_ref(SOURCE, "refs/heads/main", commit)
            make_client(base_url=emu.base_url, token=emu.token).get_repo(SOURCE).create_git_release(
                tag=TAG, name=TAG, message=NOTES)
            emu.add_workflow(INFRA, ".github/workflows/benchmark.yml", (WORKFLOWS / "benchmark.yml").read_text())
            emu.add_workflow(SOURCE, ".github/workflows/runner-release.yml",
                             (WORKFLOWS / "runner-release.yml").read_text())
            world = World(emu, source, commit, image_registry, infra_home, root,
                          {"accepting": source, "refusing": refusing}, sigstore_instance)
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
        trigger = Trigger(event_name=event.kind, repository=INFRA, sha=handle.run.head_sha, ref="refs/heads/main",
                          event={"action": event.event_type, "client_payload": dict(event.client_payload or {})},
                          inputs=dict(event.inputs or {}), token=emu.token, api_url=emu.base_url,
                          server_url=emu.origin,
                          vars={"BENCHSEAL_SIGSTORE_URL": world.sigstore.url,
                                "BENCHSEAL_TRUSTED_ROOT": str(world.sigstore.trusted_root)},
                          secrets={"BENCHSEAL_PUBLISH_TOKEN": emu.token})
        runner = Runner(root=world.root / f"infra-{handle.run_id}", source=world.infra_sources[mode],
                        sudo_home=world.infra_home, oidc=local_issuer(world.sigstore))
        result = run_workflow(WORKFLOWS / "benchmark.yml", trigger, runner)
        world.infra_runs.append((mode, result))
    elif event.workflow_path.endswith("runner-release.yml"):
        trigger = world.trigger(event_name="workflow_dispatch", repository=SOURCE, sha=handle.run.head_sha,
                                ref="refs/heads/main", inputs=dict(event.inputs or {}))
        result = run_workflow(_runner_release_path(world), trigger, world.release_runner(f"release-{handle.run_id}"))
        world.switchboard_runs.append(result)
    else:
        raise AssertionError(f"no workflow for {event}")
    handle.complete(result.conclusion)
    world.events.append((f"completed {event.repo} {result.conclusion}", len(emu.requests)))


_RUNNER_RELEASE_COPY: dict[str, Path] = {}


def _runner_release_path(world: World) -> Path:
    return _RUNNER_RELEASE_COPY.get("path", WORKFLOWS / "runner-release.yml")


def assert_every_reference_resolved(run: RunResult, workflow: Path) -> None:
    """Every steps.*.outputs.* / needs.*.outputs.* reference that was evaluated got a value its
    step or job actually wrote, and every one in the file was evaluated at least once."""
    assert run.unresolved == [], f"references to outputs never written: {run.unresolved}"
    evaluated = {ref.split(": ", 1)[1] for ref, _ in run.references}
    skipped_jobs = {j for j, r in run.jobs.items() if r.result == "skipped"}
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
    import re

    jobs = [(m.start(), m.group(1)) for m in re.finditer(r"^  ([A-Za-z_][A-Za-z0-9_-]*):\s*$", text, re.M)]
    return next((name for start, name in reversed(jobs) if start < index), "")


def _queued_payload(home: Path, run_id: str) -> dict[str, Any]:
    from pipeline.infra.queue.sql import SqliteQueue

    with SqliteQueue(home / "infra" / "queue.sqlite3") as queue:
        record = queue.get_run(run_id)
        return {"state": record.state, "payload": record.payload.model_dump(mode="json")}


def test_tag_release_runs_every_job_and_promotes_after_the_benchmark(world: World) -> None:
    emu = world.emulator
    world.use_infra("accepting")
    infra_before, checks_before = len(world.infra_runs), set(emu.repo(SOURCE).check_runs)
    trigger = world.trigger(event_name="push", repository=SOURCE, sha=world.commit, ref=f"refs/tags/{TAG}",
                            event={"ref": f"refs/tags/{TAG}", "after": world.commit,
                                   "repository": {"full_name": SOURCE}})
    run = run_workflow(WORKFLOWS / "tag.yml", trigger, world.release_runner("tag"))
    emu.wait_callbacks(timeout=60)
    results = {job: r.result for job, r in run.jobs.items()}
    assert results == {"build": "success", "resolve_images": "success", "dispatch_infra": "success",
                       "promote_marker": "success", "summarize": "success"}, _describe(world, run)
    assert_every_reference_resolved(run, WORKFLOWS / "tag.yml")
    assert run.secret_leaks == []

    # The infra side ran benchmark.yml in the harness: validate, accept via the wrapper, wait.
    ((mode, infra),) = world.infra_runs[infra_before:]
    assert mode == "accepting" and infra.conclusion == "success", infra.describe()
    assert {job: r.result for job, r in infra.jobs.items()} == {"accept": "success", "wait": "success",
                                                                 "seal": "success"}, infra.describe()
    assert_every_reference_resolved(infra, WORKFLOWS / "benchmark.yml")
    assert infra.secret_leaks == []
    run_id = infra.jobs["accept"].outputs["run_id"]
    queued = _queued_payload(world.infra_home, run_id)
    assert queued["state"] == "SUCCEEDED"
    assert "succeeded" in infra.jobs["wait"].log

    # What was dispatched is what was built, and the summary names exactly those refs.
    merged = json.loads((run.run_dir / "artifacts" / "tag-digests-merged" / "digests.json").read_text())  # type: ignore[operator]
    built = {role: merged["images"][role]["ref"] for role in ("runner", "api")}
    for role in ("runner", "api"):
        parse_ref(built[role])  # the one validator
        digests = [next(step for step in leg if step.id == "digest").outputs.get("digest", "-")
                   for leg in run.jobs["build"].legs]
        assert any(built[role].endswith(digest) for digest in digests), role
        # The build leg signed and attested exactly that digest as tag.yml at the tag (cosign).
        from pipeline.attest.images import SigstoreEndpoints, image_identity, verify_image

        verify_image(built[role], image_identity(SOURCE, TAG, world.commit),
                     SigstoreEndpoints.private(world.sigstore.url, world.sigstore.trusted_root),
                     allow_http_registry=True)
        assert queued["payload"][role] == built[role]
        assert f"- {role}: `{built[role]}`" in run.summary
        assert run.jobs["dispatch_infra"].outputs[f"{role}_ref"] == built[role]
    assert f"correlation `{queued['payload']['correlation_id']}`" in run.summary
    assert "| promote_marker | success |" in run.summary and "Not promoted" not in run.summary

    # Promotion: the check run on the released commit, created after the infra run concluded success.
    (check,) = [c for i, c in emu.repo(SOURCE).check_runs.items() if i not in checks_before]
    assert check.head_sha == world.commit and check.conclusion == "success"
    assert check.details_url == run.jobs["dispatch_infra"].outputs["run_url"]
    completed = next(count for what, count in world.events if what == f"completed {INFRA} success")
    posted = [i for i, r in enumerate(emu.requests) if r.operation == "checks/create" and r.status == 201]
    assert posted and posted[0] >= completed

    # The worker service only graded: no publication row, no signature on the infra host.
    from pipeline.infra.queue.sql import SqliteQueue

    with SqliteQueue(world.infra_home / "infra" / "queue.sqlite3") as queue:
        assert queue.list_publications(run_id) == []
        host_run = queue.run_dir(run_id)
    assert (host_run / "grading.json").is_file()
    assert list(host_run.rglob("*.sigstore.json")) == [], "the worker service signed something"

    # The seal job sealed the evidence with the ambient identity and published it before the
    # infra run concluded: the refs it names are the dispatched ones.
    release = world.emulator.release(SOURCE, TAG)
    names = {a.name for a in release.assets}
    assert {"summary.json", "SHA256SUMS", "SHA256SUMS.sigstore.json"} <= names, names
    summary_json = json.loads(next(a for a in release.assets if a.name == "summary.json").data)
    assert json.dumps(summary_json).count(built["runner"]) >= 1 and json.dumps(summary_json).count(built["api"]) >= 1
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
    """The seal job signed with the ambient identity the emulated Actions token endpoint served;
    a consumer pins the infra repository's benchmark.yml on main and runs the body's commands,
    parsed from the published body and run exactly as printed (real cosign, real benchseal)."""
    from pipeline.core.errors import CheckFailed
    from pipeline.local.release import run_commands
    from pipeline.verify.release import verify_release

    if not world.published:
        test_tag_release_runs_every_job_and_promotes_after_the_benchmark(world)
    commands = _printed_commands(world.emulator.release(SOURCE, TAG).body)
    identity = f"https://github.com/{INFRA}/.github/workflows/benchmark.yml@refs/heads/main"
    assert commands[0] == "sha256sum -c SHA256SUMS"
    cosign_lines = [c for c in commands if c.startswith("cosign ")]
    assert len(cosign_lines) == 7 and len(commands) == 9, commands  # 4 blobs, 3 attestation checks
    for line in cosign_lines:
        assert f"--certificate-identity {identity} --certificate-oidc-issuer https://token.actions.githubusercontent.com" \
            in line, line
    root = str(world.sigstore.trusted_root)
    assert commands[-1] == (f"benchseal verify . --repo {SOURCE} --tag {TAG} --infra-repo {INFRA} "
                            f"--trusted-root {root} --offline --profile production")
    # A consumer's shell: their cosign and benchseal on PATH.
    monkeypatch.setenv("PATH", os.pathsep.join([str(cosign_bin.parent), str(VENV_BIN), os.environ["PATH"]]))
    release = _download(world, tmp_path / "release")
    assert run_commands(commands, release) == commands

    done = verify_release(release, repository=SOURCE, tag=TAG, infra_repository=INFRA,
                          trusted_root=world.sigstore.trusted_root, offline=True, profile="production")
    assert (done.identity, done.repository, done.tag, done.commit) == (identity, SOURCE, TAG, world.commit)
    # Sealed by the infra repository's workflow, not by the source repository's own benchmark.yml.
    with pytest.raises(CheckFailed):
        verify_release(release, repository=SOURCE, tag=TAG, infra_repository=SOURCE,
                       trusted_root=world.sigstore.trusted_root, offline=True, profile="production")

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
    with pytest.raises(CheckFailed, match=r"cosign verify-blob .*--bundle SHA256SUMS\.sigstore\.json"):
        run_commands(commands, tampered)


def _describe(world: World, run: RunResult) -> str:
    infra = "\n".join(f"### infra run ({mode})\n{r.describe()}" for mode, r in world.infra_runs)
    logs = "".join(f"\n### {name}\n" + (world.root / name).read_text(errors="replace")[-3000:]
                   for name in ("worker.log", "publisher.log") if (world.root / name).exists())
    return f"{run.describe()}\n{infra}{logs}"


def _switchboard_release(world: World, correlation: str) -> tuple[RunResult, Any]:
    from pipeline.dispatch.client import make_client

    emu = world.emulator
    gh = make_client(base_url=emu.base_url, token=emu.token, backoff_factor=0.0)
    workflow = gh.get_repo(SOURCE).get_workflow("runner-release.yml")
    before = len(world.switchboard_runs)
    assert workflow.create_dispatch(ref="main", inputs={"deploy_ref": TAG, "switchboard_correlation_id": correlation})
    emu.wait_callbacks(timeout=900)
    assert emu.callback_errors == [], emu.callback_errors
    (run,) = world.switchboard_runs[before:]
    # Switchboard finds its run by the run-name's last token.
    found = [r for r in emu.repo(SOURCE).runs.values() if r.display_title.endswith(" " + correlation)]
    assert len(found) == 1 and found[0].display_title == f"Runner release {TAG} {correlation}"
    return run, found[0]


def test_switchboard_release_refused_by_infra_is_not_promoted_and_says_why(world: World) -> None:
    world.use_infra("refusing")
    checks_before = len(world.emulator.repo(SOURCE).check_runs)
    run, emulated = _switchboard_release(world, "sb-refused-0001")
    results = {job: r.result for job, r in run.jobs.items()}
    assert results == {"build": "success", "resolve_images": "success", "dispatch_infra": "failure",
                       "promote_marker": "skipped", "summarize": "success"}, run.describe()
    assert emulated.conclusion == "failure"
    assert len(world.emulator.repo(SOURCE).check_runs) == checks_before  # nothing promoted
    assert_every_reference_resolved(run, WORKFLOWS / "runner-release.yml")
    mode, infra = world.infra_runs[-1]
    assert mode == "refusing" and infra.jobs["accept"].result == "failure" and infra.jobs["wait"].result == "skipped"
    assert infra.jobs["seal"].result == "skipped"  # nothing accepted, nothing graded, nothing signed
    assert "invalid" in infra.jobs["accept"].log and "agent" in infra.jobs["accept"].log
    # The summary says what happened and why, and names the refs that were dispatched.
    summary = run.summary
    assert "| dispatch_infra | failure |" in summary and "| promote_marker | skipped |" in summary
    assert "Not promoted: dispatch_infra ended `failure`." in summary
    assert run.jobs["dispatch_infra"].outputs["error"] and run.jobs["dispatch_infra"].outputs["error"] in summary
    assert "failure" in run.jobs["dispatch_infra"].outputs["error"]
    merged = json.loads((run.run_dir / "artifacts" / "runner-release-digests-merged" / "digests.json").read_text())  # type: ignore[operator]
    for role in ("runner", "api"):
        assert f"- {role}: `{merged['images'][role]['ref']}`" in summary


def test_a_broken_output_name_fails_the_reference_check(world: World, tmp_path: Path) -> None:
    """The check the tests above pass, on a copy of runner-release.yml with one output name
    misspelt where the summary reads it: the run itself goes green, the check does not."""
    original = (WORKFLOWS / "runner-release.yml").read_text()
    broken = original.replace("RESOLVED_RUNNER: ${{ needs.resolve_images.outputs.runner_ref }}",
                              "RESOLVED_RUNNER: ${{ needs.resolve_images.outputs.runner_reff }}")
    assert broken != original
    copy = tmp_path / "runner-release.yml"
    copy.write_text(broken)
    world.use_infra("refusing")
    _RUNNER_RELEASE_COPY["path"] = copy
    try:
        run, _ = _switchboard_release(world, "sb-broken-0001")
    finally:
        _RUNNER_RELEASE_COPY.clear()
    assert run.jobs["summarize"].result == "success"
    assert run.unresolved == ["summarize: needs.resolve_images.outputs.runner_reff (never written)"]
    with pytest.raises(AssertionError, match="runner_reff"):
        assert_every_reference_resolved(run, copy)
