"""Issue 37.4 and 37.5 on a real sealed and published release: the logs behind the score are one signed
archive a consumer checks with ``sha256sum -c``, nothing published carries the infra host's path or a
secret (a canary of each is seeded into the run dir), and a release signed by a private instance
carries its root in each tool's form, named by the body's commands, each form accepted by its tool.

Real parts: the session's private Sigstore instance and signer, the evidence images in the local
registry, write_evidence, the publisher's own bundle (outbox.prepare_bundle) and LocalTarget, tar,
sha256sum, cosign and sigstore-python's CLI, benchseal verify.
"""

from __future__ import annotations

import base64
import gzip
import json
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pipeline.core.contracts import PublicationRequest
from pipeline.core.errors import ChecksumMismatch
from pipeline.core.evidence_archive import archive_bytes
from pipeline.core.fsutil import sha256_file
from pipeline.core.layout import (
    CHECKSUMS,
    CLIENT_TRUST_CONFIG,
    EVIDENCE_ARCHIVE,
    NESTED_SUMS,
    SUMMARY,
    TRUSTED_ROOT,
    TRUSTED_ROOT_LINES,
    bundle_name,
    checksummed_files,
    render_checksums,
)
from pipeline.evidence.signing import Signer
from pipeline.evidence.writer import write_evidence
from pipeline.infra.intake.policy import load_policy
from pipeline.publish.outbox import prepare_bundle
from pipeline.publish.seal import seal_run
from pipeline.publish.targets import LocalTarget
from pipeline.verify.external import cosign_verify
from pipeline.verify.release import verify_release
from tests.fixtures.sigstore import make_inputs
from tests.fixtures.trials import evidence_for, policy_file, write_comparison

pytestmark = pytest.mark.slow
HOST = "/srv/canary-host-5e1d/benchseal"  # the infra host's state dir: must appear nowhere published
SECRET = "sk-canary-9f8e7d6c5b4a39281706"  # the policy's secret_env value: likewise


def _seed(evidence: Path, run_id: str, trials: list[str]) -> None:
    """Where Harbor and the runner put the host's paths (result.json, config.json, runner.log) and where an
    agent could leak its key (its log, its trajectory), for every trial."""
    run = f"{HOST}/infra/runs/{run_id}"
    for trial in trials:
        result = evidence / "harbor" / trial / "result.json"
        data = json.loads(result.read_text())
        data |= {"trial_uri": f"file://{run}/batches/0000-aa/harbor/{trial}",
                 "task": {"path": f"{run}/batches/0000-aa/suite/{trial.partition('__')[0]}"},
                 "config": {"trials_dir": f"{run}/batches/0000-aa/harbor"}}
        result.write_text(json.dumps(data, indent=2))
        (evidence / "harbor" / trial / "config.json").write_text(json.dumps({"trials_dir": f"{run}/batches/0000-aa/harbor"}))
        (evidence / "harbor" / trial / "agent").mkdir(exist_ok=True)
        (evidence / "harbor" / trial / "agent" / "trajectory.json").write_text(
            json.dumps([{"role": "tool", "content": f"OPENAI_API_KEY={SECRET}"}]))
        (evidence / "harbor" / trial / "agent" / "agent.log").write_text(f"auth: Bearer {SECRET}\ncwd {run}\n")
        # The rootless engine's error names a directory above the run dir, not the run dir itself.
        (evidence / "harbor" / trial / "exception.txt").write_text(
            f"could not start the agent's container: mkdir {HOST.rpartition('/')[0]}: permission denied\n")
    logs = evidence / "batches" / "0000-aa" / "logs"
    logs.mkdir(parents=True)
    (logs / "runner.log").write_text(f"ran {len(trials)} trials into {run}/batches/0000-aa/harbor\n")


def _leaks(data: bytes) -> list[str]:
    return [what for what, needle in (("host path", HOST.rpartition("/")[0].encode()), ("secret", SECRET.encode()))
            if needle in data]


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, evidence_images: dict[str, str], signer_v1: Signer,
              sigstore_instance: object) -> tuple[Path, Path]:
    """(run's artifacts dir, the published release dir) of a canary-seeded run."""
    run_dir = tmp_path_factory.mktemp("canary-run")
    grading, payload = make_inputs(evidence_images)
    evidence_for(grading, run_dir / "artifacts" / "evidence")
    _seed(run_dir / "artifacts" / "evidence", grading.run_id, [t.trial_name for t in grading.trials])
    artifacts = write_evidence(run_dir, grading, payload, signer=signer_v1, secrets=[SECRET]).artifacts
    dist = tmp_path_factory.mktemp("dist")
    request = PublicationRequest(run_id=grading.run_id, target="local", tag="v9.9.9", artifacts_dir=str(artifacts),
                                 options={"trigger": "tag", "root": str(dist), "repository": "acme/widget",
                                          "trusted_root": str(sigstore_instance.trusted_root)})  # type: ignore[attr-defined]
    result = LocalTarget(dist).publish(prepare_bundle(request))
    return artifacts, Path(result.location)


