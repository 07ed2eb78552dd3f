"""Issue 9.3: `benchseal verify` takes the expected release from the consumer, never from the files.

The consumer states repository and tag (--repo/--tag or `expect:` in a policy); the signer
identity comes from the policy with only those values filled in; afterwards summary.json must
name exactly that repository and tag.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core.errors import SignatureRefused, SourceMismatch, ValidationError
from pipeline.verify.policy import expectation, load_policy
from pipeline.verify.release import verify_release

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SOURCE_REPO, SOURCE_TAG, SOURCE_COMMIT = "acme/widget", "v9.9.9", "0123456789abcdef0123456789abcdef01234567"
FORK = "evil/fork"
# A local-instance profile whose identity depends on the repository, like production's does.
PER_REPO_IDENTITY = "https://benchseal.invalid/signers/{repository}"


def _cli(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", "verify", str(directory), *args],
                          capture_output=True, text=True, check=False, timeout=120, cwd=REPO)


def _policy(path: Path, identity: str, issuer: str, extra: str = "") -> Path:
    path.write_text("schema: benchseal.verify-policy/v1\nprofiles:\n"
                    f"  local:\n    identity: '{identity}'\n    issuer: '{issuer}'\n"
                    "  production:\n    identity: x\n    issuer: y\n" + extra)
    return path


@pytest.fixture(scope="module")
def fork_release(tmp_path_factory: pytest.TempPathFactory, evidence_images: dict[str, str],
                 sigstore_instance: object) -> Iterator[Path]:
    """A valid release of the fork: its summary names evil/fork, signed by the fork's own identity."""
    from pipeline.core.contracts import PayloadSource
    from pipeline.evidence.writer import write_evidence
    from pipeline.local.signing import local_signer
    from tests.fixtures.sigstore import make_inputs
    from tests.fixtures.trials import evidence_for

    grading, payload = make_inputs(evidence_images)
    payload = payload.model_copy(update={"source": PayloadSource(repository=FORK, commit="f" * 40, tag=SOURCE_TAG)})
    run_dir = tmp_path_factory.mktemp("fork-run")
    evidence_for(grading, run_dir / "artifacts" / "evidence")
    signer = local_signer(state=sigstore_instance.state,  # type: ignore[attr-defined]
                          subject=PER_REPO_IDENTITY.format(repository=FORK))
    try:
        result = write_evidence(run_dir, grading, payload, signer=signer)
    finally:
        signer.close()
    yield result.artifacts


def test_fork_signed_release_does_not_verify_as_the_real_repository(fork_release: Path, tmp_path: Path,
                                                                    sigstore_instance: object) -> None:
    """Old code filled {repository} from summary.json, so the fork's own signature matched."""
    root = sigstore_instance.trusted_root  # type: ignore[attr-defined]
    policy = _policy(tmp_path / "p.yaml", PER_REPO_IDENTITY, sigstore_instance.issuer)  # type: ignore[attr-defined]
    with pytest.raises(SignatureRefused) as refused:
        verify_release(fork_release, repository=SOURCE_REPO, tag=SOURCE_TAG, policy=policy, trusted_root=root)
    assert refused.value.subject == "SHA256SUMS.sigstore.json"
    done = _cli(fork_release, "--repo", SOURCE_REPO, "--tag", SOURCE_TAG, "--policy", str(policy),
                "--trusted-root", str(root))
    assert done.returncode == 1, done.stderr
    # Asking for the fork's release, explicitly, verifies it: the consumer decided.
    ok = verify_release(fork_release, repository=FORK, tag=SOURCE_TAG, policy=policy, trusted_root=root)
    assert (ok.identity, ok.repository, ok.commit) == ("https://benchseal.invalid/signers/evil/fork", FORK, "f" * 40)


def test_right_signer_but_other_repository_or_tag_in_summary(release_copy: Path, signer_v1: object,
                                                              sigstore_instance: object) -> None:
    """Signed by the expected identity (the local profile has none per repository), but the summary
    is another repository's or tag's: the source check refuses it by name."""
    root = sigstore_instance.trusted_root  # type: ignore[attr-defined]
    # Another repository, another tag, and (case matters: compared exactly) the same one in other case.
    for repository, tag in (("someone/else", SOURCE_TAG), (SOURCE_REPO, "v9.9.8"), ("Benchseal/benchseal", SOURCE_TAG)):
        with pytest.raises(SourceMismatch) as refused:
            verify_release(release_copy, repository=repository, tag=tag, trusted_root=root)
        assert refused.value.subject == "summary.json"
    done = _cli(release_copy, "--repo", "someone/else", "--tag", SOURCE_TAG, "--trusted-root", str(root))
    assert done.returncode == 1 and "source.repository" in done.stderr


