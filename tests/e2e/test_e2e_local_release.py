"""``benchseal release vX.Y.Z --local`` (what ``make demo`` runs), twice: the second run reuses the images;
and ``--project examples/hello-agent/benchseal.toml`` (the default ``make demo``): the example released as
its own repository, ``benchseal-examples/hello-agent``.

Who signs (issue 25, the adopter path): the local builder ``local/benchseal@refs/heads/main``'s release.yml
the images (for the source at the tag and its commit), its benchmark.yml the evidence (for the local infra
repository ``local/bench-infra`` on main); the body's commands pin the builder and the source separately.

State is a fresh BENCHSEAL_HOME that shares only the build caches and tools of the
default one (so the images are warm, as after ``make setup``), never its queue,
Sigstore instance or releases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import DigestsFile
from pipeline.core.errors import CheckFailed
from pipeline.infra.intake.policy_home import policy_digest, policy_file
from pipeline.publish.body import END, START, markdown_cell
from tests.fixtures.homes import fresh_home
from tests.fixtures.parallel import POLICY_MODEL_PORT

# Its release serves the scripted model on the shipped policy's fixed port: one such module at a time.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.xdist_group(POLICY_MODEL_PORT)]

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
TAG = "v0.0.1-e2e"
BUILDER, INFRA = "local/benchseal@refs/heads/main", "local/bench-infra"
SEAL_IDENTITY = "https://github.com/local/benchseal/.github/workflows/benchmark.yml@refs/heads/main"
IMAGE_IDENTITY = "https://github.com/local/benchseal/.github/workflows/release.yml@refs/heads/main"


@pytest.fixture(scope="module")
def local_home(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile) -> Iterator[Path]:
    with fresh_home(tmp_path_factory, "release-home") as home:
        yield home


def _release(home: Path, dist: Path, *extra: str, tag: str = TAG) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0")
    return subprocess.run([BENCHSEAL, "release", tag, "--local", "--dist", str(dist), *extra],
                          capture_output=True, text=True, env=env, check=False, timeout=900)


def test_release_local_twice(local_home: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    first = _release(local_home, dist, "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    report: dict[str, Any] = json.loads(first.stdout)
    release = dist / TAG
    assert report["status"] == "SUCCEEDED" and report["score"] == 1.0
    assert report["counts"] == {"total": 3, "completed": 3, "resolved": 3, "unresolved": 0, "infra_errors": 0}
    assert report["release_dir"] == str(release)
    sums = (release / "SHA256SUMS").read_text().splitlines()
    listed = {line.split("  ", 1)[1] for line in sums}
    assert {p.name for p in release.iterdir()} == listed | {"body.md", "SHA256SUMS", "SHA256SUMS.sigstore.json"}
    body = (release / "body.md").read_text()
    assert body.count(START) == 1 and body.count(END) == 1 and report["run_id"] in body
    # The infra policy the worker ran and graded under, by its file's sha256, in the signed evidence (issue 38.7).
    policy = "sha256:" + report["policy"]["sha256"] if report.get("policy") else policy_digest(policy_file(None))
    assert json.loads((release / "summary.json").read_text())["policy_digest"] == policy
    assert f"| Infra policy (sha256 of policies/infra.yaml) | `{policy}` |" in body
    # A fresh home: the repository's first scored release, nothing to compare with, not gated.
    assert report["comparison"]["previous"] is None and report["comparison"]["gated"] is False
    assert "| Compared with | nothing: the repository's first scored release of this suite |" in body
    for role in ("runner", "api"):
        assert report["images"][role] in body
    assert any("cosign verify-blob" in c for c in report["verified"]["cosign_commands"])
    # The body's image lines ran too: signature and both attestations of each image, commit pinned.
    image_lines = [c for c in report["verified"]["cosign_commands"] if " --certificate-github-workflow-sha " in c]
    assert len(image_lines) == 6 and sum(" verify-attestation --new-bundle-format --type " in c for c in image_lines) == 4
    assert body.count("--certificate-github-workflow-sha") == 6
    assert set(report["stages"]) >= {"build", "push", "dispatch", "worker", "evidence", "signing", "publication",
                                     "verification", "prune"}
    # The worker's prune ran beside sealing and verifying (issue 36.6), and the release waited for it (the prune
    # stage): the run's staged copies are gone when it returns.
    run_dir = local_home / "infra" / "runs" / report["run_id"]
    assert (run_dir / "grading.json").is_file() and not (run_dir / "dataset").exists()
    assert not list(run_dir.glob("batches/*/suite"))

    # Nothing changed: same digests, nothing pushed, a new benchmark run, the same release dir updated.
    second = _release(local_home, dist)
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads((local_home / "release" / "last-digests.json").read_text())
    assert again == report["images"], "the images changed although nothing did (is the working tree moving?)"
    assert "SUCCEEDED" in second.stdout and "reused" in second.stdout
    body2 = (release / "body.md").read_text()
    assert body2.count(START) == 1 and f"| Infra run id | `{report['run_id']}` |" not in body2  # replaced
    # The second scoring of the tag (the same commit) gets the baseline its first scoring had: here none,
    # never the tag's own first scoring (issue 35 point 6).
    assert "| Compared with | nothing: the repository's first scored release of this suite |" in body2
    assert f"infra run `{report['run_id']}`" not in body2

    from pipeline.verify.release import verify_release

    # The consumer states the release: build's source repository (no GITHUB_REPOSITORY here) and the tag,
    # and who sealed it: the local builder, for the local infra repository.
    source_repo = os.environ.get("GITHUB_REPOSITORY") or "local/benchseal"
    root = local_home / "sigstore" / "trusted_root.json"
    # Signed exactly as production would be (GitHub Actions identities), under the local root only.
    done = verify_release(release, repository=source_repo, tag=TAG, profile="production", infra_repository=INFRA,
                          builder=BUILDER, trusted_root=root, offline=True, infra_policy_digest=policy)
    assert (done.repository, done.tag, done.commit) == (source_repo, TAG, report["source"]["commit"])
    assert done.policy_digest == policy
    assert (done.identity, done.workflow_repository, done.workflow_ref) == (SEAL_IDENTITY, INFRA, "refs/heads/main")
    assert done.issuer == "https://token.actions.githubusercontent.com"
    with pytest.raises(CheckFailed):  # the private instance's plain identity is not what signed it
        verify_release(release, repository=source_repo, tag=TAG, profile="local", trusted_root=root, offline=True)
    image_checks = report["verified"]["images"]
    assert len(image_checks) == 2 and all(f"slsaprovenance1 and cyclonedx by {IMAGE_IDENTITY} at commit "
                                          f"{report['source']['commit']}" in c and "refused" in c
                                          for c in image_checks)
    assert report["verified"]["repository"] == source_repo and report["verified"]["tag"] == TAG
    assert (report["verified"]["builder"], report["verified"]["infra_repository"]) == (BUILDER, INFRA)
    assert f"verify . --repo {source_repo} --tag {TAG} --infra-repo {INFRA} --builder {BUILDER}" in body2
    for infra, builder in (("other/infra", BUILDER), (INFRA, "local/benchseal@refs/heads/other"),
                           (source_repo, BUILDER)):
        with pytest.raises(CheckFailed):  # sealed for another infra repository, or by another builder: refused
            verify_release(release, repository=source_repo, tag=TAG, profile="production", infra_repository=infra,
                           builder=builder, trusted_root=root, offline=True)


def test_release_local_of_the_example_as_its_own_repository(local_home: Path, tmp_path: Path) -> None:
    """``make demo``: the example's directory released as benchseal-examples/hello-agent, its own repository
    at its own commit, the agent scored against the scripted model; every printed command ran."""
    from pipeline.core.paths import REPO_ROOT
    from pipeline.verify.release import verify_release

    dist = tmp_path / "dist"
    done = _release(local_home, dist, "--project", str(REPO_ROOT / "examples" / "hello-agent" / "benchseal.toml"),
                    "--scripted-model", "right", "--json", tag="v0.1.0")
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["status"] == "SUCCEEDED" and report["score"] == 1.0
    checkout = local_home / "sources" / "hello-agent"
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "refs/tags/v0.1.0"], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert report["source"] == {"repository": "benchseal-examples/hello-agent", "tag": "v0.1.0", "commit": commit}
    assert commit != subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                                    text=True, check=True).stdout.strip()
    release = dist / "v0.1.0"
    summary = json.loads((release / "summary.json").read_text())
    assert summary["agent"]["release"]["source_commit"] == commit
    # The agent's model usage as the worker's relay counted it (never the agent's own report; it was None here):
    # each trial called the model (a tool call, then its answer; the tamper canary's trial too, never scored),
    # and the totals are the trials'.
    usage, trials = summary["model_usage"], summary["timings"]["trials"]
    assert usage is not None and usage["trials"] == len(trials) == summary["counts"]["total"] + 1, usage
    assert all(t["model_calls"] >= 2 and t["input_tokens"] > t["output_tokens"] > 0 for t in trials), trials
    assert [usage[k] for k in ("model_calls", "input_tokens", "output_tokens")] == [
        sum(t[k] for t in trials) for k in ("model_calls", "input_tokens", "output_tokens")]
    assert markdown_cell(f"{usage['model_calls']} model calls, {usage['input_tokens']} input / "
                         f"{usage['output_tokens']} output tokens") in (release / "body.md").read_text()
    body = (release / "body.md").read_text()
    assert (f"benchseal verify . --repo benchseal-examples/hello-agent --tag v0.1.0 --infra-repo {INFRA} "
            f"--builder {BUILDER} ") in body
    # 8 blob checks and the runner's test-result attestation, all by the seal job
    assert body.count(f"--certificate-identity {SEAL_IDENTITY} ") == 9
    assert body.count(f"--certificate-github-workflow-repository {INFRA} --certificate-github-workflow-ref "
                      "refs/heads/main") == 9
    assert body.count(f"--certificate-identity {IMAGE_IDENTITY} ") == 6
    assert body.count("--certificate-github-workflow-repository benchseal-examples/hello-agent "
                      f"--certificate-github-workflow-ref refs/tags/v0.1.0 --certificate-github-workflow-sha {commit}") == 6
    # sha256sum, 8 blob checks, benchseal verify, 6 image checks, the runner's test-result attestation, gh's
    # checks of the same attestations (the evidence's provenance and test result, each image's provenance), and
    # gh's of each image's provenance and SBOM and of the runner's test result from the registry (--bundle-from-oci)
    assert len(report["verified"]["cosign_commands"]) == 26
    gh_lines = [c for c in report["verified"]["cosign_commands"]
                if " attestation verify " in c and " --bundle-from-oci " not in c]
    assert len(gh_lines) == 4 and all(f"--repo {INFRA} --cert-identity {SEAL_IDENTITY} --source-ref refs/heads/main "
                                      in c for c in gh_lines), gh_lines
    oci_lines = [c for c in report["verified"]["cosign_commands"] if " --bundle-from-oci " in c]
    assert len(oci_lines) == 5 and all(
        f"--repo benchseal-examples/hello-agent --cert-identity {IMAGE_IDENTITY} --source-ref refs/tags/v0.1.0 "
        f"--source-digest {commit} " in c for c in oci_lines[:4]), oci_lines
    # the runner's test result, by the seal job (run as printed once attached, like the others)
    assert f"--repo {INFRA} --cert-identity {SEAL_IDENTITY} --source-ref refs/heads/main " in oci_lines[4]
    assert "--predicate-type https://in-toto.io/attestation/test-result/v0.1 " in oci_lines[4]
    # the four checks, the first again in the short form, and the images' five
    assert body.count("gh attestation verify ") == 10
    verified = verify_release(release, repository="benchseal-examples/hello-agent", tag="v0.1.0", profile="production",
                              infra_repository=INFRA, builder=BUILDER, offline=True,
                              trusted_root=local_home / "sigstore" / "trusted_root.json")
    assert verified.commit == commit


@pytest.fixture(scope="module")
def gate_home(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile) -> Iterator[Path]:
    """A home of its own: the repository's history starts empty."""
    with fresh_home(tmp_path_factory, "gate-home") as home:
        yield home


