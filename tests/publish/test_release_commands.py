"""The release's verification commands: run side by side, first failure (in body order) reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import CheckFailed
from pipeline.local.release import run_commands


def test_all_commands_pass(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert run_commands(["test -f f", "true"], tmp_path) == ["test -f f", "true"]


def test_first_failure_in_body_order_is_reported(tmp_path: Path) -> None:
    with pytest.raises(CheckFailed) as caught:
        run_commands(["true", "test -f missing-one", "sh -c 'exit 3'"], tmp_path)
    assert "test -f missing-one" in caught.value.diagnostics()
    assert "exit 3" not in caught.value.diagnostics()


# --- the commands a published body prints, run exactly as printed --------------------------------

def _printed_commands(body: str) -> list[str]:
    block = body.split("```sh\n", 1)[1].split("\n```", 1)[0]
    return block.splitlines()


def _publish_locally(artifacts: Path, dist: Path, tag: str, repository: str) -> Path:
    from pipeline.core.contracts import PublicationRequest
    from pipeline.publish.outbox import publish_request
    from pipeline.publish.targets import LocalTarget

    request = PublicationRequest(run_id="unknown", target="local", tag=tag, artifacts_dir=str(artifacts),
                                 options={"root": str(dist), "repository": repository})
    publish_request(request, LocalTarget(dist))
    return dist / tag


@pytest.fixture()
def consumer_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sigstore_instance: object,
                 cosign_bin: Path) -> None:
    """A consumer's shell: `cosign` and `benchseal` on PATH; the publisher's home holds the local
    instance's trusted root (where the printed --trusted-root points)."""
    import os
    import sys

    home = tmp_path / "home"
    home.mkdir()
    (home / "sigstore").symlink_to(sigstore_instance.state)  # type: ignore[attr-defined]
    monkeypatch.setenv("BENCHSEAL_HOME", str(home))
    path = os.pathsep.join([str(cosign_bin.parent), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    monkeypatch.setenv("PATH", path)


@pytest.mark.slow
def test_body_commands_run_as_printed(release_copy: Path, tmp_path: Path, consumer_env: None) -> None:
    release = _publish_locally(release_copy, tmp_path / "dist", "v9.9.9", "acme/widget")
    commands = _printed_commands((release / "body.md").read_text())
    assert commands[0] == "sha256sum -c SHA256SUMS"
    assert sum(c.startswith("cosign verify-blob") for c in commands) == 8  # 4 blobs + 4 attestation checks
    # The expectation is stated on the line itself, never left to the release being checked.
    assert commands[-1].startswith("benchseal verify . --repo acme/widget --tag v9.9.9 --trusted-root ")
    assert run_commands(commands, release) == commands


@pytest.mark.slow
def test_printed_commands_fail_for_a_release_of_another_repository(release_copy: Path, tmp_path: Path,
                                                                   consumer_env: None) -> None:
    """Published (by a misconfigured publisher) as someone else's release: the printed benchseal
    line expects that repository and refuses the evidence, whose summary names the real one."""
    release = _publish_locally(release_copy, tmp_path / "dist", "v9.9.9", "someone/else")
    commands = _printed_commands((release / "body.md").read_text())
    assert "--repo someone/else" in commands[-1]
    with pytest.raises(CheckFailed, match=r"(?s)benchseal verify .*source\.repository is 'acme/widget'"):
        run_commands(commands, release)


@pytest.mark.slow
def test_printed_commands_fail_on_a_tampered_release(release_copy: Path, tmp_path: Path, consumer_env: None) -> None:
    release = _publish_locally(release_copy, tmp_path / "dist", "v9.9.9", "acme/widget")
    commands = _printed_commands((release / "body.md").read_text())
    data = (release / "sbom-api.cdx.json").read_bytes()
    (release / "sbom-api.cdx.json").write_bytes(data.replace(b"{", b"{ ", 1))
    with pytest.raises(CheckFailed, match=r"sha256sum -c SHA256SUMS"):
        run_commands(commands, release)


@pytest.mark.slow
def test_github_release_body_commands_run_as_printed(release_copy: Path, tmp_path: Path, consumer_env: None,
                                                     emulator: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GitHub target: published through the emulator (`benchseal publish --target github`, the
    seal job's command), the body read back from the release, the assets downloaded, and the
    printed commands run exactly as printed; a tampered download fails them."""
    import json
    import subprocess
    import sys

    import requests

    from tests.fixtures.github import tag_release_commit

    emu: Any = emulator
    summary = json.loads((release_copy / "summary.json").read_text())
    repository, tag = summary["source"]["repository"], summary["source"]["tag"]
    emu.add_repo(repository)
    tag_release_commit(emu, repository, tag, summary["source"]["commit"])
    from pipeline.dispatch.client import make_client

    make_client(base_url=emu.base_url, token=emu.token).get_repo(repository).create_git_release(
        tag=tag, name=tag, message="notes\n", prerelease=False)
    monkeypatch.setenv("GITHUB_TOKEN", emu.token)
    monkeypatch.setenv("GITHUB_API_URL", emu.base_url)
    done = subprocess.run([sys.executable, "-m", "pipeline", "publish", str(release_copy), "--target", "github",
                           "--trigger", "tag", "--tag", tag, "--repo", repository],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    release = emu.release(repository, tag)
    commands = _printed_commands(release.body.split("<!-- benchseal:start -->", 1)[1])
    assert commands[-1].startswith(f"benchseal verify . --repo {repository} --tag {tag} --trusted-root ")
    downloaded = tmp_path / "downloaded"
    downloaded.mkdir()
    for asset in release.assets:
        url = f"{emu.origin}/{repository}/releases/download/{tag}/{asset.name}"
        (downloaded / asset.name).write_bytes(requests.get(url, timeout=30).content)
    assert run_commands(commands, downloaded) == commands
    (downloaded / "summary.json").write_bytes((downloaded / "summary.json").read_bytes() + b" ")
    with pytest.raises(CheckFailed, match=r"sha256sum -c SHA256SUMS"):
        run_commands(commands, downloaded)
