"""Issue 37: the evidence opens in the tools people already have. gh (``gh attestation verify``), cosign,
sigstore-python (``python -m sigstore``) and sigstore-js (``benchseal sigstore-js``, @sigstore/verify) each run
against one published release exactly as its body prints them, each accepts it, and each refuses every wrong
pin its command line states: another signing identity (the builder's benchmark.yml at another ref), another
source ref, another predicate type (gh and cosign: sigstore-python's and sigstore-js's lines state none), a
tampered asset and another repository (the source repository, what a consumer naturally types), with a
non-zero exit and the tool's own reason.

The release: ``tests.verify.test_verify_builder.builder_release`` (acme/widget v9.9.9 sealed, as ``make demo``
seals it, by a builder's reusable benchmark.yml for an infra repository on main, GitHub-shaped certificates
from the private Sigstore instance), published once for the module with ``benchseal publish --target local``
(the body names the published trust files, so nothing is substituted: the commands run inside the release
directory, which is where the body says to download the assets). Without the images (another engineer's).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.verify.test_verify_builder import BUILDER, INFRA, SOURCE_REPO, SOURCE_TAG, builder_release

__all__ = ["builder_release"]  # a fixture, used by name

SLSA = "https://slsa.dev/provenance/v1"
TEST_RESULT = "https://in-toto.io/attestation/test-result/v0.1"
# How each tool's lines begin in the body's "Every check" block.
TOOLS = {"cosign": "cosign ", "gh": "gh attestation verify ", "sigstore-python": "python -m sigstore ",
         "sigstore-js": "benchseal sigstore-js "}


@pytest.fixture(scope="module")
def published(builder_release: Path, tmp_path_factory: pytest.TempPathFactory, sigstore_instance: Any,
              cosign_bin: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The release directory as published, and a consumer's environment (cosign, gh, python and benchseal on
    PATH; no Sigstore setting inherited)."""
    work = tmp_path_factory.mktemp("consumer-tools")
    artifacts = work / "artifacts"
    shutil.copytree(builder_release, artifacts)
    home = work / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIGSTORE_", "TUF_", "GH_", "GITHUB_"))}
    env.update(BENCHSEAL_HOME=str(home), HOME=str(home), GH_TOKEN="unused-offline", GH_NO_UPDATE_NOTIFIER="1",
               NO_COLOR="1", COLUMNS="400", PATH=os.pathsep.join([str(cosign_bin.parent), str(Path(sys.executable).parent),
                                                   env.get("PATH", "")]))
    done = subprocess.run([sys.executable, "-m", "pipeline", "publish", str(artifacts), "--target", "local", "--root",
                           str(work / "dist"), "--tag", SOURCE_TAG, "--trigger", "tag", "--infra-repo", INFRA,
                           "--builder", str(BUILDER), "--trusted-root", str(sigstore_instance.trusted_root)],
                          capture_output=True, text=True, check=False, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    yield work / "dist" / SOURCE_TAG, env


def every_check(body: str) -> list[str]:
    """The commands under the body's "Every check" heading (its folded block), in order."""
    heading = next(line for line in body.splitlines() if line.startswith("<details><summary>Every check"))
    block = body.split(heading, 1)[1].split("```sh\n", 1)[1].split("\n```", 1)[0]
    return block.splitlines()


def tool_lines(release: Path, tool: str) -> list[str]:
    lines = [c for c in every_check((release / "body.md").read_text()) if c.startswith(TOOLS[tool])]
    assert lines, f"the body prints no {tool} line"
    return lines


def run(lines: list[str], cwd: Path, env: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    def one(line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(shlex.split(line), cwd=cwd, env=env, capture_output=True, text=True, check=False,
                              timeout=120)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, lines))


@pytest.mark.slow
def test_the_body_prints_each_tool_with_the_published_trust_files(published: tuple[Path, dict[str, str]]) -> None:
    release, _ = published
    counts = {tool: len(tool_lines(release, tool)) for tool in TOOLS}
    # cosign: 4 blobs, 3 provenance checks and the test result; gh: the same 3 attestations and the test result;
    # sigstore-python: the blobs in one line, summary.json against its provenance; sigstore-js: every bundle.
    assert counts == {"cosign": 8, "gh": 4, "sigstore-python": 2, "sigstore-js": 1}
    trust = {"cosign": "--trusted-root trusted_root.json", "gh": "--custom-trusted-root trusted_root.jsonl",
             "sigstore-python": "--trust-config client_trust_config.json", "sigstore-js": "--trusted-root trusted_root.json"}
    for tool, flag in trust.items():
        assert all(flag in line for line in tool_lines(release, tool)), tool


@pytest.mark.slow
@pytest.mark.parametrize("tool", list(TOOLS))
def test_each_tool_accepts_the_release_as_printed(published: tuple[Path, dict[str, str]], tool: str) -> None:
    release, env = published
    lines = tool_lines(release, tool)
    for line, done in zip(lines, run(lines, release, env), strict=True):
        assert done.returncode == 0, f"{line}\n{done.stderr}{done.stdout}"


_OTHER_IDENTITY = (f"benchmark.yml@{BUILDER.ref}", "benchmark.yml@" + "cd" * 20)
_OTHER_REF = ("refs/heads/main", "refs/heads/dev")
_OTHER_REPO = (f" {INFRA} ", f" {SOURCE_REPO} ")  # the source repository: the natural mistake (docs/evidence.md)
_OTHER_TYPE = {"cosign": (f"--type {SLSA} ", "--type https://slsa.dev/provenance/v0.2 "),
               "gh": ("--predicate-type ", "--predicate-type https://spdx.dev/Document --x ")}
# The reason each tool gives, by pin, as a regular expression (sigstore-python's is printed through rich:
# COLUMNS keeps it on one line). gh (sigstore-go) names the claim it compared, except for a signature or
# identity that does not verify: then only the issuer it tried.
_GH_SIGNATURE = r'Error: verifying with issuer "sigstore\.mock"'
REASONS: dict[tuple[str, str], str] = {
    ("cosign", "identity"): r'expected SAN value "https://github\.com/benchseal/benchseal/\.github/workflows/'
                            r'benchmark\.yml@(cd){20}", got ".*@(ab){20}"',
    ("cosign", "ref"): r'expected GithubWorkflowRef to be "refs/heads/dev", got "refs/heads/main"',
    ("cosign", "repository"): f'expected GithubWorkflowRepository to be "{SOURCE_REPO}", got "{INFRA}"',
    ("cosign", "predicate type"): r"invalid predicate type, expected https://slsa\.dev/provenance/v0\.2 got https://",
    ("cosign", "tampered asset"): (r"invalid signature when validating ASN\.1 encoded signature"
                                   r"|provided artifact digests do not match digests in statement"),
    ("gh", "identity"): _GH_SIGNATURE,
    ("gh", "ref"): r"expected SourceRepositoryRef to be refs/heads/dev, got refs/heads/main",
    ("gh", "repository"): f"expected SourceRepositoryURI to be https://github.com/{SOURCE_REPO}, "
                          f"got https://github.com/{INFRA}",
    ("gh", "predicate type"): r"no attestations found with predicate type: https://spdx\.dev/Document",
    ("gh", "tampered asset"): _GH_SIGNATURE,
    ("sigstore-python", "identity"): r"FAIL: (SHA256SUMS|summary\.json).*Certificate's SANs do not match .*@(cd){20}; "
                                     r"actual SANs: \{'.*@(ab){20}'\}",
    ("sigstore-python", "ref"): r"Certificate's GitHubWorkflowRef does not match \(got 'refs/heads/main', "
                                r"expected 'refs/heads/dev'\)",
    ("sigstore-python", "repository"): (f"Certificate's GitHubWorkflowRepository does not match \\(got '{INFRA}', "
                                        f"expected '{SOURCE_REPO}'\\)"),
    ("sigstore-python", "tampered asset"): (r"FAIL: summary\.json.*(Bundle message digest mismatch"
                                            r"|in-toto statement has no subject for digest)"),
    ("sigstore-js", "identity"): r"sigstore-js refused SHA256SUMS\.sigstore\.json: PolicyError: certificate identity "
                                 r"error - expected .*@(cd){20}\$, got .*@(ab){20}",
    ("sigstore-js", "ref"): r"PolicyError: invalid certificate extension - missing OID 1\.3\.6\.1\.4\.1\.57264\.1\.6",
    ("sigstore-js", "repository"): r"PolicyError: invalid certificate extension - missing OID "
                                   r"1\.3\.6\.1\.4\.1\.57264\.1\.5",
    ("sigstore-js", "tampered asset"): r"SHA256SUMS: summary\.json: sha256 mismatch; summary\.json\.sigstore\.json: "
                                       r"VerificationError: signature verification failed",
}
def _edit(tool: str, pin: str, line: str) -> str:
    if pin == "identity":
        return line.replace(*_OTHER_IDENTITY)
    if pin == "ref":
        return line.replace(*_OTHER_REF)
    if pin == "repository":
        return line.replace(*_OTHER_REPO)
    if pin == "predicate type":
        old, new = _OTHER_TYPE[tool]
        if tool == "gh":  # each line's own type (provenance or test result) replaced by another
            argv = shlex.split(line)
            argv[argv.index("--predicate-type") + 1] = "https://spdx.dev/Document"
            return shlex.join(argv)
        return line.replace(f"--type {TEST_RESULT} ", new).replace(old, new)
    raise AssertionError(pin)


@pytest.mark.slow
@pytest.mark.parametrize(("tool", "pin"), sorted(REASONS))
def test_each_tool_refuses_a_wrong_pin(published: tuple[Path, dict[str, str]], tmp_path: Path, tool: str,
                                       pin: str) -> None:
    release, env = published
    lines = tool_lines(release, tool)
    if pin == "tampered asset":
        # summary.json with one byte more: every line that checks it must refuse.
        copy = tmp_path / "release"
        shutil.copytree(release, copy)
        summary = copy / "summary.json"
        summary.write_bytes(summary.read_bytes().replace(b"{", b"{ ", 1))
        edited = [line for line in lines if "summary.json" in shlex.split(line) or tool == "sigstore-js"]
        cwd = copy
    else:
        edited = [_edit(tool, pin, line) for line in lines]
        edited = [new for new, old in zip(edited, lines, strict=True) if new != old]
        cwd = release
    assert edited, f"no {tool} line states the {pin}"
    for line, done in zip(edited, run(edited, cwd, env), strict=True):
        output = done.stderr + done.stdout
        assert done.returncode != 0, f"accepted: {line}\n{output}"
        assert re.search(REASONS[tool, pin], output, re.DOTALL), f"{line}\n{output}"


# --- gh and the runner's test-result referrer (the body's image block) ---------------------------------------

def image_block(body: str) -> list[str]:
    """The commands of the body's image block (cosign's, then gh's), in order."""
    section = body.split("<details><summary>The runner and API images", 1)[1]
    return section.split("```sh\n", 1)[1].split("\n```", 1)[0].splitlines()


@pytest.mark.slow
def test_gh_finds_the_runner_s_test_result_as_printed_and_refuses_a_wrong_pin(
        published: tuple[Path, dict[str, str]]) -> None:
    """Issue 37.1/37.2: the image block prints one `gh attestation verify oci://RUNNER --bundle-from-oci` line
    for the test result the seal job signed (the evidence's pins: --repo the infra repository, benchmark.yml at
    the builder's ref, refs/heads/main, the test-result type). Once the release's bundle is attached to the runner
    (what release.yml's attach_result job and the local release do) gh finds it through the registry's referrers
    and passes as printed; another predicate type or another identity is refused, for its own reason."""
    from pipeline.attest.testresult import attach_test_result
    from pipeline.core.documents import ReleaseSummary, load_document

    release, env = published
    runner = load_document(ReleaseSummary, release / "summary.json").images.runner.ref
    lines = [c for c in image_block((release / "body.md").read_text())
             if c.startswith("gh ") and f"--predicate-type {TEST_RESULT} " in c]
    assert len(lines) == 1, lines
    (line,) = lines
    argv = shlex.split(line)
    assert argv[:5] == ["gh", "attestation", "verify", f"oci://{runner}", "--bundle-from-oci"], argv
    for pin in (f"--repo {INFRA} ", f"--cert-identity https://github.com/{BUILDER.workflow('benchmark.yml')} ",
                "--source-ref refs/heads/main ", "--cert-oidc-issuer https://token.actions.githubusercontent.com ",
                "--custom-trusted-root trusted_root.jsonl"):
        assert pin in line, pin
    attach_test_result(release, runner)
    wrong_type = line.replace(f"--predicate-type {TEST_RESULT} ", "--predicate-type https://spdx.dev/Document ")
    wrong_identity = line.replace(*_OTHER_IDENTITY)
    assert line != wrong_type and line != wrong_identity
    ok, refused_type, refused_identity = run([line, wrong_type, wrong_identity], release, env)
    assert ok.returncode == 0, f"{line}\n{ok.stderr}{ok.stdout}"
    assert refused_type.returncode != 0 and re.search(REASONS["gh", "predicate type"], refused_type.stderr), \
        refused_type.stderr
    assert refused_identity.returncode != 0 and re.search(_GH_SIGNATURE, refused_identity.stderr), \
        refused_identity.stderr


# --- benchseal sigstore-js: its usage errors, and no pass without the signature over SHA256SUMS --------------

def _sigstore_js(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).with_name("benchseal")), "sigstore-js", *args],
                          capture_output=True, text=True, check=False, timeout=60)