def test_a_regression_is_published_with_its_result_but_gated_naming_the_tasks(gate_home: Path, tmp_path: Path) -> None:
    """The gate with a real sequence (issue 26 point 3): a release scored right (oracle: 1.0), then one scored
    wrong (nop: 0.0) is published and verified, but `release --local` exits 1 naming the regressed tasks; the
    next good release is compared with the last ungated one, not with the gated one."""
    from pipeline.core.contracts import canonical_repository
    from pipeline.infra.queue.sqlite import SqliteQueue

    dist = tmp_path / "dist"
    right = _release(gate_home, dist, "--agent", "oracle", "--json", tag="v0.0.1-gate")
    assert right.returncode == 0, right.stderr[-3000:]
    first = json.loads(right.stdout)
    assert first["score"] == 1.0 and first["comparison"]["previous"] is None

    wrong = _release(gate_home, dist, "--agent", "nop", "--json", tag="v0.0.2-gate")
    assert wrong.returncode == 1, wrong.stderr[-3000:]
    gated = json.loads(wrong.stdout)
    assert gated["status"] == "SUCCEEDED" and gated["score"] == 0.0
    comparison = gated["comparison"]
    assert comparison["gated"] is True and comparison["previous"]["tag"] == "v0.0.1-gate"
    assert comparison["previous"]["run_id"] == first["run_id"] and comparison["score_delta"] == -1.0
    regressed = [c["task"] for c in comparison["changed"] if c["change"] == "regressed"]
    assert len(regressed) == 3, comparison
    error = [line for line in wrong.stderr.splitlines() if line.startswith("benchseal: error: ")]
    assert error == [f"benchseal: error: release v0.0.2-gate is gated (published, not promoted): "
                     f"{'; '.join(comparison['reasons'])}"], wrong.stderr[-2000:]
    assert f"failing now: {', '.join(regressed)}" in error[0]
    # Published with its result and verified like any release; the body names the gate and the tasks.
    body = (dist / "v0.0.2-gate" / "body.md").read_text()
    assert "| Regression gate | **GATED** (published, not promoted): " in body
    assert all(markdown_cell(task) in body for task in regressed)
    assert gated["verified"]["tag"] == "v0.0.2-gate"
    summary = json.loads((dist / "v0.0.2-gate" / "summary.json").read_text())
    assert summary["comparison"] == comparison

    again = _release(gate_home, dist, "--agent", "oracle", "--json", tag="v0.0.3-gate")
    assert again.returncode == 0, again.stderr[-3000:]
    third = json.loads(again.stdout)["comparison"]
    assert third["previous"]["run_id"] == first["run_id"] and not third["gated"] and third["changed"] == []

    with SqliteQueue(gate_home / "infra" / "queue.sqlite3") as queue:
        history = queue.history(canonical_repository(first["source"]["repository"]))
    assert [(e.tag, e.gated, e.summary_digest is not None) for e in history] == [
        ("v0.0.1-gate", False, True), ("v0.0.2-gate", True, True), ("v0.0.3-gate", False, True)]
