"""Issue 25: evidence sealed by a builder's reusable workflow. The consumer pins the builder (benchseal's
repository at one exact ref: ``--builder OWNER/REPO@REF``) AND the infra repository it sealed for
(``--infra-repo``): the certificate's identity must be the builder's benchmark.yml job_workflow_ref and
its workflow repository and ref (legacy 1.5 / 1.6 and source repository URI / ref 1.12 / 1.14) the infra
repository on main.

Every forgery is signed for real by the private Sigstore instance (GitHub-shaped certificates, as
public-good Fulcio issues them for a reusable workflow) and refused by all three verifiers:
sigstore-python (``benchseal verify``), sigstore-js (``pipeline/verify/sigstore_js_verify.js``) and the
real cosign running the lines the release body prints.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.layout import CHECKSUMS, is_statement
from pipeline.local.sigstore import GitHubJob
from pipeline.verify.external import cosign_commands, local_benchseal, sigstore_js_jobs, sigstore_js_verify
from pipeline.verify.policy import Builder, expectation, load_policy, parse_builder
from pipeline.verify.release import verify_release
from tests.attest.test_builder_identity import BUILDER_SHA

REPO = Path(__file__).resolve().parents[2]
SOURCE_REPO, SOURCE_TAG = "acme/widget", "v9.9.9"  # what tests.fixtures.sigstore.make_inputs releases
INFRA = "acme/bench-infra"
BUILDER = Builder("benchseal/benchseal", BUILDER_SHA)  # the builder tests/attest/test_builder_identity.py signs as


def seal_job(**changes: Any) -> GitHubJob:
    """The seal job of the builder's benchmark.yml, called by INFRA's workflow on main (``changes``: a forgery)."""
    job: dict[str, Any] = {"repository": INFRA, "ref": "refs/heads/main", "sha": "e" * 40,
                           "workflow_file": "benchmark.yml", "event_name": "workflow_dispatch",
                           "workflow_repository": BUILDER.repository, "workflow_ref": BUILDER.ref,
                           "workflow_sha": BUILDER.ref, "caller_workflow_file": "benchmark.yml"}
    return GitHubJob(**{**job, **changes})


def resign(directory: Path, job: GitHubJob, state: Path) -> Path:
    """Every bundle of ``directory`` signed again as ``job`` (statements as DSSE), then SHA256SUMS."""
    from pipeline.evidence.writer import reseal
    from pipeline.local.signing import local_signer

    signer = local_signer(state=state, github_job=job)
    try:
        for bundle in sorted(directory.glob("*.sigstore.json")):
            target = directory / bundle.name.removesuffix(".sigstore.json")
            if target.name != CHECKSUMS:
                (signer.sign_statement if is_statement(target.name) else signer.sign_file)(target)
        reseal(directory, signer=signer)
    finally:
        signer.close()
    return directory


def sealed_as(source: Path, dest: Path, job: GitHubJob, sigstore_instance: Any) -> Path:
    shutil.copytree(source, dest)
    return resign(dest, job, sigstore_instance.state)


@pytest.fixture(scope="module")
def builder_release(tmp_path_factory: pytest.TempPathFactory, signed_release: Path, sigstore_instance: Any) -> Path:
    """The signed release of acme/widget v9.9.9, sealed by BUILDER's benchmark.yml for INFRA on main."""
    return sealed_as(signed_release, tmp_path_factory.mktemp("builder") / "release", seal_job(), sigstore_instance)


def _python(directory: Path, root: Path) -> tuple[bool, str]:
    try:
        verify_release(directory, repository=SOURCE_REPO, tag=SOURCE_TAG, infra_repository=INFRA, builder=BUILDER,
                       trusted_root=root, offline=True, profile="production")
    except CheckFailed as exc:
        return False, str(exc)
    return True, ""


