"""Behavioural contracts of the workflows, read from the parsed YAML (not substrings of the file)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.contracts import DigestsFile, load_model, parse_subset
from pipeline.dispatch.dispatch import build_payload, workflow_inputs
from tests.doubles.github.actions import render_run_name
from tests.fixtures.github import digests_data

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / ".github" / "workflows"
RELEASE_JOBS = {"builder", "build", "attest", "resolve_images", "dispatch_infra", "promote_marker", "hold_back",
                "attach_result", "summarize"}
SHA_PIN = re.compile(r"\A[\w.-]+/[\w.-]+@[0-9a-f]{40}\Z")
EXPR = re.compile(r"\$\{\{(.*?)\}\}", re.S)
NEEDS_OUTPUT = re.compile(r"needs\.([A-Za-z0-9_-]+)\.outputs\.([A-Za-z0-9_-]+)")
RUNS_BENCHSEAL = re.compile(r"(?m)(?:^\s*|\$\()benchseal ")  # the CLI as a command, not the sudo user
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
REUSABLE = ("release.yml", "benchmark.yml")
EXAMPLES = ROOT / "examples"
# The callers an adopter and an infra repository commit (docs/github.md), and what each calls.
CALLERS = {EXAMPLES / "hello-agent" / ".github" / "workflows" / "release.yml": "release.yml",
           EXAMPLES / "bench-infra" / ".github" / "workflows" / "benchmark.yml": "benchmark.yml"}


def load_caller(path: Path) -> dict[Any, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))
    return data


def test_release_jobs_and_needs_graph() -> None:
    jobs = load("release.yml")["jobs"]
    assert set(jobs) == RELEASE_JOBS
    assert needs(jobs["build"]) == ["builder"]
    assert needs(jobs["attest"]) == ["builder", "build"]  # signs what the build uploaded, after it
    assert needs(jobs["resolve_images"]) == ["builder", "build", "attest"]  # dispatches only signed images
    assert needs(jobs["dispatch_infra"]) == ["builder", "resolve_images"]
    assert "dispatch_infra" in needs(jobs["promote_marker"])
    assert set(needs(jobs["summarize"])) == RELEASE_JOBS - {"summarize"}
    # gates: promote only after a successful dispatch; summarize always
    assert jobs["promote_marker"]["if"].replace(" ", "") == "${{needs.dispatch_infra.result=='success'}}"
    assert jobs["summarize"]["if"].replace(" ", "") == "${{always()}}"
    # a failed infra run (one that exists: it has a run id) fails the benchmark check, naming a gate's regression
    assert needs(jobs["hold_back"]) == ["resolve_images", "dispatch_infra"]
    assert jobs["hold_back"]["if"].replace(" ", "") == (
        "${{always()&&needs.dispatch_infra.result=='failure'&&needs.dispatch_infra.outputs.run_id!=''}}")
    # the sealed test result goes onto the runner image only after a successful (ungated) benchmark
    assert needs(jobs["attach_result"]) == ["builder", "dispatch_infra"]
    assert jobs["attach_result"]["if"].replace(" ", "") == "${{needs.dispatch_infra.result=='success'}}"
    [attach] = [s for s in steps(jobs["attach_result"]) if "benchseal attach-result" in str(s.get("run", ""))]
    assert attach["run"] == 'benchseal attach-result "$GITHUB_REPOSITORY@$TAG" --runner "$RUNNER_REF"'
    assert attach["env"]["RUNNER_REF"] == "${{ needs.dispatch_infra.outputs.runner_ref }}"
    for job in ("builder", "build", "attest", "resolve_images", "dispatch_infra"):
        assert "if" not in jobs[job]  # a failure upstream stops everything downstream


@pytest.mark.parametrize("name", REUSABLE)
def test_reusable_workflows_are_only_called_with_typed_inputs_and_explicit_secrets(name: str) -> None:
    wf = load(name)
    assert set(wf["on"]) == {"workflow_call"}, "benchseal's workflows run only when a caller pins them"
    call = wf["on"]["workflow_call"]
    for input_name, spec in call["inputs"].items():
        assert spec["type"] in ("string", "boolean", "number") and "description" in spec, input_name
        assert spec.get("required") is True or "default" in spec, f"{input_name}: optional without a default"
    for secret_name, spec in call["secrets"].items():
        assert "description" in spec and isinstance(spec.get("required"), bool), secret_name
    for output_name, spec in call.get("outputs", {}).items():
        assert re.fullmatch(r"\$\{\{ jobs\.[a-z_]+\.outputs\.[a-z_]+ \}\}", spec["value"]), output_name
        job, key = spec["value"].split("jobs.", 1)[1].split(" ")[0].split(".outputs.")
        assert key in wf["jobs"][job]["outputs"], output_name
    # the builder learns its own repository and commit from its OIDC token, nothing else
    builder = wf["jobs"]["builder"]
    assert builder["permissions"] == {"id-token": "write"}
    assert set(builder["outputs"]) == {"repository", "sha", "pin", "workflow_ref"}


@pytest.mark.parametrize("name", REUSABLE)
def test_benchseal_runs_from_the_builders_commit_never_the_callers_checkout(name: str) -> None:
    installs = 0
    for job_name, job in load(name)["jobs"].items():
        checkouts = {s["with"].get("path"): s["with"] for s in steps(job)
                     if str(s.get("uses", "")).startswith("actions/checkout@")}
        runs = "\n".join(str(s.get("run", "")) for s in steps(job))
        if not RUNS_BENCHSEAL.search(runs):
            continue
        builder = checkouts.get("builder")
        assert builder is not None, f"{job_name} runs benchseal without checking out the builder"
        assert builder["repository"] == "${{ needs.builder.outputs.repository }}", job_name
        assert builder["ref"] == "${{ needs.builder.outputs.sha }}", job_name
        assert "builder" in needs(job), job_name
        for step in steps(job):
            run = str(step.get("run", ""))
            if "pip install" in run:
                installs += 1
                assert run.strip() == "python -m pip install -c builder/requirements/constraints.txt ./builder", run
            for line in run.splitlines():
                if line.strip().startswith("benchseal --project-dir"):
                    assert line.strip().startswith("benchseal --project-dir builder "), line
        for path, spec in checkouts.items():
            assert spec.get("persist-credentials") is False, (job_name, path)
    assert installs


def test_build_captures_and_checks_the_digest_and_uploads_one_artifact_per_image() -> None:
    build = load("release.yml")["jobs"]["build"]
    assert build["strategy"]["matrix"]["image"] == ["runner", "api"]
    runs = [s["run"] for s in steps(build) if "run" in s]
    command = [" ".join(r.replace("\\\n", " ").split()) for r in runs if "benchseal --project-dir builder build" in r]
    assert len(command) == 1
    assert '--image "$IMAGE" --project "source/$PROJECT" --release-tag "$TAG"' in command[0]
    assert any("^sha256:[0-9a-f]{64}$" in r for r in runs)
    [upload] = [s for s in steps(build) if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert upload["with"]["if-no-files-found"] == "error"
    assert "${{ matrix.image }}" in upload["with"]["name"]
    # the release is the caller's checkout at the tag, beside benchseal's own
    [release] = [s["with"] for s in steps(build) if s.get("with", {}).get("path") == "source"]
    assert release["ref"] == "refs/tags/${{ inputs.tag }}" and "repository" not in release


def test_artifact_names_are_unique_per_image_and_downloads_match_uploads() -> None:
    jobs = load("release.yml")["jobs"]
    uploaded_by: dict[str, str] = {}
    for job_name, job in jobs.items():
        for artifact in artifact_names(job, "actions/upload-artifact@"):
            for concrete in expand_matrix(artifact, job):
                assert concrete not in uploaded_by, concrete
                uploaded_by[concrete] = job_name
    for job_name, job in jobs.items():
        for artifact in artifact_names(job, "actions/download-artifact@"):
            for concrete in expand_matrix(artifact, job):
                assert concrete in uploaded_by, f"{job_name} downloads unknown {concrete}"
                assert uploaded_by[concrete] in ancestors(jobs, job_name), f"{concrete} not upstream"
    assert len(uploaded_by) == 3


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


def test_summary_names_the_refs_actually_dispatched() -> None:
    jobs = load("release.yml")["jobs"]
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
    "release.yml": {
        # read its own job_workflow_ref and job_workflow_sha from its OIDC token
        "builder": {"id-token": "write"},
        # check out the release and benchseal; push the image to ghcr.io (the adopter's code runs here: no id-token)
        "build": {"contents": "read", "packages": "write"},
        # check out benchseal only; push the signature and attestations of the built digests; sign keylessly
        "attest": {"contents": "read", "packages": "write", "id-token": "write"},
        # check out; resolve the tag through the git refs API
        "resolve_images": {"contents": "read"},
        # check out; the dispatch itself uses BENCHSEAL_INFRA_DISPATCH_TOKEN
        "dispatch_infra": {"contents": "read"},
        # the benchseal/benchmark check run; no checkout
        "promote_marker": {"checks": "write"},
        "hold_back": {"checks": "write", "contents": "read"},
        # read the release's evidence; push the test result's referrer beside the runner (no signing)
        "attach_result": {"contents": "read", "packages": "write"},
        "summarize": {},
    },
    "benchmark.yml": {"builder": {"id-token": "write"}, "accept": {"contents": "read"}, "wait": {"contents": "read"},
                      # export the graded run; sign it as benchmark.yml; publish with the publish-token secret
                      "seal": {"contents": "read", "id-token": "write"}},
    "base.yml": {"base": {"contents": "read", "packages": "write"}},
}


@pytest.mark.parametrize("name", ALL)
def test_least_privilege_permissions(name: str) -> None:
    wf = load(name)
    assert wf["permissions"] == {}
    expected = JOB_PERMISSIONS[name]
    assert set(wf["jobs"]) == set(expected)
    for job_name, job in wf["jobs"].items():
        assert "permissions" in job, f"{job_name} must state its permissions"
        assert (job["permissions"] or {}) == expected[job_name], job_name


def checks_out_other_code(job: dict[str, Any]) -> bool:
    """Whether ``job`` checks out anything but benchseal at the builder's commit (the caller's code:
    its agent, its build scripts), which its steps then build and so run."""
    for step in steps(job):
        if str(step.get("uses", "")).startswith("actions/checkout@"):
            spec = step.get("with", {})
            if (spec.get("repository"), spec.get("ref")) != ("${{ needs.builder.outputs.repository }}",
                                                             "${{ needs.builder.outputs.sha }}"):
                return True
    return False


def test_no_job_that_runs_adopter_code_can_mint_an_id_token() -> None:
    """SLSA Build L3: the job that builds the adopter's code (its wheel's setup.py runs there, isolated)
    cannot mint benchseal's builder identity; only jobs running benchseal's own checkout sign. (In
    benchmark.yml the caller is the infra operator, whose checkout is its policy, read as data; the
    adopter's agent runs only on the infra host's sandbox.)"""
    jobs = load("release.yml")["jobs"]
    adopter = {job_name for job_name, job in jobs.items() if checks_out_other_code(job)}
    assert adopter == {"build"}  # the rule is not vacuous: the build checks out the caller's tag
    for job_name in adopter:
        assert "id-token" not in (jobs[job_name].get("permissions") or {}), job_name


def test_the_signing_job_receives_only_the_built_digests() -> None:
    """attest checks out only benchseal (nothing of the adopter's that it could execute), takes from the
    build only its digests files (artifacts), which `benchseal attest` re-validates before signing."""
    jobs = load("release.yml")["jobs"]
    signers = {job_name for job_name, job in jobs.items() if (job.get("permissions") or {}).get("id-token") == "write"}
    assert signers == {"builder", "attest"}
    assert steps(jobs["builder"]) and not any("uses" in step for step in steps(jobs["builder"]))  # no checkout at all
    attest = jobs["attest"]
    assert not checks_out_other_code(attest)
    assert [s["with"]["path"] for s in steps(attest) if str(s.get("uses", "")).startswith("actions/checkout@")] == [
        "builder"]
    downloads = [s["with"] for s in steps(attest) if str(s.get("uses", "")).startswith("actions/download-artifact@")]
    assert downloads == [{"name": "benchseal-digests-${{ matrix.image }}", "path": "digests"}]
    assert "needs.build." not in yaml.safe_dump(attest)  # no output of the build's, only the artifact
    runs = [str(s.get("run", "")) for s in steps(attest) if "run" in s]
    assert runs[0] == "python -m pip install -c builder/requirements/constraints.txt ./builder"
    [sign] = [r for r in runs if "attest --digests" in r]
    assert 'benchseal --project-dir builder attest --digests "digests/digests-$IMAGE.json"' in sign
    assert len(runs) == 2  # nothing else runs there
    # The cosign it signs with: 3.1 (bundle-format image signatures, --type enforced), by the installer's commit,
    # installed before the signing step.
    names = [s.get("name") for s in steps(attest)]
    [install] = [s for s in steps(attest) if str(s.get("uses", "")).startswith("sigstore/cosign-installer@")]
    assert re.fullmatch(r"sigstore/cosign-installer@[0-9a-f]{40}", install["uses"])
    assert re.fullmatch(r"v3\.1\.[0-9]+", str(install["with"]["cosign-release"]))
    assert names.index(install["name"]) < names.index("Sign and attest the image (keyless, as this reusable workflow)")
    # the build no longer signs
    assert not any("attest" in str(s.get("run", "")) for s in steps(jobs["build"]))


LOGIN_ACTION = "docker/login-action@74a5d142397b4f367a81961eba4e8cd7edddf772"


@pytest.mark.parametrize("name", ["release.yml", "base.yml"])
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
                  any(verb in str(s.get("run", "")) for verb in (" build", " attest", " attach-result"))]
        assert pushes, job_name
        for step in pushes:  # logged in before anything is pushed
            assert names.index(login["name"]) < names.index(step["name"]), (job_name, step["name"])


def test_the_release_build_uses_benchseals_committed_base_lock_frozen() -> None:
    build = load("release.yml")["jobs"]["build"]
    assert build["env"] == {"BENCHSEAL_BASE_FROZEN": "1"}
    [step] = [s for s in steps(build) if "benchseal --project-dir builder build" in str(s.get("run", ""))]
    assert 'export BENCHSEAL_BASE_LOCK="$GITHUB_WORKSPACE/builder/images/base.production.lock.json"' in step["run"]
    assert (ROOT / "images" / "base.production.lock.json").is_file(), "the committed lock"
    runs = " ".join(str(s.get("run", "")) for s in steps(build))
    assert "mmdebstrap" not in runs, "a frozen build never builds a base"


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


def test_dispatch_uses_workflow_dispatch_with_the_dispatch_token() -> None:
    dispatch = load("release.yml")["jobs"]["dispatch_infra"]
    [step] = [s for s in steps(dispatch) if s.get("id") == "dispatch"]
    command = " ".join(step["run"].replace("\\\n", " ").split())
    assert ('benchseal dispatch --repo "$INFRA_REPOSITORY" --workflow-file "$INFRA_WORKFLOW" --workflow-dispatch'
            in command)
    assert step["env"]["GITHUB_TOKEN"] == "${{ secrets.infra-dispatch-token }}"
    # the infra caller declares exactly the inputs benchseal sends, all required strings
    digests = load_model(DigestsFile, digests_data(), "digests")
    sent = workflow_inputs(build_payload(digests, correlation_id="c-12345678", tag="v1.2.3"))
    declared = load_caller(EXAMPLES / "bench-infra" / ".github" / "workflows" / "benchmark.yml")[
        "on"]["workflow_dispatch"]["inputs"]
    assert set(sent) == set(declared)
    assert all(spec["required"] is True and spec["type"] == "string" for spec in declared.values())


def test_the_suite_and_a_subset_of_its_tasks_are_inputs_that_reach_the_dispatch_through_the_environment() -> None:
    """release.yml's suite and tasks inputs (issue 36.4): optional strings whose defaults are every task of smoke,
    handed to `benchseal dispatch` as environment variables, never interpolated into the script; the payload they
    make carries them (the subset in its one spelling), and the same payload sent as workflow inputs too."""
    wf = load("release.yml")
    inputs = wf["on"]["workflow_call"]["inputs"]
    assert {name: (inputs[name]["type"], inputs[name]["required"], inputs[name]["default"])
            for name in ("suite", "tasks")} == {"suite": ("string", False, "smoke"), "tasks": ("string", False, "")}
    [step] = [s for s in steps(wf["jobs"]["dispatch_infra"]) if s.get("id") == "dispatch"]
    assert (step["env"]["SUITE"], step["env"]["TASKS"]) == ("${{ inputs.suite }}", "${{ inputs.tasks }}")
    assert '--suite "$SUITE" --tasks "$TASKS"' in " ".join(step["run"].replace("\\\n", " ").split())
    digests = load_model(DigestsFile, digests_data(), "digests")
    payload = build_payload(digests, correlation_id="c-12345678", tag="v1.2.3", suite="humaneval",
                            tasks=parse_subset("humaneval-32,humaneval-0"))
    assert json.loads(workflow_inputs(payload)["payload"])["tasks"] == ["humaneval-0", "humaneval-32"]
    whole = build_payload(digests, correlation_id="c-12345678", tag="v1.2.3", tasks=parse_subset(""))
    assert "tasks" not in json.loads(workflow_inputs(whole)["payload"])


@pytest.mark.parametrize("caller", sorted(CALLERS), ids=lambda p: p.parent.parent.parent.name)
def test_each_caller_passes_declared_inputs_explicit_secrets_and_enough_permissions(caller: Path) -> None:
    wf = load_caller(caller)
    called = load(CALLERS[caller])
    assert wf["permissions"] == {}
    [(job_name, job)] = wf["jobs"].items()
    assert job["uses"] == f"benchseal/benchseal/.github/workflows/{CALLERS[caller]}@BENCHSEAL_COMMIT"
    declared = called["on"]["workflow_call"]
    assert set(job["with"]) <= set(declared["inputs"])
    assert {n for n, spec in declared["inputs"].items() if spec.get("required")} <= set(job["with"])
    assert isinstance(job["secrets"], dict), "secrets are passed by name, never `inherit`"
    assert set(job["secrets"]) <= set(declared["secrets"])
    assert {n for n, spec in declared["secrets"].items() if spec["required"]} <= set(job["secrets"])
    # GitHub refuses a called job asking for more than its caller grants: grant exactly the union
    union: dict[str, str] = {}
    for called_job in called["jobs"].values():
        for scope, level in (called_job.get("permissions") or {}).items():
            union[scope] = "write" if "write" in (union.get(scope), level) else level
    assert job["permissions"] == union, job_name


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


def test_callers_concurrency_groups_are_keyed_by_release_or_correlation() -> None:
    adopter, infra = (load_caller(path) for path in sorted(CALLERS, key=lambda p: CALLERS[p], reverse=True))
    assert adopter["concurrency"]["group"] == "benchseal-release-${{ inputs.deploy_ref || github.ref_name }}"
    bench = infra["concurrency"]["group"]
    assert "correlation_id" in bench and bench.startswith("benchmark-")
    for wf in (adopter, infra, load("base.yml")):
        assert wf["concurrency"]["cancel-in-progress"] is False


def test_callers_run_names_end_in_the_correlation_id() -> None:
    release = load_caller(EXAMPLES / "hello-agent" / ".github" / "workflows" / "release.yml")
    assert set(release["on"]["workflow_dispatch"]["inputs"]) == {"deploy_ref", "switchboard_correlation_id"}
    ctx = {"inputs": {"deploy_ref": "v1.2.3", "switchboard_correlation_id": "sb-0001-abcdef"}, "github": {}}
    assert render_run_name(release["run-name"], ctx) == "Release v1.2.3 sb-0001-abcdef"
    bench = load_caller(EXAMPLES / "bench-infra" / ".github" / "workflows" / "benchmark.yml")
    assert bench["on"]["repository_dispatch"]["types"] == ["benchseal-benchmark"]
    rd = {"github": {"event": {"client_payload": {"source": {"tag": "v1.2.3"}, "correlation_id": "c-12345678"}}}}
    wd = {"inputs": {"tag": "v1.2.3", "correlation_id": "c-87654321"}, "github": {"event": {}}}
    assert render_run_name(bench["run-name"], rd).endswith(" c-12345678")
    assert render_run_name(bench["run-name"], wd).endswith(" c-87654321")


def test_benchmark_hands_the_payload_to_infra_accept_from_a_file() -> None:
    accept = load("benchmark.yml")["jobs"]["accept"]
    [write] = [s for s in steps(accept) if "DISPATCH_PAYLOAD" in (s.get("env") or {})]
    assert write["env"]["DISPATCH_PAYLOAD"] == "${{ inputs.payload }}"
    assert '"$DISPATCH_PAYLOAD" > "$RUNNER_TEMP/payload.json"' in write["run"]
    names = [s.get("name") for s in steps(accept)]
    [check] = [s for s in steps(accept) if "benchseal infra validate" in (s.get("run") or "")]
    [enqueue] = [s for s in steps(accept) if s.get("id") == "accept"]
    assert names.index(check["name"]) < names.index(enqueue["name"]), "validate before handing over"
    assert check["run"] == 'benchseal infra validate --payload "$RUNNER_TEMP/payload.json" --policy infra/policies/infra.yaml'
    [infra] = [s["with"] for s in steps(accept) if s.get("with", {}).get("path") == "infra"]
    assert "repository" not in infra, "the policy is the infra repository's own (the caller's)"
    # The queue is the benchseal user's: only the sudo-admitted wrappers reach it.
    # Its first line is the digest of the checked-out policy (one home: the host refuses another file).
    assert 'policy_digest="sha256:$(sha256sum infra/policies/infra.yaml | cut -d\' \' -f1)"' in enqueue["run"]
    assert ('{ printf \'%s\\n\' "$policy_digest"; cat "$RUNNER_TEMP/payload.json"; } \\\n'
            '  | sudo -n -u benchseal /usr/local/libexec/benchseal-accept > "$RUNNER_TEMP/accept.json"') in enqueue["run"]
    wait = load("benchmark.yml")["jobs"]["wait"]
    assert needs(wait) == ["accept"]
    [poll] = [s for s in steps(wait) if "INFRA_RUN_ID" in (s.get("env") or {})]
    assert "sudo -n -u benchseal /usr/local/libexec/benchseal-status" in poll["run"]
    for job in load("benchmark.yml")["jobs"].values():
        for step in steps(job):
            run = step.get("run") or ""
            assert "benchseal infra accept" not in run and "benchseal infra status" not in run, \
                "infra state is reached only through the wrappers"


@pytest.mark.parametrize("caller", sorted(CALLERS), ids=lambda p: p.parent.parent.parent.name)
def test_the_adoption_guide_shows_each_caller_in_full(caller: Path) -> None:
    guide = (ROOT / "docs" / "github.md").read_text(encoding="utf-8")
    assert f"```yaml\n{caller.read_text(encoding='utf-8').rstrip()}\n```" in guide