def test_output_names_what_was_verified(signed_release: Path, sigstore_instance: object, signer_v1: object) -> None:
    root = str(sigstore_instance.trusted_root)  # type: ignore[attr-defined]
    done = _cli(signed_release, "--repo", SOURCE_REPO, "--tag", SOURCE_TAG, "--trusted-root", root)
    assert done.returncode == 0, done.stderr
    for line in (f"identity:   {signer_v1.identity}", f"issuer:     {signer_v1.issuer}",  # type: ignore[attr-defined]
                 f"repository: {SOURCE_REPO}", f"tag:        {SOURCE_TAG}", f"commit:     {SOURCE_COMMIT}"):
        assert line in done.stdout, done.stdout
    as_json = _cli(signed_release, "--repo", SOURCE_REPO, "--tag", SOURCE_TAG, "--trusted-root", root, "--json")
    data = json.loads(as_json.stdout)
    assert data["ok"] is True and data["commit"] == SOURCE_COMMIT and data["identity"] == signer_v1.identity  # type: ignore[attr-defined]
    assert len(data["bundles"]) == 7  # test-result.intoto.json's among them
    # --json on failure: still one object, with the exit code of the failure.
    usage = _cli(signed_release, "--tag", SOURCE_TAG, "--trusted-root", root, "--json")
    assert usage.returncode == 2 and json.loads(usage.stdout) == {
        "ok": False, "exit_code": 2, "error": json.loads(usage.stdout)["error"]}
    assert "--repo" in json.loads(usage.stdout)["error"]
    failed = _cli(signed_release, "--repo", "a/b", "--tag", SOURCE_TAG, "--trusted-root", root, "--json")
    assert failed.returncode == 1 and json.loads(failed.stdout)["ok"] is False


@pytest.mark.parametrize(("args", "named"), [
    ((), "--repo"),
    (("--tag", SOURCE_TAG), "--repo"),
    (("--repo", SOURCE_REPO), "--tag"),
    (("--repo", "benchseal", "--tag", SOURCE_TAG), "--repo"),
    (("--repo", "a/b/c", "--tag", SOURCE_TAG), "--repo"),
    (("--repo", "-a/b", "--tag", SOURCE_TAG), "--repo"),
    (("--repo", "a b/c", "--tag", SOURCE_TAG), "--repo"),
    (("--repo", "acme/widget\n::error::x", "--tag", SOURCE_TAG), "--repo"),
    (("--repo", "", "--tag", SOURCE_TAG), "--repo"),
    (("--repo", SOURCE_REPO, "--tag", ""), "--tag"),
    (("--repo", SOURCE_REPO, "--tag", "refs/tags/v9.9.9"), "--tag"),
    (("--repo", SOURCE_REPO, "--tag", "v1..2"), "--tag"),
    (("--repo", SOURCE_REPO, "--tag", "v1.lock"), "--tag"),
    (("--repo", SOURCE_REPO, "--tag", "v1 "), "--tag"),
    (("--repo", SOURCE_REPO, "--tag", "-v1"), "--tag"),
    (("--repo", SOURCE_REPO, "--tag", "v" * 200), "--tag"),
])
def test_missing_or_bad_expectation_is_a_usage_error(signed_release: Path, sigstore_instance: object,
                                                     args: tuple[str, ...], named: str) -> None:
    done = _cli(signed_release, *args, "--trusted-root", str(sigstore_instance.trusted_root))  # type: ignore[attr-defined]
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"invalid {named}:" in done.stderr
    assert "\n::error::" not in done.stderr  # the bad value is shown escaped (repr), never raw
    with pytest.raises(ValidationError):
        verify_release(signed_release, trusted_root=sigstore_instance.trusted_root,  # type: ignore[attr-defined]
                       repository=dict(zip(args[::2], args[1::2], strict=True)).get("--repo"),
                       tag=dict(zip(args[::2], args[1::2], strict=True)).get("--tag"))


def test_expectation_pinned_in_a_policy(signed_release: Path, tmp_path: Path, sigstore_instance: object,
                                        signer_v1: object) -> None:
    root = str(sigstore_instance.trusted_root)  # type: ignore[attr-defined]
    identity, issuer = signer_v1.identity, signer_v1.issuer  # type: ignore[attr-defined]
    pinned = _policy(tmp_path / "pinned.yaml", identity, issuer,
                     f"expect:\n  repository: {SOURCE_REPO}\n  tag: {SOURCE_TAG}\n")
    done = _cli(signed_release, "--policy", str(pinned), "--trusted-root", root)
    assert done.returncode == 0, done.stderr
    assert f"repository: {SOURCE_REPO}" in done.stdout
    # Same values on the command line agree; other values conflict (usage error, not a silent pick).
    assert _cli(signed_release, "--policy", str(pinned), "--repo", SOURCE_REPO, "--trusted-root", root).returncode == 0
    conflict = _cli(signed_release, "--policy", str(pinned), "--repo", "other/repo", "--trusted-root", root)
    assert conflict.returncode == 2 and "invalid --repo: differs from expect.repository" in conflict.stderr
    # Only the repository pinned: the tag must still be given.
    repo_only = _policy(tmp_path / "repo-only.yaml", identity, issuer, f"expect:\n  repository: {SOURCE_REPO}\n")
    missing = _cli(signed_release, "--policy", str(repo_only), "--trusted-root", root)
    assert missing.returncode == 2 and "invalid --tag: is required" in missing.stderr
    assert _cli(signed_release, "--policy", str(repo_only), "--tag", SOURCE_TAG, "--trusted-root", root).returncode == 0
    # A pinned expectation that the release does not meet: a failed check.
    wrong = _policy(tmp_path / "wrong.yaml", identity, issuer, f"expect:\n  repository: a/b\n  tag: {SOURCE_TAG}\n")
    refused = _cli(signed_release, "--policy", str(wrong), "--trusted-root", root)
    assert refused.returncode == 1 and "source.repository" in refused.stderr