def _js(directory: Path, root: Path) -> tuple[bool, str]:
    expect = expectation(None, "production", repository=SOURCE_REPO, tag=SOURCE_TAG, infra_repository=INFRA,
                         builder=BUILDER)
    results = sigstore_js_verify(root, sigstore_js_jobs(directory, expect))
    return all(r.ok for r in results), "; ".join(r.output for r in results if not r.ok)


def _cosign(directory: Path, root: Path, cosign: Path) -> tuple[bool, str]:
    """The cosign lines the body prints (the benchseal line, sigstore-python, is checked by _python)."""
    lines = cosign_commands(directory, repository=SOURCE_REPO, tag=SOURCE_TAG, trusted_root=root,
                            profile="production", cosign=str(cosign), infra_repository=INFRA, builder=BUILDER)
    assert shlex.split(lines[-1])[1:3] == ["verify", "."]
    for line in lines[1:-1]:
        done = subprocess.run(shlex.split(line), cwd=directory, capture_output=True, text=True, check=False,
                              timeout=60)
        if done.returncode != 0:
            return False, f"{line}: {(done.stderr or done.stdout).strip()[-300:]}"
    return True, ""


def _verifiers(directory: Path, sigstore_instance: Any, cosign: Path) -> dict[str, tuple[bool, str]]:
    root = sigstore_instance.trusted_root
    return {"sigstore-python": _python(directory, root), "sigstore-js": _js(directory, root),
            "cosign": _cosign(directory, root, cosign)}


def _cli(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", "verify", str(directory), *args],
                          capture_output=True, text=True, check=False, timeout=120, cwd=REPO)


def _pinned(root: Path, *extra: str) -> tuple[str, ...]:
    return ("--repo", SOURCE_REPO, "--tag", SOURCE_TAG, "--trusted-root", str(root), "--offline",
            "--profile", "production", *extra)


# --- the expectation: the builder and the infra repository, both pinned by the consumer --------------


def test_the_production_profile_pins_the_builder_and_the_infra_repository() -> None:
    want = expectation(None, "production", repository=SOURCE_REPO, tag=SOURCE_TAG, infra_repository=INFRA,
                       builder=f"benchseal/benchseal@{BUILDER_SHA}")
    assert want.identity == f"https://github.com/benchseal/benchseal/.github/workflows/benchmark.yml@{BUILDER_SHA}"
    assert (want.workflow_repository, want.workflow_ref, want.builder) == (INFRA, "refs/heads/main", BUILDER)
    assert want.describe() == (f"{want.identity} for {INFRA} at refs/heads/main "
                               "(issuer https://token.actions.githubusercontent.com)")


@pytest.mark.parametrize("value", [
    "benchseal/benchseal",                                  # no ref
    "benchseal/benchseal@main",                             # a bare branch name: ambiguous
    "benchseal/benchseal@v1",                               # a bare tag name
    "benchseal/benchseal@refs/heads/*",                     # a pattern
    "benchseal/benchseal@refs/tags/v1..2",
    "benchseal/benchseal@refs/pull/1/merge",
    "benchseal/benchseal@" + "AB" * 20,                     # not lowercase hex
    "benchseal/benchseal@" + "ab" * 19,                     # a short commit
    "benchseal@" + "ab" * 20,                               # no owner
    "a/b/c@" + "ab" * 20,
    "benchseal/benchseal@refs/heads/main@x",
    "benchseal/benchseal/.github/workflows/benchmark.yml@" + "ab" * 20,  # a job_workflow_ref, not OWNER/REPO@REF
    "",
])
def test_a_builder_is_one_repository_at_one_exact_ref(value: str) -> None:
    with pytest.raises(ValidationError, match="--builder"):
        parse_builder(value)
    with pytest.raises(ValidationError, match="--builder"):
        expectation(None, "production", repository=SOURCE_REPO, tag=SOURCE_TAG, infra_repository=INFRA, builder=value)


