"""Images signed (cosign) and attested (sigstore-python bundles as OCI referrers) as a GitHub Actions job (the private
instance's Actions token endpoint and GitHub-shaped Fulcio), and checked with exact identities."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from pipeline.attest.images import (
    BuildInvocation,
    ImageIdentityPolicy,
    ImageSigner,
    SigstoreEndpoints,
    image_identity,
    provenance_predicate,
    verify_image,
)
from pipeline.core.contracts import GITHUB_ISSUER
from pipeline.core.digests import parse_ref
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.local import sigstore as sigstore_local
from pipeline.local.sigstore import GitHubJob
from tests.fixtures.sigstore import push_unique_image

COMMIT = "c" * 40
JOB = GitHubJob(repository="acme/app", ref="refs/tags/v1.2.3", sha=COMMIT, workflow_file="tag.yml")
FORK_JOB = GitHubJob(repository="fork/app", ref="refs/tags/v1.2.3", sha="c" * 40, workflow_file="tag.yml")
INVOCATION = BuildInvocation(repository="acme/app", ref="refs/tags/v1.2.3", commit="c" * 40,
                             workflow_ref="acme/app/.github/workflows/tag.yml@refs/tags/v1.2.3",
                             run_url="https://github.com/acme/app/actions/runs/42/attempts/1")


def _unique_image(label: str) -> str:
    return push_unique_image(f"benchseal-attest-test/{label}", label)


@pytest.fixture(scope="module")
def endpoints(sigstore_instance: object) -> SigstoreEndpoints:
    return SigstoreEndpoints.private(sigstore_instance.url, sigstore_instance.trusted_root)  # type: ignore[attr-defined]


def _as_job(monkeypatch: pytest.MonkeyPatch, instance: object, job: GitHubJob) -> None:
    """This process becomes that job's Actions runner: its token-request environment."""
    for key, value in sigstore_local.open_actions_session(instance, job).environ().items():  # type: ignore[arg-type]
        monkeypatch.setenv(key, value)


def _sign(ref: str, endpoints: SigstoreEndpoints, tmp_path: Path) -> None:
    sbom = tmp_path / "sbom.cdx.json"
    sbom.write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1, "components": []}))
    predicate = provenance_predicate(parse_ref(ref), "runner", INVOCATION)
    ImageSigner(endpoints, allow_http_registry=True).sign_and_attest(ref, provenance=predicate, sbom=sbom)


@pytest.fixture(scope="module")
def signed_image(sigstore_instance: object, endpoints: SigstoreEndpoints, tmp_path_factory: pytest.TempPathFactory) -> str:
    ref = _unique_image("signed")
    with pytest.MonkeyPatch.context() as mp:
        _as_job(mp, sigstore_instance, JOB)
        _sign(ref, endpoints, tmp_path_factory.mktemp("attest"))
    return ref


def test_exact_identity_verifies_signature_and_both_attestations(signed_image: str, endpoints: SigstoreEndpoints) -> None:
    verify_image(signed_image, image_identity("acme/app", "v1.2.3", COMMIT), endpoints,
                 allow_http_registry=True)


@pytest.mark.parametrize("policy", [
    image_identity("fork/app", "v1.2.3", COMMIT),  # another repository
    image_identity("acme/app", "v1.2.4", COMMIT),  # another tag
    image_identity("acme/app", "v1.2.3", COMMIT, workflow="other.yml"),  # another workflow
    image_identity("acme/app", "v1.2.3", "d" * 40),  # another commit (the tag pushed again elsewhere)
    image_identity("acme/app", "v1.2.3", COMMIT, ref="refs/heads/main"),  # another ref
    dataclasses.replace(image_identity("acme/app", "v1.2.3", COMMIT), issuer=sigstore_local.LOCAL_ISSUER),
    # each GitHub extension must match too, whatever the identity says
    dataclasses.replace(image_identity("acme/app", "v1.2.3", COMMIT), repository="acme/app2"),
    dataclasses.replace(image_identity("acme/app", "v1.2.3", COMMIT), ref="refs/tags/v1.2.4"),
    dataclasses.replace(image_identity("acme/app", "v1.2.3", COMMIT), sha=COMMIT.upper()),
    dataclasses.replace(image_identity("acme/app", "v1.2.3", COMMIT), sha=COMMIT[:7]),
], ids=["repository", "tag", "workflow", "commit", "ref", "issuer", "repository-extension", "ref-extension",
        "upper-case-sha", "sha-prefix"])
def test_any_other_identity_is_refused(signed_image: str, endpoints: SigstoreEndpoints, policy: ImageIdentityPolicy) -> None:
    with pytest.raises(CheckFailed, match="not verified"):
        verify_image(signed_image, policy, endpoints, allow_http_registry=True)


