"""``benchseal doctor adopter|infra`` against the OpenAPI-checked GitHub emulator over real HTTP: an
incomplete production setup (each missing piece found, one line each, with its fix: exit 1) and the
complete one (exit 0). The callers are the shipped examples', pinned or not."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from tests.doubles.github import GitHubEmulator

REPO = Path(__file__).resolve().parents[2]
ADOPTER, INFRA = "acme/widget", "acme/bench-infra"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CALLERS = {"adopter": (REPO / "examples/hello-agent/.github/workflows/release.yml", ".github/workflows/release.yml"),
           "infra": (REPO / "examples/bench-infra/.github/workflows/benchmark.yml", ".github/workflows/benchmark.yml")}


def _checkout(tmp_path: Path, side: str, pin: str | None) -> Path:
    source, rel = CALLERS[side]
    top = tmp_path / side
    (top / rel).parent.mkdir(parents=True)
    text = source.read_text(encoding="utf-8")
    (top / rel).write_text(text.replace("BENCHSEAL_COMMIT", pin) if pin else text, encoding="utf-8")
    return top


def _doctor(em: GitHubEmulator, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GITHUB_API_URL": em.base_url, "GITHUB_TOKEN": token or em.token,
           "NO_PROXY": "127.0.0.1,localhost"}
    env.pop("GH_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "pipeline", "doctor", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False, timeout=120)


def _lines(done: subprocess.CompletedProcess[str], status: str) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith(status)]


def test_an_incomplete_adopter_setup_is_found_piece_by_piece(github_emulator: GitHubEmulator, tmp_path: Path) -> None:
    em = github_emulator
    em.add_repo(ADOPTER)
    em.set_variable(ADOPTER, "BENCHSEAL_IMAGE_PREFIX", "ghcr.io/acme/widget-")
    checkout = _checkout(tmp_path, "adopter", None)  # the example as shipped: BENCHSEAL_COMMIT, not a commit
    done = _doctor(em, "adopter", ADOPTER, "--dir", str(checkout))
    assert done.returncode == 1, done.stdout + done.stderr
    failed = _lines(done, "MISSING")
    assert failed == [
        "MISSING adopter: pinned by commit: .github/workflows/release.yml uses release.yml@BENCHSEAL_COMMIT -> fix: "
        "pin it to the 40-hex benchseal commit you adopt (release.yml@<commit>)",
        "MISSING adopter: workflow active on GitHub: .github/workflows/release.yml is not an active workflow of "
        "acme/widget -> fix: commit and push it to the default branch, and enable it under Actions",
        "MISSING adopter: variable BENCHSEAL_INFRA_REPOSITORY: not set on acme/widget -> fix: set the repository "
        "variable BENCHSEAL_INFRA_REPOSITORY (docs/github.md step 6)",
        "MISSING adopter: secret BENCHSEAL_INFRA_DISPATCH_TOKEN: not set on acme/widget -> fix: set the repository "
        "secret BENCHSEAL_INFRA_DISPATCH_TOKEN (docs/github.md step 6)",
    ], done.stdout
    assert "OK      adopter: variable BENCHSEAL_IMAGE_PREFIX" in done.stdout
    # The emulator's token is no classic token: GitHub reports no scopes for it.
    assert "UNKNOWN adopter: token scopes: not reported" in done.stdout
    assert done.stdout.rstrip().endswith("4 of 8 checks failed; 1 could not be made (UNKNOWN: check by hand)")

    # No caller at all: one line naming the file to write.
    empty = tmp_path / "empty"
    empty.mkdir()
    none = _doctor(em, "adopter", ADOPTER, "--dir", str(empty), "--json")
    assert none.returncode == 1
    found = json.loads(none.stdout)["findings"]
    assert found[0]["check"] == "caller workflow" and found[0]["status"] == "missing"
    assert "benchseal init" in found[0]["fix"]


def test_a_complete_adopter_setup_passes(github_emulator: GitHubEmulator, tmp_path: Path) -> None:
    em = github_emulator
    em.add_repo(ADOPTER)
    checkout = _checkout(tmp_path, "adopter", COMMIT)
    em.add_workflow(ADOPTER, ".github/workflows/release.yml", (checkout / ".github/workflows/release.yml").read_text())
    em.set_variable(ADOPTER, "BENCHSEAL_INFRA_REPOSITORY", INFRA)
    em.set_variable(ADOPTER, "BENCHSEAL_IMAGE_PREFIX", "ghcr.io/acme/widget-")
    em.set_secret(ADOPTER, "BENCHSEAL_INFRA_DISPATCH_TOKEN")
    em.oauth_scopes = "repo, workflow"  # a classic token: GitHub names its scopes
    done = _doctor(em, "adopter", ADOPTER, "--dir", str(checkout))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK      adopter: token scopes: repo, workflow" in done.stdout
    assert f"OK      adopter: pinned by commit: {COMMIT}" in done.stdout
    assert not _lines(done, "MISSING") and not _lines(done, "UNKNOWN")

    # A fine-grained token that may not read secrets: that check cannot be made, and says which permission.
    limited = em.add_token([ADOPTER], {"actions": "read", "variables": "read"})
    partly = _doctor(em, "adopter", ADOPTER, "--dir", str(checkout), token=limited)
    assert partly.returncode == 0, partly.stdout
    assert ("UNKNOWN adopter: secrets: the token cannot list acme/widget's secrets (HTTP 403) -> fix: give the token "
            "you run doctor with Secrets: Read on acme/widget") in partly.stdout


def test_the_infra_side_runner_label_publish_secret_policy_and_suites(github_emulator: GitHubEmulator,
                                                                        tmp_path: Path) -> None:
    em = github_emulator
    em.add_repo(INFRA)
    checkout = _checkout(tmp_path, "infra", COMMIT)
    policy = (REPO / "examples/bench-infra/policies/infra.yaml").read_text(encoding="utf-8")
    (checkout / "policies").mkdir()
    (checkout / "policies/infra.yaml").write_text(policy.replace("BENCHSEAL_COMMIT", COMMIT), encoding="utf-8")
    em.add_workflow(INFRA, ".github/workflows/benchmark.yml", (checkout / ".github/workflows/benchmark.yml").read_text())
    em.add_runner(INFRA, "build-box", ("gpu",))  # a runner, but not the label benchmark.yml's jobs ask for
    done = _doctor(em, "infra", INFRA, "--dir", str(checkout), "--source", "acme/gadget")
    assert done.returncode == 1, done.stdout + done.stderr
    assert _lines(done, "MISSING") == [
        "MISSING infra: secret BENCHSEAL_PUBLISH_TOKEN: not set on acme/bench-infra -> fix: set the repository secret "
        "BENCHSEAL_PUBLISH_TOKEN (docs/github.md step 6)",
        "MISSING infra: self-hosted runner labelled benchseal-infra: none of the 1 runners of acme/bench-infra has the "
        "label -> fix: register a runner on acme/bench-infra as the runner user with `./config.sh --labels "
        "benchseal-infra` (docs/host.md step 3.1)",
        "MISSING infra: policy source acme/gadget: not in policies/infra.yaml's sources -> fix: add a sources entry "
        "for acme/gadget with its signer and images (docs/github.md step 7)",
        "MISSING infra: policy agent for acme/gadget: no agents entry of policies/infra.yaml lists acme/gadget -> fix: "
        "add an agents entry {name, kind, package, repositories: [acme/gadget]} (`benchseal init` prints it)",
        "MISSING infra: suites directory: suites is missing -> fix: copy benchseal's suites/smoke into suites/, or "
        "write your own",
    ], done.stdout

    em.set_secret(INFRA, "BENCHSEAL_PUBLISH_TOKEN")
    em.add_runner(INFRA, "infra-1", ("benchseal-infra",), status="offline")
    shutil.copytree(REPO / "suites/smoke", checkout / "suites/smoke")
    offline = _doctor(em, "infra", INFRA, "--dir", str(checkout))
    assert offline.returncode == 1 and _lines(offline, "MISSING") == [
        "MISSING infra: self-hosted runner labelled benchseal-infra: 1 registered, none online -> fix: start it on the "
        "infra host (`./svc.sh start` in the runner's directory)"], offline.stdout

    em.add_runner(INFRA, "infra-2", ("benchseal-infra",))
    passed = _doctor(em, "infra", INFRA, "--dir", str(checkout), "--source", ADOPTER)
    assert passed.returncode == 0, passed.stdout
    assert "OK      infra: self-hosted runner labelled benchseal-infra: infra-2" in passed.stdout
    assert "OK      infra: policy agent for acme/widget: hello-agent" in passed.stdout
    assert "OK      infra: suite smoke dataset: suites/smoke sha256:" in passed.stdout


def test_usage_errors_exit_2(github_emulator: GitHubEmulator, tmp_path: Path) -> None:
    bad = _doctor(github_emulator, "adopter", "not a repo", "--dir", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "repository" in bad.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_TOKEN", "GH_TOKEN")}
    no_token = subprocess.run([sys.executable, "-m", "pipeline", "doctor", "infra", INFRA, "--dir", str(tmp_path)],
                              cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=120)
    assert no_token.returncode == 2 and "no GitHub token" in no_token.stderr
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{probe.getsockname()[1]}/api/v3"
    env = {**env, "GITHUB_TOKEN": "x", "GITHUB_API_URL": nowhere, "NO_PROXY": "127.0.0.1,localhost"}
    unreachable = subprocess.run([sys.executable, "-m", "pipeline", "doctor", "adopter", ADOPTER, "--dir", str(tmp_path)],
                                 cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=120)
    assert unreachable.returncode == 1 and unreachable.stderr == "", unreachable.stderr
    assert f"MISSING adopter: GitHub API: {nowhere}: no answer (ConnectionError) -> fix: check GITHUB_API_URL" \
        in unreachable.stdout