@pytest.mark.parametrize("value", [f"benchseal/benchseal@{BUILDER_SHA}", "acme/benchseal@refs/tags/v2.0.0",
                                   "local/benchseal@refs/heads/main"])
def test_exact_refs_are_builders(value: str) -> None:
    assert str(parse_builder(value)) == value


def _policy(path: Path, text: str) -> Path:
    path.write_text("schema: benchseal.verify-policy/v1\n" + text)
    return path


def test_the_builder_pinned_in_a_policy_file(tmp_path: Path) -> None:
    default = (REPO / "policies" / "verify.yaml").read_text().split("profiles:", 1)[1]
    policy = _policy(tmp_path / "p.yaml", f"expect:\n  builder: benchseal/benchseal@{BUILDER_SHA}\n"
                                          f"  infra_repository: {INFRA}\nprofiles:{default}")
    assert load_policy(policy).expect_builder == BUILDER
    pinned = expectation(policy, "production", repository=SOURCE_REPO, tag=SOURCE_TAG)
    assert pinned.builder == BUILDER and pinned.workflow_repository == INFRA
    assert expectation(policy, "production", repository=SOURCE_REPO, tag=SOURCE_TAG, builder=str(BUILDER)) == pinned
    with pytest.raises(ValidationError, match=r"--builder: differs from expect\.builder"):
        expectation(policy, "production", repository=SOURCE_REPO, tag=SOURCE_TAG, builder="benchseal/benchseal@" + "cd" * 20)
    bad = _policy(tmp_path / "bad.yaml", f"expect:\n  builder: benchseal/benchseal@main\nprofiles:{default}")
    with pytest.raises(ValidationError, match=r"expect\.builder"):
        load_policy(bad)


@pytest.mark.parametrize(("profile", "rule"), [
    # The builder's identity alone names no caller: anyone may call a reusable workflow.
    ("    identity: https://github.com/{builder_repository}/.github/workflows/benchmark.yml@{builder_ref}\n"
     "    issuer: https://token.actions.githubusercontent.com\n", "must also pin the caller"),
    ("    identity: https://github.com/{builder_repository}/.github/workflows/benchmark.yml@{builder_ref}\n"
     "    issuer: https://token.actions.githubusercontent.com\n    workflow_repository: '{infra_repository}'\n",
     "must also pin the caller"),
    ("    identity: x\n    issuer: y\n    workflow_sha: '{commit}'\n", "unknown keys"),
    ("    identity: x\n    issuer: y\n    workflow_ref: '{builder}'\n", "may use only the placeholders"),
    ("    identity: x\n    issuer: y\n    workflow_repository: ''\n", "non-empty"),
])
def test_a_profile_naming_the_builder_pins_its_caller(tmp_path: Path, profile: str, rule: str) -> None:
    with pytest.raises(ValidationError, match=rule):
        load_policy(_policy(tmp_path / "p.yaml", f"profiles:\n  production:\n{profile}"))


@pytest.mark.slow
def test_without_a_builder_the_production_profile_is_a_usage_error(signed_release: Path,
                                                                    sigstore_instance: Any) -> None:
    root = sigstore_instance.trusted_root
    missing = _cli(signed_release, *_pinned(root, "--infra-repo", INFRA))
    assert missing.returncode == 2, missing.stderr
    (line,) = missing.stderr.strip().splitlines()
    assert "invalid --builder: is required by the production profile" in line
    bad = _cli(signed_release, *_pinned(root, "--infra-repo", INFRA, "--builder", "benchseal/benchseal@main"))
    assert bad.returncode == 2 and "invalid --builder: must be the builder as OWNER/REPO@REF" in bad.stderr
    # The local (non-GitHub) profile is as it was: no builder, no infra repository.
    local = _cli(signed_release, "--repo", SOURCE_REPO, "--tag", SOURCE_TAG, "--trusted-root", str(root))
    assert local.returncode == 0, local.stderr


# --- real signatures: the builder's, for the pinned infra repository, passes everywhere ---------------


