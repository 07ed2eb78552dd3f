"""benchmark.yml's seal job keeps the sealed evidence when publishing fails.

The job's own last step (taken from the committed workflow, unchanged) runs in the Actions
harness after a seal step that writes a release directory and a publish step whose outcome the
test chooses: the evidence is uploaded as ``sealed-evidence-<run id>``, whole and with its
layout, exactly when the seal succeeded and the publication failed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.workflows.harness import Runner, RunResult, Trigger, run_workflow

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK = ROOT / ".github" / "workflows" / "benchmark.yml"
KEEP = "Keep the sealed evidence when publishing failed"
RUN_ID = "4242"

# What `benchseal evidence` leaves (the layout is kept: nested files keep their folders).
SEALED = {"summary.json": "{}\n", "SHA256SUMS": "sums\n", "SHA256SUMS.sigstore.json": "{}\n",
          "trials/hello/result.json": "{}\n"}


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "source"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["-c", "user.email=t@example.test", "-c", "user.name=t",
                                                 "commit", "-q", "--allow-empty", "-m", "one"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                         text=True).stdout.strip()
    return repo, sha


def _seal_job_ending(seal_ok: bool, publish_ok: bool) -> dict[str, Any]:
    """The committed seal job with its steps before publishing replaced by one that writes the
    sealed directory (or fails), and its publish step by one with the chosen outcome."""
    seal = yaml.safe_load(BENCHMARK.read_text("utf-8"))["jobs"]["seal"]
    names = [s.get("name") for s in seal["steps"]]
    publish_at = names.index("Publish to the source repository's release")
    if names[publish_at + 1] != KEEP:
        raise AssertionError(f"the keep step must come right after publishing: {names}")
    # What follows (the history record, the gate) runs only on success: never after a failed publication.
    assert all("failure()" not in str(step.get("if", "")) and "always()" not in str(step.get("if", ""))
               for step in seal["steps"][publish_at + 2:]), seal["steps"][publish_at + 2:]
    write = "\n".join(f'mkdir -p "$(dirname "$RUNNER_TEMP/run/{name}")"; printf "%s" "{text.strip()}" '
                      f'> "$RUNNER_TEMP/run/{name}"' for name, text in SEALED.items())
    fake_seal = {"name": "seal (stand-in)", "id": "seal", "shell": "bash",
                 "run": (f'{write}\necho "artifacts=$RUNNER_TEMP/run" >> "$GITHUB_OUTPUT"' if seal_ok
                         else "echo 'seal failed' >&2; exit 1")}
    fake_publish = {"name": "publish (stand-in)", "id": "publish", "shell": "bash",
                    "run": "true" if publish_ok else "echo 'publish: GitHub answered HTTP 502' >&2; exit 1"}
    # needs: the builder job (which only names benchseal's commit for the replaced checkouts) is left out
    assert seal["needs"] == ["builder", "accept", "wait"], seal["needs"]
    return {**seal, "needs": ["accept", "wait"], "steps": [fake_seal, fake_publish, seal["steps"][publish_at + 1]]}


def _run(tmp_path: Path, source: tuple[Path, str], seal_ok: bool, publish_ok: bool) -> RunResult:
    seal = _seal_job_ending(seal_ok, publish_ok)
    doc = {"name": "benchmark", "on": {"workflow_dispatch": {}}, "permissions": {}, "jobs": {
        "accept": {"runs-on": "ubuntu-24.04", "permissions": {"contents": "read"},
                   "outputs": {"run_id": "${{ steps.accept.outputs.run_id }}"},
                   "steps": [{"id": "accept", "shell": "bash", "run": f'echo "run_id={RUN_ID}" >> "$GITHUB_OUTPUT"'}]},
        "wait": {"runs-on": "ubuntu-24.04", "needs": "accept", "permissions": {"contents": "read"},
                 "steps": [{"shell": "bash", "run": "true"}]},
        "seal": seal,
    }}
    path = tmp_path / "benchmark.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    repo, sha = source
    trigger = Trigger(event_name="workflow_dispatch", repository="acme/bench-infra", sha=sha, ref="refs/heads/main")
    return run_workflow(path, trigger, Runner(root=tmp_path / "runner", source=repo, oidc=_no_token))


def _no_token(audience: str, claims: Mapping[str, str]) -> str:
    raise AssertionError("nothing in these steps signs: no OIDC token is asked for")


def _kept(run: RunResult) -> dict[str, str]:
    store = run.run_dir / "artifacts" / f"sealed-evidence-{RUN_ID}"
    if not store.exists():
        return {}
    return {p.relative_to(store).as_posix(): p.read_text() for p in store.rglob("*") if p.is_file()}


def test_a_failed_publication_keeps_the_whole_sealed_directory(tmp_path: Path, source: tuple[Path, str]) -> None:
    run = _run(tmp_path, source, seal_ok=True, publish_ok=False)
    job = run.jobs["seal"]
    assert job.result == "failure", run.describe()  # the job still fails: the release is not published
    assert [s.conclusion for s in job.legs[0]] == ["success", "failure", "success"], run.describe()
    assert _kept(run) == {name: text.strip() for name, text in SEALED.items()}


@pytest.mark.parametrize("seal_ok, publish_ok", [(True, True), (False, False)])
def test_nothing_is_kept_after_a_publication_or_without_a_seal(tmp_path: Path, source: tuple[Path, str],
                                                               seal_ok: bool, publish_ok: bool) -> None:
    run = _run(tmp_path, source, seal_ok=seal_ok, publish_ok=publish_ok)
    steps = run.jobs["seal"].legs[0]
    assert steps[-1].conclusion == "skipped", run.describe()
    assert _kept(run) == {}