def test_unsigned_image_is_refused(endpoints: SigstoreEndpoints) -> None:
    with pytest.raises(CheckFailed, match="signature by"):
        verify_image(_unique_image("unsigned"), image_identity("acme/app", "v1.2.3", COMMIT), endpoints,
                     allow_http_registry=True)


def test_image_signed_by_a_forks_workflow_is_refused(sigstore_instance: object, endpoints: SigstoreEndpoints,
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = _unique_image("fork")
    _as_job(monkeypatch, sigstore_instance, FORK_JOB)
    _sign(ref, endpoints, tmp_path)
    verify_image(ref, image_identity("fork/app", "v1.2.3", COMMIT), endpoints, allow_http_registry=True)
    with pytest.raises(CheckFailed):
        verify_image(ref, image_identity("acme/app", "v1.2.3", COMMIT), endpoints, allow_http_registry=True)


def test_explicit_actions_environment_and_no_token_in_argv(sigstore_instance: object, endpoints: SigstoreEndpoints,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's token-request environment handed over explicitly (how release --local runs the
    build job's signing) works like the process environment, and the request token never shows
    in any process's argv while cosign runs."""
    import threading

    monkeypatch.delenv("ACTIONS_ID_TOKEN_REQUEST_URL", raising=False)
    monkeypatch.delenv("ACTIONS_ID_TOKEN_REQUEST_TOKEN", raising=False)
    session = sigstore_local.open_actions_session(sigstore_instance, JOB)  # type: ignore[arg-type]
    ref = _unique_image("explicit")
    seen: list[bytes] = []
    stop = threading.Event()

    def scan() -> None:
        while not stop.is_set():
            for proc in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    seen.append(proc.read_bytes())
                except OSError:
                    pass
            stop.wait(0.05)

    scanner = threading.Thread(target=scan)
    scanner.start()
    try:
        sbom = tmp_path / "sbom.cdx.json"
        sbom.write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1}))
        ImageSigner(endpoints, allow_http_registry=True, actions_env=session.environ()).sign_and_attest(
            ref, provenance=provenance_predicate(parse_ref(ref), "api", INVOCATION), sbom=sbom)
    finally:
        stop.set()
        scanner.join()
    assert any(b"cosign" in line for line in seen), "the scan never saw cosign run"
    assert not any(session.request_token.encode() in line for line in seen)
    verify_image(ref, image_identity("acme/app", "v1.2.3", COMMIT), endpoints, allow_http_registry=True)