@pytest.mark.slow
def test_the_builders_seal_for_the_infra_repository_verifies_everywhere(builder_release: Path,
                                                                         sigstore_instance: Any,
                                                                         cosign_bin: Path) -> None:
    results = _verifiers(builder_release, sigstore_instance, cosign_bin)
    assert all(ok for ok, _ in results.values()), results
    done = _cli(builder_release, *_pinned(sigstore_instance.trusted_root, "--infra-repo", INFRA,
                                          "--builder", str(BUILDER), "--json"))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["builder"], report["infra_repository"], report["workflow_repository"], report["workflow_ref"]) == \
        (str(BUILDER), INFRA, INFRA, "refs/heads/main")
    assert report["identity"] == f"https://github.com/{BUILDER.workflow('benchmark.yml')}"
    text = _cli(builder_release, *_pinned(sigstore_instance.trusted_root, "--infra-repo", INFRA,
                                          "--builder", str(BUILDER)))
    assert f"signed for: {INFRA} at refs/heads/main" in text.stdout
    # The printed commands, the benchseal line included, run as printed.
    from pipeline.local.release import run_commands

    lines = cosign_commands(builder_release, repository=SOURCE_REPO, tag=SOURCE_TAG,
                            trusted_root=sigstore_instance.trusted_root, profile="production", cosign=str(cosign_bin),
                            benchseal=local_benchseal(), infra_repository=INFRA, builder=BUILDER)
    # The release carries its trusted root (issue 37.4): the lines name the published file.
    assert (builder_release / "trusted_root.json").is_file()
    assert lines[-1].endswith(f"--infra-repo {INFRA} --builder {BUILDER} --trusted-root trusted_root.json "
                              "--offline --profile production")
    assert all(f"--certificate-github-workflow-repository {INFRA} --certificate-github-workflow-ref refs/heads/main"
               in line for line in lines[1:-1])
    assert run_commands(lines, builder_release) == lines


# --- forgeries, each signed for real: refused by all three verifiers and by the CLI, in one line ------

FORGERIES = [
    ("the infra repository's own benchmark.yml, not the builder's",
     {"workflow_repository": None, "workflow_ref": None, "workflow_sha": None, "caller_workflow_file": None}),
    ("the builder, for another infra repository", {"repository": "evil/bench-infra"}),
    ("the builder, for the infra repository at another ref", {"ref": "refs/heads/dev"}),
    ("another version of the builder", {"workflow_ref": "cd" * 20, "workflow_sha": "cd" * 20}),
    ("the builder at a tag instead of the pinned commit", {"workflow_ref": "refs/tags/v1"}),
    ("the builder's release.yml instead of its benchmark.yml", {"workflow_file": "release.yml"}),
    ("a certificate without the workflow repository extensions", {"certificate_omits": ("repository",)}),
    ("a certificate without the workflow ref extensions", {"certificate_omits": ("ref",)}),
]


@pytest.fixture(scope="module")
def forged(tmp_path_factory: pytest.TempPathFactory, builder_release: Path, sigstore_instance: Any) -> Iterator[
        dict[str, Path]]:
    root = tmp_path_factory.mktemp("forged")
    yield {case: sealed_as(builder_release, root / str(i), seal_job(**changes), sigstore_instance)
           for i, (case, changes) in enumerate(FORGERIES)}


@pytest.mark.slow
@pytest.mark.parametrize("case", [case for case, _ in FORGERIES])
def test_a_forged_seal_is_refused(case: str, forged: dict[str, Path], sigstore_instance: Any,
                                  cosign_bin: Path) -> None:
    directory = forged[case]
    results = _verifiers(directory, sigstore_instance, cosign_bin)
    assert not any(ok for ok, _ in results.values()), results
    assert results["sigstore-python"][1].startswith("SHA256SUMS.sigstore.json: signature does not verify for "
                                                    "SHA256SUMS as https://github.com/"), results
    done = _cli(directory, *_pinned(sigstore_instance.trusted_root, "--infra-repo", INFRA, "--builder", str(BUILDER)))
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "SHA256SUMS.sigstore.json: signature does not verify" in line and f"for {INFRA} at refs/heads/main" in line