@pytest.mark.parametrize(("identity", "extra", "rule"), [
    ("https://x/{commit}", "", "may use only the placeholders"),  # the commit would come from the artifact
    ("https://x/{source.repository}", "", "may use only the placeholders"),
    ("https://x/{repository", "", "unbalanced"),
    ("https://x/{}", "", "may use only the placeholders"),
    ("https://x/y", "expect: [a/b]\n", "expect"),
    ("https://x/y", "expect:\n  repository: nope\n", "expect.repository"),
    ("https://x/y", "expect:\n  tag: 'refs/tags/v1'\n", "expect.tag"),
    ("https://x/y", "expect:\n  commit: " + "a" * 40 + "\n", "expect"),
    ("https://x/y", "expect:\n  infra_repository: nope\n", "expect.infra_repository"),
    ("https://x/{infra}", "", "may use only the placeholders"),
    ("https://x/y", "signer: whoever\n", "unknown keys"),
])
def test_bad_policy_is_a_usage_error(tmp_path: Path, identity: str, extra: str, rule: str) -> None:
    policy = _policy(tmp_path / "p.yaml", identity, "https://issuer", extra)
    with pytest.raises(ValidationError, match=rule):
        expectation(policy, "local", repository=SOURCE_REPO, tag=SOURCE_TAG)


def test_templates_are_filled_only_from_the_expectation() -> None:
    policy = load_policy()
    assert set(policy.profiles) == {"production", "local"}
    assert policy.expect_repository is None and policy.expect_tag is None  # the project pins nothing
    builder = "benchseal/benchseal@" + "ab" * 20
    want = expectation(None, "production", repository="acme/widget", tag="v1.2.3", infra_repository="acme/bench",
                       builder=builder)
    # The builder's reusable benchmark.yml sealed it, for the infra repository on main, whatever the
    # source repository is.
    assert want.identity == f"https://github.com/benchseal/benchseal/.github/workflows/benchmark.yml@{'ab' * 20}"
    assert (want.workflow_repository, want.workflow_ref) == ("acme/bench", "refs/heads/main")
    assert want.issuer == "https://token.actions.githubusercontent.com"
    assert (want.repository, want.tag, want.infra_repository) == ("acme/widget", "v1.2.3", "acme/bench")
    assert str(want.builder) == builder
    with pytest.raises(ValidationError, match="--repo"):
        expectation(None, "production", repository=None, tag="v1.2.3", infra_repository="acme/bench", builder=builder)
    # The production profile names the infra repository and the builder: the consumer must state both.
    with pytest.raises(ValidationError, match=r"--infra-repo.*is required by the production profile"):
        expectation(None, "production", repository="acme/widget", tag="v1.2.3", builder=builder)
    with pytest.raises(ValidationError, match=r"--builder.*is required by the production profile"):
        expectation(None, "production", repository="acme/widget", tag="v1.2.3", infra_repository="acme/bench")
    with pytest.raises(ValidationError, match="--infra-repo"):
        expectation(None, "production", repository="acme/widget", tag="v1.2.3", infra_repository="not a repo",
                    builder=builder)
    # The local profile uses neither.
    local = expectation(None, "local", repository="acme/widget", tag="v1.2.3")
    assert local.infra_repository is None and local.workflow_repository is None and local.workflow_ref is None


def test_infra_repository_pinned_in_a_policy_file(tmp_path: Path) -> None:
    policy = _policy(tmp_path / "p.yaml", "https://github.com/{infra_repository}/.github/workflows/benchmark.yml@refs/heads/main",
                     "https://token.actions.githubusercontent.com", "expect:\n  infra_repository: acme/bench\n")
    want = expectation(policy, "local", repository="acme/widget", tag="v1")
    assert want.identity == "https://github.com/acme/bench/.github/workflows/benchmark.yml@refs/heads/main"
    assert expectation(policy, "local", repository="acme/widget", tag="v1", infra_repository="acme/bench") == want
    with pytest.raises(ValidationError, match=r"--infra-repo: differs from expect\.infra_repository"):
        expectation(policy, "local", repository="acme/widget", tag="v1", infra_repository="acme/other")
