"""Behavioural contracts of the workflows, read from the parsed YAML (not substrings of the file)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.contracts import DigestsFile, load_model
from pipeline.dispatch.dispatch import build_payload, workflow_inputs
from tests.doubles.github.actions import render_run_name
from tests.fixtures.github import digests_data

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / ".github" / "workflows"
RELEASE_WORKFLOWS = ("tag.yml", "runner-release.yml")
RELEASE_JOBS = {"build", "resolve_images", "dispatch_infra", "promote_marker", "summarize"}
SHA_PIN = re.compile(r"\A[\w.-]+/[\w.-]+@[0-9a-f]{40}\Z")
EXPR = re.compile(r"\$\{\{(.*?)\}\}", re.S)
NEEDS_OUTPUT = re.compile(r"needs\.([A-Za-z0-9_-]+)\.outputs\.([A-Za-z0-9_-]+)")
STEP_OUTPUT = re.compile(r"steps\.([A-Za-z0-9_-]+)\.outputs\.([A-Za-z0-9_-]+)")


def load(name: str) -> dict[Any, Any]:
    data = yaml.safe_load((DIR / name).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads `on` as True
    return data


def needs(job: dict[str, Any]) -> list[str]:
    value = job.get("needs", [])
    return [value] if isinstance(value, str) else list(value)


def ancestors(jobs: dict[str, Any], name: str) -> set[str]:
    seen: set[str] = set()
    todo = needs(jobs[name])
    while todo:
        parent = todo.pop()
        if parent not in seen:
            seen.add(parent)
            todo.extend(needs(jobs[parent]))
    return seen


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job.get("steps", []))


def artifact_names(job: dict[str, Any], action: str) -> list[str]:
    return [s["with"]["name"] for s in steps(job) if str(s.get("uses", "")).startswith(action)]


def expand_matrix(text: str, job: dict[str, Any]) -> list[str]:
    matrix = job.get("strategy", {}).get("matrix", {})
    if "${{ matrix.image }}" not in text:
        return [text]
    return [text.replace("${{ matrix.image }}", image) for image in matrix["image"]]


ALL = sorted(p.name for p in DIR.glob("*.yml"))


@pytest.mark.parametrize("name", RELEASE_WORKFLOWS)
def test_release_jobs_and_needs_graph(name: str) -> None:
    jobs = load(name)["jobs"]
    assert set(jobs) == RELEASE_JOBS
    assert needs(jobs["resolve_images"]) == ["build"]
    assert needs(jobs["dispatch_infra"]) == ["resolve_images"]
    assert "dispatch_infra" in needs(jobs["promote_marker"])
    assert set(needs(jobs["summarize"])) == RELEASE_JOBS - {"summarize"}
    # gates: promote only after a successful dispatch; summarize always
    assert jobs["promote_marker"]["if"].replace(" ", "") == "${{needs.dispatch_infra.result=='success'}}"
    assert jobs["summarize"]["if"].replace(" ", "") == "${{always()}}"
    for job in ("build", "resolve_images", "dispatch_infra"):
        assert "if" not in jobs[job]  # a failure upstream stops everything downstream


def test_tag_and_runner_release_have_the_same_shape() -> None:
    a, b = load("tag.yml")["jobs"], load("runner-release.yml")["jobs"]
    for job in RELEASE_JOBS:
        assert (needs(a[job]), a[job].get("if"), a[job].get("permissions")) == (
            needs(b[job]), b[job].get("if"), b[job].get("permissions"))
        assert [s.get("name") for s in steps(a[job])] == [s.get("name") for s in steps(b[job])]


@pytest.mark.parametrize("name", RELEASE_WORKFLOWS)
def test_build_captures_and_checks_the_digest_and_uploads_one_artifact_per_image(name: str) -> None:
    build = load(name)["jobs"]["build"]
    assert build["strategy"]["matrix"]["image"] == ["runner", "api"]
    runs = [s["run"] for s in steps(build) if "run" in s]
    assert any(r.startswith("benchseal --project-dir \"$GITHUB_WORKSPACE\" build") and '--image "$IMAGE"' in r for r in runs)
    assert any("^sha256:[0-9a-f]{64}$" in r and "GITHUB_OUTPUT" in r for r in runs)
    [upload] = [s for s in steps(build) if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert upload["with"]["if-no-files-found"] == "error"
    assert "${{ matrix.image }}" in upload["with"]["name"]


def test_artifact_names_are_unique_per_image_and_workflow_and_downloads_match_uploads() -> None:
    everywhere: list[str] = []
    for name in RELEASE_WORKFLOWS:
        jobs = load(name)["jobs"]
        uploaded_by: dict[str, str] = {}
        for job_name, job in jobs.items():
            for artifact in artifact_names(job, "actions/upload-artifact@"):
                for concrete in expand_matrix(artifact, job):
                    assert concrete not in uploaded_by, concrete
                    uploaded_by[concrete] = job_name
        everywhere += uploaded_by
        for job_name, job in jobs.items():
            for artifact in artifact_names(job, "actions/download-artifact@"):
                assert artifact in uploaded_by, f"{name}: {job_name} downloads unknown {artifact}"
                assert uploaded_by[artifact] in ancestors(jobs, job_name), f"{name}: {artifact} not upstream"
    assert len(everywhere) == len(set(everywhere)) == 6


@pytest.mark.parametrize("name", ALL)
def test_outputs_consumed_exist_upstream(name: str) -> None:
    jobs = load(name)["jobs"]
    for job_name, job in jobs.items():
        for output, expr in (job.get("outputs") or {}).items():
            for step_id, _key in STEP_OUTPUT.findall(expr):
                assert step_id in {s.get("id") for s in steps(job)}, f"{job_name}.outputs.{output}"
        text = yaml.safe_dump(job)
        for parent, key in NEEDS_OUTPUT.findall(text):
            assert parent in needs(job), f"{job_name} reads {parent} without needing it"
            assert key in (jobs[parent].get("outputs") or {}), f"{job_name} reads missing {parent}.outputs.{key}"


@pytest.mark.parametrize("name", RELEASE_WORKFLOWS)
def test_summary_names_the_refs_actually_dispatched(name: str) -> None:
    jobs = load(name)["jobs"]
    env = steps(jobs["summarize"])[0]["env"]
    assert env["DISPATCHED_RUNNER"] == "${{ needs.dispatch_infra.outputs.runner_ref }}"
    assert env["DISPATCHED_API"] == "${{ needs.dispatch_infra.outputs.api_ref }}"
    # ...which dispatch_infra takes from `benchseal dispatch --json`, not from resolve_images
    dispatch = jobs["dispatch_infra"]
    assert dispatch["outputs"]["runner_ref"] == "${{ steps.dispatch.outputs.runner_ref }}"
    [step] = [s for s in steps(dispatch) if s.get("id") == "dispatch"]
    assert "benchseal dispatch" in step["run"] and "--json" in step["run"]
    assert "GITHUB_STEP_SUMMARY" in steps(jobs["summarize"])[0]["run"]


# Exactly what each job's GITHUB_TOKEN may do (docs/github.md lists the same table).
JOB_PERMISSIONS: dict[str, dict[str, dict[str, str]]] = {
    "release": {
        # check out; push the image, its signature and attestations to ghcr.io; sign keylessly
        "build": {"contents": "read", "packages": "write", "id-token": "write"},
        # check out; resolve the tag through the git refs API
        "resolve_images": {"contents": "read"},
        # check out; the dispatch itself uses BENCHSEAL_INFRA_DISPATCH_TOKEN
        "dispatch_infra": {"contents": "read"},
        # the benchseal/benchmark check run; no checkout
        "promote_marker": {"checks": "write"},
        "summarize": {},
    },
    "benchmark.yml": {"accept": {"contents": "read"}, "wait": {"contents": "read"},
                      # export the graded run; sign it as benchmark.yml; publish with BENCHSEAL_PUBLISH_TOKEN
                      "seal": {"contents": "read", "id-token": "write"}},
    "base.yml": {"base": {"contents": "read", "packages": "write"}},
}


@pytest.mark.parametrize("name", ALL)
def test_least_privilege_permissions(name: str) -> None:
    wf = load(name)
    assert wf["permissions"] == {}
    expected = JOB_PERMISSIONS["release" if name in RELEASE_WORKFLOWS else name]
    assert set(wf["jobs"]) == set(expected)
    for job_name, job in wf["jobs"].items():
        assert "permissions" in job, f"{job_name} must state its permissions"
        assert (job["permissions"] or {}) == expected[job_name], job_name


LOGIN_ACTION = "docker/login-action@74a5d142397b4f367a81961eba4e8cd7edddf772"


@pytest.mark.parametrize("name", [*RELEASE_WORKFLOWS, "base.yml"])
def test_jobs_that_push_log_in_to_ghcr_with_github_token_and_only_they(name: str) -> None:
    for job_name, job in load(name)["jobs"].items():
        logins = [s for s in steps(job) if str(s.get("uses", "")).startswith("docker/login-action@")]
        if (job.get("permissions") or {}).get("packages") != "write":
            assert logins == [], f"{job_name} logs in without packages: write"
            continue
        [login] = logins
        assert login["uses"] == LOGIN_ACTION
        assert login["with"] == {"registry": "ghcr.io", "username": "${{ github.actor }}",
                                 "password": "${{ github.token }}"}
        names = [s.get("name") for s in steps(job)]
        pushes = [s for s in steps(job) if "benchseal" in str(s.get("run", "")) and
                  any(verb in str(s.get("run", "")) for verb in (" build", " attest"))]
        assert pushes, job_name
        for step in pushes:  # logged in before anything is pushed
            assert names.index(login["name"]) < names.index(step["name"]), (job_name, step["name"])


@pytest.mark.parametrize("name", RELEASE_WORKFLOWS)
def test_the_release_build_uses_the_committed_base_lock_frozen(name: str) -> None:
    build = load(name)["jobs"]["build"]
    assert build["env"] == {"BENCHSEAL_BASE_LOCK": "images/base.production.lock.json", "BENCHSEAL_BASE_FROZEN": "1"}
    assert (ROOT / build["env"]["BENCHSEAL_BASE_LOCK"]).is_file(), "the committed lock"
    runs = " ".join(str(s.get("run", "")) for s in steps(build))
    assert "mmdebstrap" not in runs, "a frozen build never builds a base"
    # the build and attest steps read this checkout (app layer, source.commit, the lock)
    for step in steps(build):
        if str(step.get("run", "")).startswith("benchseal "):
            assert step["run"].startswith('benchseal --project-dir "$GITHUB_WORKSPACE" '), step["run"]


def test_base_workflow_builds_the_bases_with_mmdebstrap_and_uploads_the_lock() -> None:
    wf = load("base.yml")
    assert set(wf["on"]) == {"workflow_dispatch"}
    job = wf["jobs"]["base"]
    runs = [str(s.get("run", "")) for s in steps(job)]
    assert any("apt-get install" in r and "mmdebstrap" in r for r in runs)
    [build] = [s for s in steps(job) if "base build" in str(s.get("run", ""))]
    assert build["env"]["BENCHSEAL_BASE_LOCK"] == "images/base.production.lock.json"
    assert "BENCHSEAL_BASE_FROZEN" not in build["env"] and "--rebuild" in build["run"]
    [upload] = [s for s in steps(job) if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert upload["with"]["path"] == "images/base.production.lock.json"
    assert upload["with"]["if-no-files-found"] == "error"


@pytest.mark.parametrize("name", RELEASE_WORKFLOWS)
def test_dispatch_uses_workflow_dispatch_with_the_dispatch_token(name: str) -> None:
    dispatch = load(name)["jobs"]["dispatch_infra"]
    [step] = [s for s in steps(dispatch) if s.get("id") == "dispatch"]
    command = " ".join(step["run"].replace("\\\n", " ").split())
    assert "benchseal dispatch --repo \"$INFRA_REPOSITORY\" --workflow-file benchmark.yml --workflow-dispatch" in command
    assert step["env"]["GITHUB_TOKEN"] == "${{ secrets.BENCHSEAL_INFRA_DISPATCH_TOKEN }}"
    # the infra workflow declares exactly the inputs benchseal sends, all required strings
    digests = load_model(DigestsFile, digests_data(), "digests")
    sent = workflow_inputs(build_payload(digests, correlation_id="c-12345678", tag="v1.2.3"))
    declared = load("benchmark.yml")["on"]["workflow_dispatch"]["inputs"]
    assert set(sent) == set(declared)
    assert all(spec["required"] is True and spec["type"] == "string" for spec in declared.values())


@pytest.mark.parametrize("name", ALL)
def test_actions_pinned_by_full_sha_with_version_comment(name: str) -> None:
    lines = (DIR / name).read_text().splitlines()
    uses = [line for line in lines if re.match(r"\s*(- )?uses:", line)]
    assert uses
    for line in uses:
        ref, _, comment = line.split("uses:", 1)[1].partition("#")
        assert SHA_PIN.match(ref.strip()), line
        assert re.match(r"\s*v\d+(\.\d+)*\s*\Z", comment), f"version comment missing: {line}"


@pytest.mark.parametrize("name", ALL)
def test_no_expressions_in_run_scripts_and_secrets_only_in_env(name: str) -> None:
    for job_name, job in load(name)["jobs"].items():
        for step in steps(job):
            if "run" in step:
                assert "${{" not in step["run"], f"{job_name}: pass values via env, not ${{{{ }}}} in run"
            assert "secrets." not in yaml.safe_dump(step.get("with", {})), job_name
        for step in steps(job):
            for key, value in (step.get("env") or {}).items():
                if "secrets." in str(value):
                    assert key.isupper(), key


def test_concurrency_groups_are_keyed_by_release_or_correlation() -> None:
    assert load("tag.yml")["concurrency"]["group"] == "benchseal-release-${{ github.ref_name }}"
    assert load("runner-release.yml")["concurrency"]["group"] == "benchseal-release-${{ inputs.deploy_ref }}"
    bench = load("benchmark.yml")["concurrency"]["group"]
    assert "correlation_id" in bench and bench.startswith("benchmark-")
    for name in ALL:
        assert load(name)["concurrency"]["cancel-in-progress"] is False


def test_run_names_end_in_the_correlation_id() -> None:
    release = load("runner-release.yml")
    assert set(release["on"]["workflow_dispatch"]["inputs"]) == {"deploy_ref", "switchboard_correlation_id"}
    ctx = {"inputs": {"deploy_ref": "v1.2.3", "switchboard_correlation_id": "sb-0001-abcdef"}}
    assert render_run_name(release["run-name"], ctx) == "Runner release v1.2.3 sb-0001-abcdef"
    bench = load("benchmark.yml")
    assert bench["on"]["repository_dispatch"]["types"] == ["benchseal-benchmark"]
    rd = {"github": {"event": {"client_payload": {"source": {"tag": "v1.2.3"}, "correlation_id": "c-12345678"}}}}
    wd = {"inputs": {"tag": "v1.2.3", "correlation_id": "c-87654321"}, "github": {"event": {}}}
    assert render_run_name(bench["run-name"], rd).endswith(" c-12345678")
    assert render_run_name(bench["run-name"], wd).endswith(" c-87654321")


def test_benchmark_hands_the_payload_to_infra_accept_from_a_file() -> None:
    accept = load("benchmark.yml")["jobs"]["accept"]
    [write] = [s for s in steps(accept) if "DISPATCH_PAYLOAD" in (s.get("env") or {})]
    assert "client_payload" in write["env"]["DISPATCH_PAYLOAD"] and "inputs.payload" in write["env"]["DISPATCH_PAYLOAD"]
    assert '"$DISPATCH_PAYLOAD" > "$RUNNER_TEMP/payload.json"' in write["run"]
    names = [s.get("name") for s in steps(accept)]
    [check] = [s for s in steps(accept) if "benchseal infra validate" in (s.get("run") or "")]
    [enqueue] = [s for s in steps(accept) if s.get("id") == "accept"]
    assert names.index(check["name"]) < names.index(enqueue["name"]), "validate before handing over"
    assert '--payload "$RUNNER_TEMP/payload.json"' in check["run"]
    # The queue is the benchseal user's: only the sudo-admitted wrappers reach it.
    assert 'sudo -n -u benchseal /usr/local/libexec/benchseal-accept < "$RUNNER_TEMP/payload.json"' in enqueue["run"]
    wait = load("benchmark.yml")["jobs"]["wait"]
    assert needs(wait) == ["accept"]
    [poll] = [s for s in steps(wait) if "INFRA_RUN_ID" in (s.get("env") or {})]
    assert "sudo -n -u benchseal /usr/local/libexec/benchseal-status" in poll["run"]
    for job in load("benchmark.yml")["jobs"].values():
        for step in steps(job):
            run = step.get("run") or ""
            assert "benchseal infra accept" not in run and "benchseal infra status" not in run, \
                "infra state is reached only through the wrappers"


@pytest.mark.parametrize("name", ALL)
def test_benchseal_is_installed_from_the_checkout_with_its_data(name: str) -> None:
    # A regular install of the checkout: the wheel bundles images/, policies/ and suites/
    # (pipeline/_project, setup.py). The infra side (benchmark.yml, issue 11) still installs editable.
    expected = "-e ." if name == "benchmark.yml" else "."
    installs = 0
    for job_name, job in load(name)["jobs"].items():
        for step in steps(job):
            run = str(step.get("run", ""))
            if "pip install" in run:
                installs += 1
                assert run.strip() == f"python -m pip install -c requirements/constraints.txt {expected}", (job_name, run)
    assert installs