# --- both of Fulcio's forms of the caller are checked (a certificate the private instance cannot make) --


def _certificate(extensions: dict[str, bytes], san: str) -> Any:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
               .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(minutes=10))
               .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(san)]), critical=True))
    for oid, value in extensions.items():
        builder = builder.add_extension(x509.UnrecognizedExtension(x509.ObjectIdentifier(oid), value), critical=False)
    return builder.sign(key, hashes.SHA256())


def _utf8(text: str) -> bytes:
    return bytes([0x0C, len(text)]) + text.encode()


@pytest.mark.parametrize(("case", "override"), [
    ("exact", {}),
    ("source repository URI of another repository", {"1.3.6.1.4.1.57264.1.12": _utf8("https://github.com/evil/x")}),
    ("source repository ref of another ref", {"1.3.6.1.4.1.57264.1.14": _utf8("refs/heads/dev")}),
    ("no source repository URI", {"1.3.6.1.4.1.57264.1.12": None}),
    ("no legacy workflow ref", {"1.3.6.1.4.1.57264.1.6": None}),
])
def test_the_legacy_and_the_source_repository_extensions_must_both_match(case: str, override: dict[str, Any]) -> None:
    from sigstore.errors import VerificationError

    from pipeline.verify.release import signer_policy

    expect = expectation(None, "production", repository=SOURCE_REPO, tag=SOURCE_TAG, infra_repository=INFRA,
                         builder=BUILDER)
    extensions = {"1.3.6.1.4.1.57264.1.1": expect.issuer.encode(), "1.3.6.1.4.1.57264.1.8": _utf8(expect.issuer),
                  "1.3.6.1.4.1.57264.1.5": INFRA.encode(), "1.3.6.1.4.1.57264.1.6": b"refs/heads/main",
                  "1.3.6.1.4.1.57264.1.12": _utf8(f"https://github.com/{INFRA}"),
                  "1.3.6.1.4.1.57264.1.14": _utf8("refs/heads/main")}
    extensions = {oid: value for oid, value in {**extensions, **override}.items() if value is not None}
    certificate = _certificate(extensions, expect.identity)
    if case == "exact":
        signer_policy(expect).verify(certificate)
        return
    with pytest.raises(VerificationError):
        signer_policy(expect).verify(certificate)


# --- the consumer's policy file and options (pipeline/verify/policy.py): fast, in-process tests written against
# the mutation run (issue 39.3, docs/architecture.md "Mutation testing"); each refusal names its field and rule.

_LOCAL = "profiles:\n  local:\n    identity: https://x.invalid/{repository}@{tag}\n    issuer: https://oidc.invalid\n"


def _refused(call: Any, *args: Any, **kwargs: Any) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        call(*args, **kwargs)
    return caught.value


@pytest.mark.parametrize(("text", "value"), [("schema: benchseal.verify-policy/v2\n", "benchseal.verify-policy/v2"),
                                              ("version: 1\n", None), ("- schema\n", ["schema"])])
def test_a_policy_file_of_another_schema_is_refused(tmp_path: Path, text: str, value: object) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text + ("" if text.startswith("-") else _LOCAL))
    refused = _refused(load_policy, path)
    assert (refused.field, refused.rule, refused.value) == (f"{path}: schema", "must be 'benchseal.verify-policy/v1'",
                                                            value)


def test_a_policy_file_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    path = _policy(tmp_path / "p.yaml", _LOCAL + "trust_everyone: true\n")
    refused = _refused(load_policy, path)
    assert (refused.field, refused.rule) == (str(path), "unknown keys ['trust_everyone'] (allowed: ['expect', "
                                                        "'profiles', 'schema'])")


