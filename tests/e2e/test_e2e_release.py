"""The whole chain with the GitHub target, against the GitHub emulator playing Actions.

One real worker run (smoke suite, oracle agent, real runner image, real Harbor) is
shared by every assertion here:

tag release exists -> ``dispatch_and_wait`` (repository_dispatch, run found by its
run-name) -> the emulated benchmark.yml job pipes the payload into
``benchseal infra accept`` (the real CLI) and starts a publishing worker
(``benchseal worker --publish github --signer local``: the outbox path, with the evidence
finalizer's real SBOMs and real Sigstore signatures on a private instance; the production
unit grades only and benchmark.yml's seal job signs, tests/e2e/test_e2e_workflows.py)
-> the run's conclusion follows the worker -> the worker is SIGKILLed right after
the terminal transition (its publisher is off) -> a publisher delivers the
outbox row through a 502 on upload, a timed-out upload and a 500 on PATCH, then a
separate ``benchseal publish --pending`` process finishes it -> exactly one
correct publication, verified by cosign and ``benchseal verify`` on the downloaded
assets.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from pipeline.core.contracts import DigestsFile
from pipeline.core.errors import CheckFailed
from pipeline.dispatch.client import make_client
from pipeline.publish.body import START, splice, with_asset_record
from pipeline.publish.bundle import load_bundle
from pipeline.publish.outbox import OutboxConfig, deliver_pending, image_commands, verify_commands
from pipeline.publish.targets import GitHubTarget, PublishError, Target
from tests.fixtures.github import tag_release_commit
from tests.fixtures.infra import wait_terminal

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE = "acme/widget"
INFRA = "acme/bench-infra"
TAG = "v1.0.0"
# Unique per session: the run id (and so the labels of its containers on the shared engines) is this run's own.
CORRELATION = f"e2e-widget-v1.0.0-{uuid.uuid4().hex[:8]}"
LOCKED = "acme/locked"
NOTES = "## What's new\n\n* faster widgets\n"
BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))


class World:
    def __init__(self, emulator: Any, home: Path, db: Path, artifacts: Path, dispatch: Any, state: str,
                 run_id: str, score: float | None, after_worker: dict[str, Any] | None = None) -> None:
        # after_worker: what the queue and the release held when the worker had ended, taken in
        # the fixture, so no test depends on running before the one that publishes.
        self.after_worker = after_worker or {}
        self.emulator = emulator
        self.home = home
        self.db = db
        self.artifacts = artifacts
        self.dispatch = dispatch
        self.state = state
        self.run_id = run_id
        self.score = score

    @property
    def trusted_root(self) -> Path:
        return self.home / "sigstore" / "trusted_root.json"


def _env(emulator: Any, home: Path) -> dict[str, str]:
    env = dict(os.environ, GITHUB_TOKEN=emulator.token, GITHUB_API_URL=emulator.base_url,
               BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0", NO_PROXY="127.0.0.1,localhost")
    env.pop("GH_TOKEN", None)
    return env


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile, sign_release_images: Any) -> Iterator[World]:
    from pipeline.core import paths
    from pipeline.dispatch.correlate import PollConfig
    from pipeline.dispatch.dispatch import build_payload
    from pipeline.local import sigstore as sigstore_local
    from tests.doubles.github import GitHubEmulator

    home = tmp_path_factory.mktemp("e2e-home")
    if (paths.home() / "tools").is_dir():  # cosign, installed by make setup
        (home / "tools").symlink_to(paths.home() / "tools", target_is_directory=True)
    db = home / "infra" / "queue.sqlite3"
    logs = tmp_path_factory.mktemp("e2e-logs")
    env_patch = pytest.MonkeyPatch()
    # This process, the accept CLI, the worker service and the publisher all share one state dir
    # (and so one private Sigstore instance and trusted root).
    env_patch.setenv("BENCHSEAL_HOME", str(home))
    correlation = CORRELATION
    # tag.yml's build job signed and attested both images; the worker checks that with cosign.
    # Signed at the commit the tag resolves to (below): the worker pins the payload's commit.
    trust = sign_release_images(SOURCE, TAG, [e.ref for e in built_images.images.values()],
                                commit=built_images.source.commit)
    try:
        with GitHubEmulator() as emu:
            emu.add_repo(SOURCE)
            emu.add_repo(INFRA)
            # The infra repository's own workflow: the caller of benchseal's reusable benchmark.yml
            # (its triggers and run-name are what `benchseal dispatch` finds the run by).
            emu.add_workflow(INFRA, ".github/workflows/benchmark.yml",
                             (REPO_ROOT / "examples" / "bench-infra" / ".github" / "workflows" / "benchmark.yml")
                             .read_text("utf-8"))
            gh = make_client(base_url=emu.base_url, token=emu.token, backoff_factor=0.0)
            # The release's tag points at the commit the images were built from (the publisher
            # resolves it and refuses a release of another commit).
            tag_release_commit(emu, SOURCE, TAG, built_images.source.commit)
            gh.get_repo(SOURCE).create_git_release(tag=TAG, name=TAG, message=NOTES)
            states: list[str] = []

            def benchmark_job(handle: Any, event: Any) -> None:
                # benchmark.yml's job on the infra host: accept, then the worker service runs it.
                handle.start()
                accepted = subprocess.run(
                    [BENCHSEAL, "infra", "accept", "--payload", "-", "--json", "--db", str(db)],
                    input=json.dumps(dict(handle.payload)), capture_output=True, text=True,
                    env=_env(emu, home), check=False, timeout=60)
                if accepted.returncode != 0:
                    handle.complete("failure")
                    raise AssertionError(f"infra accept failed: {accepted.stderr}")
                with (logs / "worker.log").open("wb") as log:
                    worker = subprocess.Popen(
                        [BENCHSEAL, "worker", "--publish", "github", "--signer", "local",
                         "--db", str(db), "--api-url", emu.base_url,
                         "--sigstore-url", str(trust.fulcio_url), "--trusted-root", str(trust.trusted_root)],
                        env=_env(emu, home), stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
                    try:
                        state = wait_terminal(db, correlation, worker=worker)
                    finally:
                        # Killed right after the terminal transition: nothing was published by it.
                        worker.kill()
                        worker.wait(timeout=30)
                states.append(state)
                handle.complete("success" if state == "SUCCEEDED" else "failure")

            emu.on_dispatch(benchmark_job)
            payload = build_payload(built_images, correlation_id=correlation, tag=TAG, repository=SOURCE)
            result = None
            error: BaseException | None = None
            try:
                result = run_dispatch(gh, payload, PollConfig(attempts=60, interval_s=1.0, skew_s=5.0))
            except BaseException as exc:  # reported after the job thread finished
                error = exc
            emu.wait_callbacks(timeout=600)
            assert emu.callback_errors == [], (emu.callback_errors, (logs / "worker.log").read_text()[-3000:])
            if error is not None:
                raise error
            from pipeline.core.contracts import run_id_for
            from pipeline.infra.queue.sql import SqliteQueue

            with SqliteQueue(db) as queue:
                record = queue.get_run(run_id_for(correlation))
                artifacts = queue.run_dir(record.run_id) / "artifacts"
                publications = queue.list_publications(record.run_id)
            after_worker = {"publications": publications, "assets": list(emu.release(SOURCE, TAG).assets)}
            yield World(emu, home, db, artifacts, result, states[0], record.run_id,
                        record.grading.score if record.grading else None, after_worker)
            assert emu.violations == [], emu.violations
    finally:
        sigstore_local.stop(home / "sigstore")  # the instance the worker service started, by its pid
        env_patch.undo()


def run_dispatch(gh: Any, payload: Any, poll: Any) -> Any:
    from pipeline.dispatch.dispatch import dispatch_and_wait

    return dispatch_and_wait(gh, INFRA, payload, workflow=None, timeout_s=900, poll=poll)


def _download(emulator: Any, repo: str, tag: str, dest: Path) -> dict[str, bytes]:
    release = emulator.release(repo, tag)
    dest.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {}
    for asset in release.assets:
        url = f"{emulator.origin}/{repo}/releases/download/{tag}/{asset.name}"
        data = requests.get(url, timeout=30).content
        (dest / asset.name).write_bytes(data)
        files[asset.name] = data
    return files


def _verify_downloaded(directory: Path, trusted_root: Path) -> None:
    """The consumer's checks, expecting the release of SOURCE at TAG (stated, not read from the files)."""
    from pipeline.local.release import run_commands
    from pipeline.verify.external import cosign_commands, local_benchseal
    from pipeline.verify.release import verify_release

    done = verify_release(directory, repository=SOURCE, tag=TAG, trusted_root=trusted_root, offline=True)
    assert (done.repository, done.tag) == (SOURCE, TAG) and len(done.commit) == 40
    commands = cosign_commands(directory, repository=SOURCE, tag=TAG, trusted_root=trusted_root,
                               benchseal=local_benchseal())
    assert any(c.split()[0].endswith("cosign") for c in commands)
    assert f"verify . --repo {SOURCE} --tag {TAG}" in commands[-1]
    ran = run_commands(commands, directory)
    assert len(ran) == len(commands) >= 8  # sha256sum + one cosign per bundle + benchseal verify