def test_nothing_published_carries_the_host_path_or_the_secret(published: tuple[Path, Path],
                                                               tmp_path_factory: pytest.TempPathFactory,
                                                               sigstore_instance: object) -> None:
    artifacts, release = published
    files = sorted(p for p in release.iterdir())
    assert {EVIDENCE_ARCHIVE, NESTED_SUMS, TRUSTED_ROOT, TRUSTED_ROOT_LINES, CLIENT_TRUST_CONFIG} <= {p.name for p in files}
    # Beyond the seeded canary, every other host directory this release was made from: the test's temp root (the
    # run dir, the publish root) and the Sigstore instance's state (its root file's directory).
    host_dirs = [str(tmp_path_factory.getbasetemp()),
                 str(Path(sigstore_instance.trusted_root).parent)]  # type: ignore[attr-defined]
    for path in files:  # every asset, SHA256SUMS and the bundles, and body.md
        assert path.is_file() and not _leaks(path.read_bytes()), (path.name, _leaks(path.read_bytes()))
        found = [d for d in host_dirs if d.encode() in path.read_bytes()]
        assert not found, (path.name, found)
    with tarfile.open(release / EVIDENCE_ARCHIVE, mode="r:gz") as tar:
        members = tar.getmembers()
        for member in members:
            handle = tar.extractfile(member)
            assert handle is not None
            assert not _leaks(handle.read()), member.name
    names = {m.name for m in members}
    assert {f"evidence/harbor/{t}/agent/agent.log" for t in ("hello__evidence0001", "fail__evidence0001")} <= names
    assert "evidence/batches/0000-aa/logs/runner.log" in names
    # Rewritten, not dropped: the paths are now relative to the run, the key redacted.
    log = (artifacts / "evidence/batches/0000-aa/logs/runner.log").read_text()
    assert log == "ran 2 trials into batches/0000-aa/harbor\n"
    agent_log = (artifacts / "evidence/harbor/hello__evidence0001/agent/agent.log").read_text()
    assert agent_log == "auth: Bearer [REDACTED]\ncwd .\n"
    exception = (artifacts / "evidence/harbor/hello__evidence0001/exception.txt").read_text()
    assert exception == "could not start the agent's container: mkdir [HOST]: permission denied\n"
    # trial-results.json carries the rewritten result.json, byte for byte (what verify grades).
    embedded = {f["name"]: base64.b64decode(f["content"])
                for f in json.loads((release / "trial-results.json").read_text())["files"]}
    result = "evidence/harbor/hello__evidence0001/result.json"
    assert embedded[result] == (artifacts / result).read_bytes()
    assert json.loads(embedded[result])["task"]["path"] == "batches/0000-aa/suite/hello"