@pytest.mark.parametrize("profiles", ["", "profiles: {}\n", "profiles: [local]\n"])
def test_a_policy_file_needs_its_profiles(tmp_path: Path, profiles: str) -> None:
    path = _policy(tmp_path / "p.yaml", profiles)
    refused = _refused(load_policy, path)
    assert (refused.field, refused.rule) == (f"{path}: profiles", "must map profile names to {identity, issuer}")


@pytest.mark.parametrize("expect", ["expect: acme/widget\n", "expect: {}\n", "expect:\n  commit: abc\n"])
def test_expect_is_a_mapping_of_the_known_keys(tmp_path: Path, expect: str) -> None:
    path = _policy(tmp_path / "p.yaml", _LOCAL + expect)
    refused = _refused(load_policy, path)
    assert refused.field == f"{path}: expect"
    assert refused.rule == "must be a mapping with repository, tag, infra_repository and/or builder"


@pytest.mark.parametrize(("key", "value"), [("repository", "acme"), ("tag", "v1..2"), ("infra_repository", "a/b/c")])
def test_each_pinned_expectation_is_held_to_its_rule(tmp_path: Path, key: str, value: str) -> None:
    path = _policy(tmp_path / "p.yaml", _LOCAL + f"expect:\n  {key}: '{value}'\n")
    refused = _refused(load_policy, path)
    assert (refused.field, refused.value) == (f"{path}: expect.{key}", value)


def test_a_policy_file_pins_the_whole_expectation(tmp_path: Path) -> None:
    path = _policy(tmp_path / "p.yaml", _LOCAL + f"expect:\n  repository: acme/widget\n  tag: v1.2.3\n"
                                                 f"  infra_repository: {INFRA}\n")
    loaded = load_policy(path)
    assert (loaded.expect_repository, loaded.expect_tag, loaded.expect_infra_repository, loaded.expect_builder) == (
        "acme/widget", "v1.2.3", INFRA, None)
    assert set(loaded.profiles) == {"local"}
    assert load_policy(_policy(tmp_path / "q.yaml", _LOCAL)).expect_repository is None


@pytest.mark.parametrize(("entry", "field", "rule"), [
    ("    - identity\n", "", "must be a mapping"),
    ("    issuer: https://oidc.invalid\n", ".identity", "must be a non-empty string without surrounding spaces"),
    ("    identity: ' x'\n    issuer: https://oidc.invalid\n", ".identity",
     "must be a non-empty string without surrounding spaces"),
    ("    identity: x\n    issuer: 7\n", ".issuer", "must be a non-empty string without surrounding spaces"),
    ("    identity: 'x{tag'\n    issuer: y\n", ".identity", "has an unbalanced '{' or '}'"),
    ("    identity: 'x}'\n    issuer: y\n", ".identity", "has an unbalanced '{' or '}'"),
    ("    identity: 'https://github.com/{owner}'\n    issuer: y\n", ".identity",
     "may use only the placeholders {repository}, {tag}, {infra_repository}, {builder_repository} and {builder_ref} "
     "(values the consumer states), not {owner}"),
    ("    identity: x\n    issuer: y\n    audience: z\n", "", "unknown keys ['audience'] (allowed: identity, issuer, "
                                                                "workflow_repository, workflow_ref)"),
])
def test_a_profile_entry_is_refused_naming_its_key(tmp_path: Path, entry: str, field: str, rule: str) -> None:
    path = _policy(tmp_path / "p.yaml", f"profiles:\n  p:\n{entry}")
    refused = _refused(load_policy, path)
    assert (refused.field, refused.rule) == (f"{path}: profiles.p{field}", rule)


