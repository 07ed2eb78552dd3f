"""benchseal's reusable release.yml after the build, called from an adopter's caller workflow and
executed by the Actions harness against the GitHub emulator with the tokens GitHub would give them:

* every job's GITHUB_TOKEN carries exactly that job's ``permissions`` (the emulator refuses
  anything more: 403 "Resource not accessible by integration");
* ``BENCHSEAL_INFRA_DISPATCH_TOKEN`` is a fine-grained token with Actions: read and write on
  the infra repository only;
* dispatch_infra sends a workflow_dispatch with return_run_details and follows the run
  GitHub names, end to end, through the real step script of release.yml, for a pushed tag and
  for a Switchboard-style workflow_dispatch of the caller.

The build job (Docker, registry, cosign) is replaced by one that uploads the two digests
files it would have uploaded, committed to a copy of benchseal that the caller pins by commit;
everything else is the workflow file as committed.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import yaml

from pipeline.dispatch.client import make_client
from tests.doubles.github import DispatchEvent, GitHubEmulator, RunHandle
from tests.fixtures.github import digests_data
from tests.workflows.harness import Runner, RunResult, Trigger, run_workflow

pytestmark = pytest.mark.slow  # pip installs of the checkout, real dispatch polling

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
CALLER = ROOT / "examples" / "hello-agent" / ".github" / "workflows" / "release.yml"
INFRA_CALLER = ROOT / "examples" / "bench-infra" / ".github" / "workflows" / "benchmark.yml"
BENCHSEAL = "benchseal/benchseal"
SOURCE = "acme/widget"
INFRA = "acme/bench-infra"
TAG = "v1.0.0"
CORRELATION = "switchboard-0001-feedface"
UPLOAD = "actions/upload-artifact@ea165f8d65b6e75b540449e92b4886f43607fa02"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@benchseal.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@benchseal.invalid"}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False, timeout=120,
                          env={**os.environ, **GIT_ENV})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def benchseal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """benchseal as a repository whose one commit is this working tree (what the jobs check out and install)."""
    dest = tmp_path_factory.mktemp("benchseal") / "benchseal"
    _git(ROOT.parent, "clone", "--quiet", "--no-hardlinks", str(ROOT), str(dest))
    listed = _git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for name in filter(None, listed):
        if name.split("/")[0] in (".benchseal", ".venv", "node_modules"):
            continue
        src, dst = ROOT / name, dest / name
        if not src.exists():
            dst.unlink(missing_ok=True)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    _git(dest, "add", "-A")
    _git(dest, "commit", "--quiet", "--allow-empty", "-m", "the working tree under test")
    return dest


@pytest.fixture(scope="module")
def adopter(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The adopter's repository: one commit, tagged (its caller is written per test, pinned to a builder)."""
    repo = tmp_path_factory.mktemp("adopter") / "widget"
    repo.mkdir()
    _git(repo, "init", "--quiet", "-b", "main")
    (repo / "README.md").write_text("widget\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "--quiet", "-m", "widget")
    _git(repo, "tag", TAG)
    return repo, _git(repo, "rev-parse", "HEAD")


def _after_the_build(benchseal: Path, commit: str, tmp_path: Path, strip: str | None = None) -> str:
    """benchseal's release.yml with its build job replaced by one that uploads the digests files it
    would (and, with ``strip``, that job's permissions removed), committed to benchseal's
    repository; returns that commit (what the caller pins)."""
    doc = yaml.safe_load((WORKFLOWS / "release.yml").read_text())
    if strip is not None:
        doc["jobs"][strip]["permissions"] = {}
    full = digests_data(commit=commit, ref=f"refs/tags/{TAG}")
    env, run, uploads = {}, [], []
    for role in ("runner", "api"):
        env[f"DIGESTS_{role.upper()}"] = json.dumps({**full, "images": {role: full["images"][role]}})
        run.append(f'printf "%s" "$DIGESTS_{role.upper()}" > digests-{role}.json')
        uploads.append({"uses": UPLOAD, "with": {"name": f"benchseal-digests-{role}",
                                                  "path": f"digests-{role}.json", "if-no-files-found": "error"}})
    doc["jobs"]["build"] = {"runs-on": "ubuntu-24.04", "needs": "builder", "permissions": {},
                            "steps": [{"shell": "bash", "env": env, "run": "\n".join(run)}, *uploads]}
    # attach_result pushes to the runner's registry (ghcr.io, which no test here stands in for) the bundle
    # of a release the seal job published: its steps are replaced, its needs, condition and permissions
    # kept (`benchseal attach-result` runs for real in tests/attest and tests/verify, and in tests/e2e).
    doc["jobs"]["attach_result"]["steps"] = [{"shell": "bash", "run": "echo the test result would be attached"}]
    # attest signs with cosign and pushes to ghcr.io the same way (real in tests/attest and tests/e2e): its
    # steps are replaced, its needs, matrix and permissions kept.
    doc["jobs"]["attest"]["steps"] = [{"shell": "bash", "run": "echo the digests would be signed and attested"}]
    work = tmp_path / "benchseal-work"
    _git(tmp_path, "clone", "--quiet", str(benchseal), str(work))
    (work / ".github" / "workflows" / "release.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    _git(work, "commit", "--quiet", "-am", "the build replaced")
    pinned = _git(work, "rev-parse", "HEAD")
    _git(benchseal, "fetch", "--quiet", str(work), f"{pinned}:refs/heads/test-{pinned[:12]}")
    return pinned


def _explain(world: World, run: RunResult) -> str:
    """The jobs' log, then what the emulator answered (status and body size of each request): CI has
    seen jobs here read GitHub objects with every member missing (PyGithub's reading of a 2xx whose
    body is empty or not JSON), and this says whether the emulator sent such an answer."""
    answered = [f"{r.method} {r.path} [{r.operation}] -> {r.status} ({r.size} bytes)" for r in world.emulator.requests]
    return run.describe() + "\n== GitHub emulator answers\n" + "\n".join(answered[-60:])


def _unsigned_token(audience: str, claims: Mapping[str, str]) -> str:
    """The builder job only reads its own claims; nothing here signs (no Sigstore needed)."""
    part = lambda data: base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")  # noqa: E731
    return f"{part({'alg': 'none'})}.{part({**claims, 'aud': audience})}."


class World:
    def __init__(self, emulator: GitHubEmulator, benchseal: Path, adopter: Path, commit: str) -> None:
        self.emulator = emulator
        self.benchseal = benchseal
        self.adopter = adopter
        self.commit = commit
        self.events: list[DispatchEvent] = []
        self.job_tokens: list[tuple[str, dict[str, str]]] = []
        self.claims: list[dict[str, str]] = []
        self.infra_conclusion = "success"  # how the dispatched infra run ends

    def job_token(self, repository: str, permissions: dict[str, str]) -> str:
        self.job_tokens.append((repository, dict(permissions)))
        return self.emulator.add_token([repository], permissions, kind="github-token")

    def oidc(self, audience: str, claims: Mapping[str, str]) -> str:
        self.claims.append(dict(claims))
        return _unsigned_token(audience, claims)

    def run(self, event: str, tmp_path: Path, dispatch_token: str, strip: str | None = None,
            extra_with: Mapping[str, str] | None = None) -> RunResult:
        pinned = _after_the_build(self.benchseal, self.commit, tmp_path, strip)
        caller = tmp_path / "release.yml"
        text = CALLER.read_text().replace("BENCHSEAL_COMMIT", pinned)
        if extra_with:  # more inputs of release.yml, as a caller passes them (under its `with:`)
            anchor = "    with:\n"
            assert text.count(anchor) == 1
            text = text.replace(anchor, anchor + "".join(f"      {k}: {json.dumps(v)}\n" for k, v in extra_with.items()))
        caller.write_text(text)
        if event == "push":
            trigger = Trigger("push", SOURCE, self.commit, f"refs/tags/{TAG}")
        else:
            trigger = Trigger("workflow_dispatch", SOURCE, self.commit, "refs/heads/main",
                              inputs={"deploy_ref": TAG, "switchboard_correlation_id": CORRELATION})
        trigger.token = self.emulator.token  # never used: every job gets its own (Runner.github_token)
        trigger.api_url, trigger.server_url = self.emulator.base_url, self.emulator.origin
        trigger.vars = {"BENCHSEAL_INFRA_REPOSITORY": INFRA, "BENCHSEAL_IMAGE_PREFIX": "ghcr.io/acme/widget-"}
        trigger.secrets = {"BENCHSEAL_INFRA_DISPATCH_TOKEN": dispatch_token}
        runner = Runner(root=tmp_path / "runner", source=self.adopter, repositories={BENCHSEAL: self.benchseal},
                        github_token=self.job_token, oidc=self.oidc)
        self.pinned = pinned
        return run_workflow(caller, trigger, runner)


@pytest.fixture
def world(benchseal: Path, adopter: tuple[Path, str]) -> Iterator[World]:
    repo, commit = adopter
    with GitHubEmulator() as emu:
        emu.add_repo(SOURCE)
        emu.add_repo(INFRA)
        emu.set_ref(SOURCE, f"refs/tags/{TAG}", commit)
        emu.add_workflow(INFRA, ".github/workflows/benchmark.yml", INFRA_CALLER.read_text())
        world = World(emu, benchseal, repo, commit)

        def on_dispatch(handle: RunHandle, event: DispatchEvent) -> None:
            world.events.append(event)
            handle.start()
            handle.complete(world.infra_conclusion)

        emu.on_dispatch(on_dispatch)
        yield world
        emu.wait_callbacks(timeout=30)
        assert emu.callback_errors == []
        assert emu.violations == [], emu.violations


JOBS = ("builder", "build", "attest", "resolve_images", "dispatch_infra", "promote_marker", "hold_back",
        "attach_result", "summarize")
SKIPPED_ON_SUCCESS = ("hold_back",)


def called(run: RunResult) -> dict[str, str]:
    return {job.removeprefix("release/"): r.result for job, r in run.jobs.items() if job.startswith("release/")}


@pytest.mark.parametrize("event", ["push", "workflow_dispatch"])
def test_each_job_runs_on_its_own_permissions_and_dispatch_needs_only_actions_write(
        world: World, tmp_path: Path, event: str) -> None:
    emu = world.emulator
    dispatch_token = emu.add_token([INFRA], {"actions": "write"})
    run = world.run(event, tmp_path, dispatch_token)
    assert run.conclusion == "success", _explain(world, run)
    assert called(run) == {job: "skipped" if job in SKIPPED_ON_SUCCESS else "success" for job in JOBS}, \
        _explain(world, run)
    assert run.unresolved == [] and run.secret_leaks == []
    # one token per job, each exactly the job's permissions (id-token is not a token permission)
    granted = sorted(json.dumps(p, sort_keys=True) for _, p in world.job_tokens)
    assert granted == sorted(json.dumps(p, sort_keys=True) for p in [
        {}, {}, {"contents": "read"}, {"contents": "read"}, {"checks": "write"},
        {"contents": "read", "packages": "write"}, {},
        # attest, one per image: no id-token in the build's token, the signer's never reaches it
        {"contents": "read", "packages": "write"}, {"contents": "read", "packages": "write"}])
    assert {r for r, _ in world.job_tokens} == {SOURCE}
    # The builder job learnt benchseal's repository and commit from its token, as GitHub mints it
    # for a called workflow: the called file at the pinned commit, the caller's own workflow_ref.
    [claims] = world.claims
    assert claims["job_workflow_ref"] == f"{BENCHSEAL}/.github/workflows/release.yml@{world.pinned}"
    assert claims["job_workflow_sha"] == world.pinned and claims["repository"] == SOURCE
    assert claims["workflow_ref"].startswith(f"{SOURCE}/.github/workflows/")
    builder = run.jobs["release/builder"].outputs
    assert (builder["repository"], builder["sha"], builder["pin"]) == (BENCHSEAL, world.pinned,
                                                                         f"{BENCHSEAL}@{world.pinned}")
    # workflow_dispatch with return_run_details: one POST, the named run read back, no repository_dispatch
    [event] = world.events
    assert (event.kind, event.repo, event.workflow_path) == ("workflow_dispatch", INFRA, ".github/workflows/benchmark.yml")
    payload = event.benchseal_payload()
    [infra_run] = emu.runs(INFRA)
    outputs = run.jobs["release/dispatch_infra"].outputs
    assert outputs["run_id"] == str(infra_run.id)
    assert infra_run.display_title.endswith(" " + outputs["correlation_id"]) and payload is not None
    assert payload["correlation_id"] == outputs["correlation_id"]
    assert (outputs["runner_ref"], outputs["api_ref"]) == (payload["runner"], payload["api"])
    assert emu.count("actions/create-workflow-dispatch", "POST") == 1
    assert emu.count("repos/create-dispatch-event") == 0
    assert emu.count("actions/get-workflow-run") >= 1  # the run GitHub named, checked
    # promote_marker's check run, made with its own checks: write token
    [check] = emu.repo(SOURCE).check_runs.values()
    assert (check.name, check.head_sha, check.conclusion) == ("benchseal/benchmark", world.commit, "success")
    assert f"infra run {outputs['run_url']}" in run.summary
    assert (payload["suite"], "tasks" in payload) == ("smoke", False)  # the inputs' defaults: every task of smoke


def test_the_caller_names_the_suite_and_a_subset_of_its_tasks_and_the_payload_carries_them(
        world: World, tmp_path: Path) -> None:
    """release.yml's ``suite`` and ``tasks`` inputs reach the dispatched payload (the infra admits the suite by its
    policy and the tasks by its staged dataset: tests/infra/test_subset.py); the subset in its one spelling."""
    run = world.run("push", tmp_path, world.emulator.add_token([INFRA], {"actions": "write"}),
                    extra_with={"suite": "humaneval", "tasks": "humaneval-32, humaneval-0"})
    assert run.conclusion == "success", _explain(world, run)
    [event] = world.events
    payload = event.benchseal_payload()
    assert payload is not None and (payload["suite"], payload["tasks"]) == ("humaneval", ["humaneval-0", "humaneval-32"])


def test_a_dispatch_token_without_actions_write_is_refused_and_nothing_is_promoted(
        world: World, tmp_path: Path) -> None:
    emu = world.emulator
    reader = emu.add_token([INFRA], {"actions": "read", "contents": "read"})
    run = world.run("push", tmp_path, reader)
    assert called(run) == {"builder": "success", "build": "success", "attest": "success", "resolve_images": "success",
                           "dispatch_infra": "failure", "promote_marker": "skipped", "hold_back": "skipped",
                           "attach_result": "skipped", "summarize": "success"}, _explain(world, run)
    assert emu.runs(INFRA) == [] and world.events == []
    assert "Resource not accessible by personal access token" in run.summary
    assert "Not promoted: dispatch_infra ended `failure`." in run.summary
    assert emu.repo(SOURCE).check_runs == {}
    assert run.secret_leaks == []


@pytest.mark.parametrize("strip, failed, message", [
    ("resolve_images", "resolve_images", "GitHub answered HTTP 403"),
    ("promote_marker", "promote_marker", "Resource not accessible by integration"),
])
def test_a_job_without_its_permission_fails(world: World, tmp_path: Path, strip: str, failed: str,
                                            message: str) -> None:
    """The job tokens are enforced: the same jobs with their permissions removed fail at GitHub."""
    run = world.run("push", tmp_path, world.emulator.add_token([INFRA], {"actions": "write"}), strip=strip)
    assert run.jobs[f"release/{failed}"].result == "failure", _explain(world, run)
    log = run.jobs[f"release/{failed}"].log
    assert message in log, log  # the whole log when it fails
    assert world.emulator.repo(SOURCE).check_runs == {}


@pytest.mark.parametrize("gated", [True, False])
def test_a_gated_release_fails_the_benchmark_check_naming_the_regressed_tasks(
        world: World, tmp_path: Path, gated: bool) -> None:
    """The infra run failed (its seal job held the published release back): nothing is promoted and the
    benchseal/benchmark check fails, naming what regressed when the release's summary.json says it was
    gated (a plain failure otherwise)."""
    emu = world.emulator
    world.infra_conclusion = "failure"
    repo = make_client(base_url=emu.base_url, token=emu.token, backoff_factor=0.0).get_repo(SOURCE)
    release = repo.create_git_release(tag=TAG, name=TAG, message="Release notes.\n")
    comparison = {"gated": gated, "reasons": ["resolved in v0.9.0, failing now: hello-world, fix-bug"],
                  "changed": [{"task": "hello-world", "change": "regressed"}, {"task": "fix-bug", "change": "regressed"},
                              {"task": "new-task", "change": "added"}]}
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"status": "SUCCEEDED", "comparison": comparison}))
    release.upload_asset(str(summary), name="summary.json", content_type="application/json")

    run = world.run("push", tmp_path, emu.add_token([INFRA], {"actions": "write"}))
    assert called(run)["dispatch_infra"] == "failure" and called(run)["promote_marker"] == "skipped", \
        _explain(world, run)
    assert called(run)["hold_back"] == "success", _explain(world, run)
    [check] = emu.repo(SOURCE).check_runs.values()
    assert (check.name, check.head_sha, check.conclusion) == ("benchseal/benchmark", world.commit, "failure")
    if gated:
        assert check.output["title"] == "regression gate: hello-world, fix-bug regressed"
        assert "failing now: hello-world, fix-bug" in check.output["summary"]
        assert "not promoted" in check.output["summary"]
    else:
        assert check.output["title"] == "benchmark did not succeed"
    assert run.secret_leaks == []