def test_a_consumer_checks_the_logs_with_sha256sum(published: tuple[Path, Path], tmp_path: Path) -> None:
    _, release = published
    for name in (EVIDENCE_ARCHIVE, NESTED_SUMS, CHECKSUMS):
        (tmp_path / name).write_bytes((release / name).read_bytes())
    assert f"  {EVIDENCE_ARCHIVE}\n" in (release / CHECKSUMS).read_text()  # signed through SHA256SUMS
    subprocess.run(["tar", "-xzf", EVIDENCE_ARCHIVE], cwd=tmp_path, check=True)
    done = subprocess.run(["sha256sum", "--strict", "-c", NESTED_SUMS], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and "FAILED" not in done.stdout, done.stdout + done.stderr
    body = (release / "body.md").read_text()
    assert f"tar -xzf {EVIDENCE_ARCHIVE} && sha256sum -c {NESTED_SUMS}" in body


def test_the_body_names_the_published_trust_files_and_each_tool_takes_its_form(published: tuple[Path, Path],
                                                                               sigstore_instance: object,
                                                                               signer_v1: Signer) -> None:
    _, release = published
    body = (release / "body.md").read_text()
    state = str(sigstore_instance.state)  # type: ignore[attr-defined]
    commands = [line for line in body.splitlines() if line.startswith(("cosign verify-blob", "benchseal verify"))]
    assert commands and all(f"--trusted-root {TRUSTED_ROOT} " in line for line in commands)
    assert not any(state in line for line in commands)  # no path of the publishing host in them
    # Only the legacy image-signature lines still name the instance's PEM files (cosign reads no root for them).
    assert [line for line in body.splitlines() if state in line and not line.startswith("env SIGSTORE_")] == []
    for name in (TRUSTED_ROOT, TRUSTED_ROOT_LINES, CLIENT_TRUST_CONFIG):
        assert f"`{name}`" in body
    root = json.loads((release / TRUSTED_ROOT).read_text())
    assert root == json.loads(Path(sigstore_instance.trusted_root).read_text())  # type: ignore[attr-defined]
    lines = (release / TRUSTED_ROOT_LINES).read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == root  # JSON Lines: gh's form
    assert json.loads((release / CLIENT_TRUST_CONFIG).read_text())["trustedRoot"] == root
    # cosign with the published JSON root; sigstore-python's own CLI with the published ClientTrustConfig.
    outcome = cosign_verify(release / SUMMARY, release / bundle_name(SUMMARY), signer_v1.identity, signer_v1.issuer,
                            trusted_root=release / TRUSTED_ROOT)
    assert outcome.ok, outcome
    def sigstore_python(identity: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "sigstore", "--trust-config", CLIENT_TRUST_CONFIG, "verify", "identity",
                "--offline", "--cert-identity", identity, "--cert-oidc-issuer", signer_v1.issuer,
                "--bundle", bundle_name(SUMMARY), SUMMARY]
        return subprocess.run(argv, cwd=release, capture_output=True, text=True, check=False)

    good = sigstore_python(signer_v1.identity)
    assert good.returncode == 0, shlex.join(good.args) + "\n" + good.stderr
    assert sigstore_python("someone-else@example.com").returncode == 1


def test_verify_accepts_it_and_refuses_an_archive_evidence_sha256sums_does_not_describe(
        published: tuple[Path, Path], signer_v1: Signer, tmp_path: Path) -> None:
    _, release = published
    root = release / TRUSTED_ROOT
    verify_release(release, repository="acme/widget", tag="v9.9.9", trusted_root=root, offline=True)
    # A release signed as honestly as any, whose archive lacks a file: only the archive check can say so.
    forged = tmp_path / "forged"
    shutil.copytree(release, forged)
    (forged / "body.md").unlink()
    (forged / EVIDENCE_ARCHIVE).write_bytes(archive_bytes(published[0], ["evidence/trials.json"]))
    (forged / CHECKSUMS).write_text(render_checksums([(sha256_file(p), p.name) for p in checksummed_files(forged)]))
    signer_v1.sign_file(forged / CHECKSUMS)
    with pytest.raises(ChecksumMismatch) as caught:
        verify_release(forged, repository="acme/widget", tag="v9.9.9", trusted_root=root, offline=True)
    assert caught.value.subject == EVIDENCE_ARCHIVE and "lacks evidence/" in str(caught.value)


def test_the_seal_job_redacts_the_policy_secret_values_it_holds(tmp_path: Path, evidence_images: dict[str, str],
                                                                 signer_v1: Signer,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """seal_run takes the values of the infra policy's secret_env from its own environment (the local release
    and the worker's finalizer run where the agent's key is set): without that wiring the canary is signed."""
    policy = load_policy(policy_file(tmp_path / "infra.yaml", {"acme/widget": {
        "runner": evidence_images["runner"], "api": evidence_images["api"]}}))
    assert policy.secret_env, "the shipped policy names the agent's key"
    monkeypatch.setenv(policy.secret_env[0], SECRET)
    grading, payload = make_inputs(evidence_images)
    run_dir = tmp_path / "run"
    evidence_for(grading, run_dir / "artifacts" / "evidence")
    _seed(run_dir / "artifacts" / "evidence", grading.run_id, [t.trial_name for t in grading.trials])
    status = {"run_id": grading.run_id, "correlation_id": payload.correlation_id, "state": grading.status,
              "attempts": 1, "suite": payload.suite, "agent": payload.agent,
              "source": payload.source.model_dump(mode="json"), "runner": payload.runner, "api": payload.api,
              "created_at": grading.started_at, "updated_at": grading.finished_at, "score": grading.score,
              "counts": grading.counts.model_dump(mode="json")}
    (run_dir / "run.json").write_text(json.dumps(status))
    (run_dir / "grading.json").write_text(grading.model_dump_json())
    write_comparison(run_dir, grading, policy)
    artifacts = seal_run(run_dir, signer=signer_v1, policy=policy).evidence.artifacts
    published = [p for p in artifacts.iterdir() if p.is_file()]
    assert EVIDENCE_ARCHIVE in {p.name for p in published}
    for path in published:
        data = gzip.decompress(path.read_bytes()) if path.name == EVIDENCE_ARCHIVE else path.read_bytes()
        assert not _leaks(data), (path.name, _leaks(data))