def test_cosign_cli_as_a_consumer_runs_it(signed_image: str, endpoints: SigstoreEndpoints, cosign_bin: Path,
                                          tmp_path: Path) -> None:
    """The consumer's own command (the attestations are Sigstore bundles attached as OCI referrers: cosign's
    new bundle format), with the provenance's builder checked from the attestation."""
    env = {**os.environ, **endpoints.environ(tmp_path)}
    identity = ["--certificate-identity", JOB.identity, "--certificate-oidc-issuer", GITHUB_ISSUER,
                "--trusted-root", str(endpoints.trusted_root), "--offline", "--allow-http-registry"]
    done = subprocess.run([str(cosign_bin), "verify-attestation", "--new-bundle-format", "--type",
                           "https://slsa.dev/provenance/v1", *identity, signed_image],
                          env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    import base64

    statement = json.loads(base64.b64decode(json.loads(done.stdout.splitlines()[0])["payload"]))
    assert statement["predicate"]["runDetails"]["builder"]["id"] == INVOCATION.builder_id
    assert statement["subject"][0]["digest"]["sha256"] == parse_ref(signed_image).digest.removeprefix("sha256:")


def test_signing_needs_an_ambient_credential(endpoints: SigstoreEndpoints, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACTIONS_ID_TOKEN_REQUEST_URL", raising=False)
    monkeypatch.delenv("ACTIONS_ID_TOKEN_REQUEST_TOKEN", raising=False)
    with pytest.raises(InfrastructureError, match="no ambient OIDC credential"):
        _sign(_unique_image("nocred"), endpoints, tmp_path)


@pytest.mark.parametrize("url", ["http://10.0.0.1:5000", "https://127.0.0.1:1", "http://127.0.0.1:80/x", "http://localhost:1"])
def test_private_endpoints_are_loopback_only(url: str, tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        SigstoreEndpoints.private(url, tmp_path / "root.json")


def test_invocation_comes_from_the_actions_environment() -> None:
    env = {"GITHUB_REPOSITORY": "acme/app", "GITHUB_REF": "refs/tags/v1", "GITHUB_SHA": "d" * 40,
           "GITHUB_WORKFLOW_REF": "acme/app/.github/workflows/tag.yml@refs/tags/v1", "GITHUB_RUN_ID": "7"}
    invocation = BuildInvocation.from_actions_env(env)
    assert invocation.builder_id == "https://github.com/acme/app/.github/workflows/tag.yml@refs/tags/v1"
    assert invocation.run_url == "https://github.com/acme/app/actions/runs/7/attempts/1"
    for missing in env:
        with pytest.raises(ValidationError, match=missing):
            BuildInvocation.from_actions_env({k: v for k, v in env.items() if k != missing})


@pytest.mark.parametrize(("repo", "tag", "workflow", "commit", "ref"), [
    ("acme", "v1", "tag.yml", COMMIT, "tag"), ("acme/app/x", "v1", "tag.yml", COMMIT, "tag"),
    ("acme/app", "", "tag.yml", COMMIT, "tag"), ("acme/app", "v1\n::error::x", "tag.yml", COMMIT, "tag"),
    ("acme/app", "v1", "../tag.yml", COMMIT, "tag"), ("acme/app", "v1", "tag.sh", COMMIT, "tag"),
    # the commit is always required, as the certificate carries it: 40 lowercase hex
    ("acme/app", "v1", "tag.yml", "", "tag"), ("acme/app", "v1", "tag.yml", COMMIT.upper(), "tag"),
    ("acme/app", "v1", "tag.yml", COMMIT[:7], "tag"), ("acme/app", "v1", "tag.yml", COMMIT + "0", "tag"),
    ("acme/app", "v1", "tag.yml", COMMIT + "\n", "tag"), ("acme/app", "v1", "tag.yml", " " + COMMIT[1:], "tag"),
    # one exact ref, never a pattern
    ("acme/app", "v1", "tag.yml", COMMIT, "refs/heads/*"), ("acme/app", "v1", "tag.yml", COMMIT, "main"),
    ("acme/app", "v1", "tag.yml", COMMIT, "refs/heads/../main"), ("acme/app", "v1", "tag.yml", COMMIT, "refs/pull/1/merge"),
])
def test_image_identity_validates_its_inputs(repo: str, tag: str, workflow: str, commit: str, ref: str) -> None:
    with pytest.raises(ValidationError):
        image_identity(repo, tag, commit, workflow=workflow, ref=ref)


@pytest.mark.parametrize("ref", ["tag", "refs/heads/main", "refs/tags/v1.0.0"])
def test_every_signer_kind_pins_repository_ref_and_commit(ref: str) -> None:
    policy = image_identity("acme/app", "v1.2.3", COMMIT, workflow="runner-release.yml", ref=ref)
    exact = "refs/tags/v1.2.3" if ref == "tag" else ref
    assert policy.identity == f"https://github.com/acme/app/.github/workflows/runner-release.yml@{exact}"
    flags = policy.flags()
    pins = {flags[i]: flags[i + 1] for i in range(0, len(flags), 2)}
    assert pins == {"--certificate-identity": policy.identity, "--certificate-oidc-issuer": GITHUB_ISSUER,
                    "--certificate-github-workflow-repository": "acme/app",
                    "--certificate-github-workflow-ref": exact, "--certificate-github-workflow-sha": COMMIT}


def test_verify_image_cli(signed_image: str, sigstore_instance: object) -> None:
    from typer.testing import CliRunner

    from pipeline.cli.main import app

    root = str(sigstore_instance.trusted_root)  # type: ignore[attr-defined]
    url = sigstore_instance.url  # type: ignore[attr-defined]
    base = ["verify-image", signed_image, "--sigstore-url", url, "--trusted-root", root, "--allow-http-registry"]
    ok = CliRunner().invoke(app, [*base, "--repo", "acme/app", "--tag", "v1.2.3", "--commit", COMMIT])
    assert ok.exit_code == 0, ok.output
    assert ("signed and attested by https://github.com/acme/app/.github/workflows/tag.yml@refs/tags/v1.2.3 at commit "
            + COMMIT) in ok.output
    for wrong_args in (["--repo", "acme/other", "--tag", "v1.2.3", "--commit", COMMIT],
                       ["--repo", "acme/app", "--tag", "v1.2.3", "--commit", "d" * 40]):
        wrong = CliRunner().invoke(app, [*base, *wrong_args])
        assert wrong.exit_code == 1 and isinstance(wrong.exception, CheckFailed), wrong_args
    half = CliRunner().invoke(app, ["verify-image", signed_image, "--sigstore-url", url, "--repo", "acme/app", "--tag", "v1",
                                    "--commit", COMMIT])
    assert isinstance(half.exception, ValidationError) and half.exception.exit_code == 2
    # The commit is part of the expectation: without it, nothing is checked (usage error).
    no_commit = CliRunner().invoke(app, [*base, "--repo", "acme/app", "--tag", "v1.2.3"])
    assert no_commit.exit_code == 2 and "--commit" in no_commit.output