def test_options_must_agree_with_what_the_policy_pins(tmp_path: Path) -> None:
    path = _policy(tmp_path / "p.yaml", _LOCAL + f"expect:\n  repository: acme/widget\n  tag: v1\n"
                                                 f"  infra_repository: {INFRA}\n")
    refused = _refused(expectation, path, "local", repository="acme/other", tag=None)
    assert (refused.field, refused.rule, refused.value) == (
        "--repo", f"differs from expect.repository 'acme/widget' pinned in {path}", "acme/other")
    refused = _refused(expectation, path, "local", repository=None, tag="v2")
    assert (refused.field, refused.rule, refused.value) == ("--tag", f"differs from expect.tag 'v1' pinned in {path}",
                                                            "v2")
    refused = _refused(expectation, path, "local", repository=None, tag=None, infra_repository="acme/other")
    assert (refused.field, refused.rule, refused.value) == (
        "--infra-repo", f"differs from expect.infra_repository {INFRA!r} pinned in {path}", "acme/other")
    same = expectation(path, "local", repository="acme/widget", tag="v1", infra_repository=INFRA)
    assert same == expectation(path, "local", repository=None, tag=None)
    assert (same.identity, same.issuer, same.repository, same.tag, same.infra_repository) == (
        "https://x.invalid/acme/widget@v1", "https://oidc.invalid", "acme/widget", "v1", INFRA)


def test_the_release_expected_is_stated_never_taken_from_it(tmp_path: Path) -> None:
    path = _policy(tmp_path / "p.yaml", _LOCAL)
    for kwargs, field in (({"repository": None, "tag": "v1"}, "--repo"), ({"repository": "acme/w", "tag": None}, "--tag")):
        refused = _refused(expectation, path, "local", **kwargs)
        assert (refused.field, refused.rule) == (field, "is required: state the release you expect (or pin it under "
                                                        "expect: in --policy FILE); benchseal verify never takes it "
                                                        "from the release it checks")
    for bad, field in (({"repository": "acme"}, "--repo"), ({"tag": "v1..2"}, "--tag"),
                       ({"infra_repository": "a/b/c"}, "--infra-repo")):
        stated: dict[str, str] = {"repository": "acme/w", "tag": "v1", **bad}
        assert _refused(expectation, path, "local", **stated).field == field


def test_a_profile_is_one_of_the_policys_and_gets_what_it_names(tmp_path: Path) -> None:
    refused = _refused(expectation, None, "staging", repository=SOURCE_REPO, tag=SOURCE_TAG)
    assert (refused.field, refused.rule, refused.value) == ("--profile", "must be one of ['local', 'production']",
                                                            "staging")
    refused = _refused(expectation, None, "production", repository=SOURCE_REPO, tag=SOURCE_TAG, builder=BUILDER)
    assert refused.field == "--infra-repo" and refused.rule.startswith("is required by the production profile")
    refused = _refused(expectation, None, "production", repository=SOURCE_REPO, tag=SOURCE_TAG, infra_repository=INFRA)
    assert refused.field == "--builder" and refused.rule.startswith("is required by the production profile")
    local = expectation(None, "local", repository=SOURCE_REPO, tag=SOURCE_TAG)
    assert (local.workflow_repository, local.workflow_ref, local.infra_repository, local.builder) == (None,) * 4
    assert local.describe() == f"{local.identity} (issuer {local.issuer})"


def test_a_profile_pinning_only_the_callers_ref_admits_any_repository_and_says_so(tmp_path: Path) -> None:
    path = _policy(tmp_path / "p.yaml", "profiles:\n  p:\n    identity: 'https://x.invalid/{repository}'\n"
                                        "    issuer: y\n    workflow_ref: 'refs/tags/{tag}'\n")
    want = expectation(path, "p", repository="acme/w", tag="v1")
    assert (want.identity, want.workflow_repository, want.workflow_ref) == ("https://x.invalid/acme/w", None,
                                                                            "refs/tags/v1")
    assert want.describe() == "https://x.invalid/acme/w for any repository at refs/tags/v1 (issuer y)"