def test_run_concluded_with_the_worker(world: World) -> None:
    assert world.state == "SUCCEEDED" and world.score == 1.0
    assert world.dispatch.conclusion == "success"
    run = world.emulator.get_run(INFRA, world.dispatch.run_id)
    assert run.conclusion == "success" and run.display_title.endswith(f" {CORRELATION}")
    # The worker ended with the terminal transition: the publication waited in the outbox.
    (pub,) = world.after_worker["publications"]
    assert pub.state == "PENDING" and pub.request.target == "github" and pub.request.tag == TAG
    assert world.after_worker["assets"] == []
    # The finalizer sealed the evidence in the worker: the summary carries the comparison (the repository's
    # first scored release here), and its digest joined the history in the same worker pass.
    from pipeline.core.fsutil import sha256_file
    from pipeline.infra.queue.sql import SqliteQueue

    summary = json.loads((world.artifacts / "summary.json").read_text())
    assert summary["comparison"]["previous"] is None and summary["comparison"]["gated"] is False
    with SqliteQueue(world.db) as queue:
        [entry] = queue.history(SOURCE)
    assert entry.run_id == world.run_id and entry.summary_digest == f"sha256:{sha256_file(world.artifacts / 'summary.json')}"


def test_publication_through_faults_is_exactly_one(world: World, tmp_path: Path) -> None:
    emu = world.emulator
    from pipeline.infra.queue.sql import SqliteQueue

    fast = OutboxConfig(max_attempts=10, base_delay=0.0, max_delay=0.0, lease_seconds=30)

    def impatient(_: Any) -> Target:
        return GitHubTarget(make_client(base_url=emu.base_url, token=emu.token, backoff_factor=0.0,
                                        timeout=1).get_repo(SOURCE))

    faults = [("repos/upload-release-asset", [502], 0.0),
              ("repos/upload-release-asset", [500], 2.5),   # answered after the client gave up
              ("repos/update-release", [500], 0.0)]
    with SqliteQueue(world.db) as queue:
        for operation, statuses, delay in faults:
            emu.inject_fault(operation, statuses, delay=delay)
            report = deliver_pending(queue, targets=impatient, config=fast, reseal=_never)
            assert report.published == [] and len(report.failed) == 1, report
    # A separate publisher process (the worker's process is long gone) delivers the row.
    done = subprocess.run([BENCHSEAL, "publish", "--pending", "--json", "--db", str(world.db)],
                          capture_output=True, text=True, env=_env(emu, world.home), check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [p["run_id"] for p in report["published"]] == [world.run_id]
    with SqliteQueue(world.db) as queue:
        (pub,) = queue.list_publications(world.run_id)
    assert pub.state == "DELIVERED" and pub.attempts == len(faults) + 1

    # Exactly the artifacts, each once, byte for byte; the body is the notes plus one section.
    artifacts = world.artifacts
    expected = {p.name: p.read_bytes() for p in artifacts.iterdir() if p.is_file()}
    # Among them the exports for the charting tools (issue 37.7), which only a scored run has.
    assert {"bencher.bmf.json", "github-action-benchmark.json"} <= set(expected), sorted(expected)
    downloaded = _download(emu, SOURCE, TAG, tmp_path / "downloaded")
    assert downloaded == expected
    assert sorted(a.name for a in emu.release(SOURCE, TAG).assets) == sorted(expected)
    bundle = load_bundle(artifacts, TAG, verify_commands(artifacts, repository=SOURCE, tag=TAG),
                         image_commands(artifacts, repository=SOURCE, tag=TAG, trusted_root=world.trusted_root))
    body = emu.release(SOURCE, TAG).body
    # The section ends with the record of the assets benchseal wrote (name and sha256 of each).
    record = ((name, hashlib.sha256(data).hexdigest()) for name, data in expected.items())
    assert body == splice(NOTES, with_asset_record(bundle.section, record))
    assert body.count(START) == 1 and "| Score | **1.000** (3/3 resolved) |" in body
    assert not any(r.status == 422 for r in emu.requests)
    _verify_downloaded(tmp_path / "downloaded", world.trusted_root)

    # A re-delivery (a publisher that crashed before marking) changes nothing.
    before = sum(emu.count(method=m) for m in ("POST", "PATCH", "DELETE"))
    again = GitHubTarget(make_client(base_url=emu.base_url, token=emu.token).get_repo(SOURCE)).publish(bundle)
    assert set(again.assets.values()) == {"kept"} and not again.body_changed
    assert sum(emu.count(method=m) for m in ("POST", "PATCH", "DELETE")) == before


def test_immutable_release_gets_a_verified_companion(world: World, tmp_path: Path) -> None:
    # The run's own repository (a run is published only there), on a second GitHub whose
    # repository has immutable releases.
    from tests.doubles.github import GitHubEmulator

    commit = json.loads((world.artifacts / "summary.json").read_text())["source"]["commit"]
    with GitHubEmulator() as emu:
        emu.add_repo(SOURCE, immutable_releases=True)
        tag_release_commit(emu, SOURCE, TAG, commit, annotated=True)
        repo = make_client(base_url=emu.base_url, token=emu.token).get_repo(SOURCE)
        repo.create_git_release(tag=TAG, name=TAG, message=NOTES)
        bundle = load_bundle(world.artifacts, TAG, verify_commands(world.artifacts, repository=SOURCE, tag=TAG),
                             image_commands(world.artifacts, repository=SOURCE, tag=TAG,
                                            trusted_root=world.trusted_root))
        result = GitHubTarget(repo).publish(bundle)
        assert result.strategy == "companion"
        assert emu.release(SOURCE, TAG).assets == [] and emu.release(SOURCE, TAG).immutable
        companion = emu.release(SOURCE, TAG + "-benchmark")
        assert companion.immutable and not companion.draft
        downloaded = _download(emu, SOURCE, TAG + "-benchmark", tmp_path / "companion")
        assert downloaded == {p.name: p.read_bytes() for p in world.artifacts.iterdir() if p.is_file()}
        assert emu.release(SOURCE, TAG).body.startswith(NOTES + "\n" + START)
        assert emu.violations == [], emu.violations
    _verify_downloaded(tmp_path / "companion", world.trusted_root)
    # The evidence is SOURCE's: a consumer who expects LOCKED's release is refused, by name,
    # and the publisher refuses to put it into LOCKED's release at all.
    from pipeline.verify.release import verify_release

    with pytest.raises(CheckFailed, match=r"source\.repository is 'acme/widget', expected 'acme/locked'"):
        verify_release(tmp_path / "companion", repository=LOCKED, tag=TAG, trusted_root=world.trusted_root,
                       offline=True)
    world.emulator.add_repo(LOCKED, immutable_releases=True)
    locked = make_client(base_url=world.emulator.base_url, token=world.emulator.token).get_repo(LOCKED)
    locked.create_git_release(tag=TAG, name=TAG, message=NOTES)
    with pytest.raises(PublishError):
        GitHubTarget(locked).publish(bundle)


def _never(path: Path) -> None:
    raise AssertionError(f"the retry budget must not run out here ({path})")

