"""Issue 26 (5): ``benchseal verify OWNER/REPO@TAG`` fetches a GitHub release's evidence through the API (the
OpenAPI-checked emulator, unmodified PyGithub over HTTP) and verifies it against the consumer's expectation.

The release is the real sealed one of tests/verify/test_verify_builder.py (acme/widget v9.9.9, sealed by the
builder's benchmark.yml for acme/bench-infra under the private Sigstore instance), published to the emulator by
benchseal's own publisher. Each hostile case is one line on stderr, the verb's exit code, never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import PublicationRequest
from pipeline.core.errors import CLI_ERROR_PREFIX, AssetTooLarge
from pipeline.dispatch.client import make_client
from pipeline.publish.outbox import default_target_factory, publish_request
from pipeline.verify.fetch import fetched_release, parse_reference
from tests.doubles.github.emulator import Asset
from tests.fixtures.github import tag_release_commit
from tests.verify.test_verify_builder import BUILDER, INFRA, SOURCE_REPO, SOURCE_TAG, builder_release

__all__ = ["builder_release"]  # a fixture, used by name

pytestmark = pytest.mark.slow
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # tests.fixtures.sigstore.make_inputs' source commit
REFERENCE = f"{SOURCE_REPO}@{SOURCE_TAG}"


def _publish(emulator: Any, artifacts: Path, root: Path) -> None:
    """The maintainers' release at the tag, then benchseal's publication of the sealed evidence into it."""
    emulator.add_repo(SOURCE_REPO)
    tag_release_commit(emulator, SOURCE_REPO, SOURCE_TAG, COMMIT)
    repo = make_client(base_url=emulator.base_url, token=emulator.token, backoff_factor=0.0).get_repo(SOURCE_REPO)
    repo.create_git_release(tag=SOURCE_TAG, name=SOURCE_TAG, message="Release notes.\n")
    request = PublicationRequest(run_id="unknown", target="github", tag=SOURCE_TAG, artifacts_dir=str(artifacts),
                                 options={"trigger": "tag", "repository": SOURCE_REPO, "api_url": emulator.base_url,
                                          "infra_repository": INFRA, "builder": str(BUILDER),
                                          "trusted_root": str(root)})
    publish_request(request, default_target_factory()(request))


@pytest.fixture()
def published(github_env: Any, builder_release: Path, sigstore_instance: Any) -> Any:
    """The emulator (GITHUB_API_URL and GITHUB_TOKEN point at it) holding the published release."""
    _publish(github_env, builder_release, sigstore_instance.trusted_root)
    return github_env


def _verify(target: str, root: Path, *extra: str, builder: str = str(BUILDER), tmp: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = dict(env if env is not None else os.environ)
    if tmp is not None:
        environment["TMPDIR"] = str(tmp)
    return subprocess.run([sys.executable, "-m", "pipeline", "verify", target, "--infra-repo", INFRA, "--builder",
                           builder, "--trusted-root", str(root), "--offline", "--profile", "production", *extra],
                          capture_output=True, text=True, check=False, timeout=180, env=environment)


def _one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(CLI_ERROR_PREFIX), line
    return line


def _release(emulator: Any) -> Any:
    release = emulator.release(SOURCE_REPO, SOURCE_TAG)
    assert release is not None
    return release


def _asset(emulator: Any, name: str, data: bytes) -> Asset:
    now = emulator.clock.now()
    return Asset(emulator._next_id(), name, "", "application/octet-stream", data, now, now)


def test_verifies_the_published_release_and_prints_the_score(published: Any, sigstore_instance: Any,
                                                             tmp_path: Path) -> None:
    evidence = len(_release(published).assets)
    # The maintainers' own assets beside the evidence (a tarball and its cosign bundle) are not fetched.
    _release(published).assets += [_asset(published, "widget-9.9.9.tar.gz", b"tarball"),
                                   _asset(published, "widget-9.9.9.tar.gz.sigstore.json", b"{}")]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = _verify(REFERENCE, sigstore_instance.trusted_root, tmp=scratch)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"verified: {REFERENCE} (GitHub release)"
    assert f"  repository: {SOURCE_REPO}" in lines and f"  tag:        {SOURCE_TAG}" in lines
    assert f"  commit:     {COMMIT}" in lines
    assert f"  signed for: {INFRA} at refs/heads/main" in lines
    # make_inputs' grading: 2 trials, 1 resolved.
    table = lines[lines.index("score:") + 1:]
    assert table[0].split() == ["status", "score", "completed", "resolved", "unresolved", "infra", "errors", "total"]
    assert table[1].split() == ["SUCCEEDED", "0.5", "2", "1", "1", "0", "2"]
    assert list(scratch.iterdir()) == []  # the fetched copy is gone
    downloads = [r for r in published.requests if r.operation == "repos/get-release-asset"]
    assert len(downloads) == evidence and all(r.status == 302 for r in downloads)  # the evidence only, each once

    as_json = _verify(REFERENCE, sigstore_instance.trusted_root, "--json")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 0 and report["ok"] is True and report["release"] == REFERENCE
    assert report["directory"] is None and report["repository"] == SOURCE_REPO and report["commit"] == COMMIT
    assert report["score"]["status"] == "SUCCEEDED" and report["score"]["score"] == 0.5
    assert report["score"]["counts"] == {"total": 2, "completed": 2, "resolved": 1, "unresolved": 1,
                                         "infra_errors": 0}


def test_a_token_file_instead_of_the_environment(published: Any, sigstore_instance: Any, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(published.token + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_TOKEN", "GH_TOKEN")}
    done = _verify(REFERENCE, sigstore_instance.trusted_root, "--token-file", str(token), env=env)
    assert done.returncode == 0, done.stderr
    assert published.token not in done.stdout + done.stderr
    anonymous = _one_line(_verify(REFERENCE, sigstore_instance.trusted_root, env=env), 1)
    assert "GitHub asks for a token (HTTP 401): set GITHUB_TOKEN or GH_TOKEN, or give --token-file" in anonymous


def test_a_tag_without_a_release(published: Any, sigstore_instance: Any) -> None:
    line = _one_line(_verify(f"{SOURCE_REPO}@v0.0.1", sigstore_instance.trusted_root), 1)
    assert line.endswith(f"{SOURCE_REPO} has no release for tag v0.0.1")
    line = _one_line(_verify("acme/nothing@v9.9.9", sigstore_instance.trusted_root), 1)
    assert line.endswith("acme/nothing: no such repository")


def test_a_release_that_was_never_scored(published: Any, sigstore_instance: Any) -> None:
    tag_release_commit(published, SOURCE_REPO, "v10.0.0", "d" * 40)
    repo = make_client(base_url=published.base_url, token=published.token).get_repo(SOURCE_REPO)
    repo.create_git_release(tag="v10.0.0", name="v10.0.0", message="No benchmark yet.")
    published.release(SOURCE_REPO, "v10.0.0").assets.append(_asset(published, "widget.tar.gz", b"x"))
    line = _one_line(_verify(f"{SOURCE_REPO}@v10.0.0", sigstore_instance.trusted_root), 1)
    assert "the release carries no benchseal evidence (no SHA256SUMS or summary.json asset): it was never scored" in line


def test_an_asset_removed_from_the_release(published: Any, sigstore_instance: Any) -> None:
    release = _release(published)
    release.assets = [a for a in release.assets if a.name != "sbom-api.cdx.json"]
    line = _one_line(_verify(REFERENCE, sigstore_instance.trusted_root), 1)
    assert line.endswith("the asset sbom-api.cdx.json is missing from the release (SHA256SUMS lists it)")


@pytest.mark.parametrize("name", ["summary.json", "trial-results.json", "summary.json.sigstore.json"])
def test_an_asset_swapped_for_other_bytes(published: Any, sigstore_instance: Any, name: str) -> None:
    (asset,) = [a for a in _release(published).assets if a.name == name]
    asset.data = asset.data.replace(b"0", b"1", 1) if name.endswith(".sigstore.json") else asset.data + b"\n"
    line = _one_line(_verify(REFERENCE, sigstore_instance.trusted_root), 1)
    assert name in line and ("does not match SHA256SUMS" in line or "does not verify" in line), line


def test_a_rate_limited_answer_says_when_it_resets(published: Any, sigstore_instance: Any) -> None:
    reset = int(datetime(2030, 1, 1, tzinfo=UTC).timestamp())
    before = published.count("repos/get-release-by-tag")
    published.inject_fault("repos/get-release-by-tag",
                           [(403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)})],
                           message="API rate limit exceeded for installation ID 1.")
    line = _one_line(_verify(REFERENCE, sigstore_instance.trusted_root), 1)
    assert "GitHub rate-limited the request (HTTP 403, the limit resets at 2030-01-01T00:00:00Z, in " in line
    assert published.count("repos/get-release-by-tag") == before + 1  # no retry
    published.secondary_rate_limit("repos/get-release-asset", status=429, retry_after=60)
    line = _one_line(_verify(REFERENCE, sigstore_instance.trusted_root), 1)
    assert "GitHub rate-limited the request (HTTP 429, retry after 60 s); retry then" in line


@pytest.mark.parametrize("name", ["../summary.json", "nested/summary.json", "..", "a\nb"])
def test_an_asset_name_that_is_not_one_plain_file_name(published: Any, sigstore_instance: Any, tmp_path: Path,
                                                       name: str) -> None:
    _release(published).assets.append(_asset(published, name, b"{}"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    line = _one_line(_verify(REFERENCE, sigstore_instance.trusted_root, tmp=scratch), 1)
    assert "refusing the asset name" in line and "an asset is one plain file name" in line
    assert list(scratch.iterdir()) == [] and not (tmp_path / "summary.json").exists()


def test_too_large(published: Any) -> None:
    sizes = {a.name: len(a.data) for a in _release(published).assets}
    largest = max(sizes, key=lambda name: sizes[name])
    with pytest.raises(AssetTooLarge) as one, \
            fetched_release(parse_reference(REFERENCE), token=published.token, max_asset=sizes[largest] - 1):
        pass
    assert one.value.subject == largest  # the asset over the per-asset bound
    with pytest.raises(AssetTooLarge) as together, \
            fetched_release(parse_reference(REFERENCE), token=published.token, max_total=10000):
        pass
    assert together.value.subject == REFERENCE  # all of them over the total bound
    with fetched_release(parse_reference(REFERENCE), token=published.token) as directory:
        fetched = {p.name: p.stat().st_mode & 0o777 for p in directory.iterdir()}
        assert oct(directory.parent.stat().st_mode & 0o777) == "0o700"
    assert set(fetched) == set(sizes) and set(fetched.values()) == {0o600}
    assert not directory.exists()


def test_the_expectation_is_the_consumers(published: Any, sigstore_instance: Any) -> None:
    other = f"{BUILDER.repository}@{'cd' * 20}"
    line = _one_line(_verify(REFERENCE, sigstore_instance.trusted_root, builder=other), 1)
    assert "SHA256SUMS.sigstore.json: signature does not verify" in line
    line = _one_line(_verify(REFERENCE, sigstore_instance.trusted_root, "--infra-repo", "evil/bench-infra"), 1)
    assert "signature does not verify" in line


@pytest.mark.parametrize(("target", "named"), [
    ("acme@v9.9.9", "OWNER/REPO@TAG: OWNER/REPO"), ("acme/widget@", "OWNER/REPO@TAG: TAG"),
    ("acme/widget@refs/tags/v9.9.9", "OWNER/REPO@TAG: TAG"), ("acme/widget@v1@v2", "OWNER/REPO@TAG: TAG"),
    ("acme/wid get@v1", "OWNER/REPO@TAG: OWNER/REPO"), ("acme/widget", "DIR|OWNER/REPO@TAG"),
])
def test_a_malformed_reference_is_a_usage_error(github_env: Any, tmp_path: Path, target: str, named: str) -> None:
    line = _one_line(_verify(target, tmp_path / "root.json"), 2)
    assert f"invalid {named}:" in line
    assert github_env.requests == []  # refused before GitHub is asked anything


def test_repo_and_tag_beside_a_reference_are_refused(github_env: Any, tmp_path: Path) -> None:
    line = _one_line(_verify(REFERENCE, tmp_path / "root.json", "--repo", SOURCE_REPO), 2)
    assert "already names the repository and tag you expect; drop them" in line
    line = _one_line(_verify(str(tmp_path), tmp_path / "root.json", "--token-file", str(tmp_path / "t")), 2)
    assert "--token-file: only with OWNER/REPO@TAG" in line
    assert github_env.requests == []