def test_sigstore_js_names_a_bad_argument_in_one_line(tmp_path: Path) -> None:
    root = tmp_path / "trusted_root.json"
    pins = ("--cert-identity", "https://example.com/x", "--cert-oidc-issuer", "https://example.com")
    for args, named in (((str(tmp_path / "absent"), "--trusted-root", str(root), *pins), "invalid DIR:"),
                        ((str(tmp_path), "--trusted-root", str(root), *pins), "invalid --trusted-root:"),
                        ((str(tmp_path), "--trusted-root", str(root)), "Missing option '--cert-identity'")):
        done = _sigstore_js(*args)
        assert done.returncode == 2 and named in done.stderr and len(done.stderr.strip().splitlines()) == 1, done


def test_sigstore_js_refuses_a_directory_nothing_signs(tmp_path: Path) -> None:
    """A SHA256SUMS whose every listed file matches, and no bundle: zero bundles checked is not a pass."""
    (tmp_path / "summary.json").write_bytes(b"{}\n")
    digest = hashlib.sha256(b"{}\n").hexdigest()
    (tmp_path / "SHA256SUMS").write_text(f"{digest}  summary.json\n")
    (tmp_path / "trusted_root.json").write_text("{}\n")
    done = _sigstore_js(str(tmp_path), "--trusted-root", str(tmp_path / "trusted_root.json"), "--cert-identity",
                        "https://example.com/x", "--cert-oidc-issuer", "https://example.com")
    assert done.returncode == 1, done
    assert done.stderr.strip() == (f"benchseal: error: {tmp_path}: SHA256SUMS.sigstore.json is missing: nothing "
                                   "signs the release's SHA256SUMS")
