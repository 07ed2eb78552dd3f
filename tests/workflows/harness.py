"""Runs the project's GitHub Actions workflows as Actions would, for the parts they use.

This is a test harness, not a product feature. It executes a workflow file's jobs in
``needs`` order with their ``if:`` conditions (``needs.<job>.result`` and
``needs.<job>.outputs.*`` included), expands a ``strategy.matrix``, runs every step's
``run:`` script with ``bash`` (``shell: bash`` -> ``bash --noprofile --norc -eo pipefail``,
no shell -> ``bash -e``), its ``env`` and ``id``, and gives each step the
``GITHUB_OUTPUT`` / ``GITHUB_ENV`` / ``GITHUB_STEP_SUMMARY`` / ``GITHUB_PATH`` files
(``name=value`` and the ``name<<DELIMITER`` heredoc form). Every ``${{ }}`` is evaluated
by the GitHub emulator's evaluator (tests/doubles/github/actions.py) with the
``github``, ``inputs``, ``vars``, ``secrets``, ``env``, ``matrix``, ``needs``, ``steps``,
``job``, ``runner`` and ``strategy`` contexts; what it cannot evaluate raises.

Checks that fail the run (``HarnessError``) rather than pass silently:

* a ``uses:`` not in ``ACTIONS`` below, a key of a job or step the harness does not
  implement (``continue-on-error``, ``services``, ``container``, ...);
* an expression it cannot parse, an unknown context, ``steps.X`` naming no step of the
  job, ``needs.X`` naming a job not in ``needs``;
* a ``steps.<id>.outputs.<name>`` or ``needs.<job>.outputs.<name>`` reference to a step or
  job that succeeded but never wrote that output (``RunResult.unresolved``; after a
  failed step or job such references are recorded in ``unresolved_after_failure``);
* a malformed ``GITHUB_OUTPUT`` / ``GITHUB_ENV`` file (no ``=``, unterminated heredoc);
* a secret value in a step's log.

``ACTIONS`` is the one table of local equivalents. ``HOST`` lists what the runner
image provides beside the ``uses:`` steps (sudo, the GitHub CLI).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.doubles.github.actions import ExpressionError, evaluate_condition, interpolate, to_str

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"

# The longest a single step may run here, whatever its timeout-minutes says.
STEP_TIMEOUT_CAP_S = 900.0


class HarnessError(AssertionError):
    """The workflow used something the harness cannot run faithfully, or broke a rule it checks."""


# --- the runner image ------------------------------------------------------------------


@dataclass
class Runner:
    """What the jobs run on. One per test; ``root`` holds every job's directories.

    ``source``: a git repository holding the workflow's commit (``actions/checkout`` clones it).
    ``venv``: the project venv (``actions/setup-python``).
    ``env``: variables of the runner machine itself (e.g. ``BENCHSEAL_HOME``: the
    persistent build caches a self-hosted runner keeps between jobs).
    ``sudo_home``: the infra host's ``/var/lib/benchseal`` (the sudo-admitted wrappers' state).
    ``registry_auth``: ``{registry: (user, password)}`` for ``docker/login-action``.
    ``oidc``: mints the Actions OIDC token (audience, claims) -> JWT; the local issuer.
    ``github_token``: mints each job's GITHUB_TOKEN from (repository, the job's ``permissions``),
    e.g. the GitHub emulator's ``add_token(..., kind="github-token")``; None: every job gets
    ``Trigger.token`` (all permissions).
    ``ghcr``: what stands in for ghcr.io: ``(registry host, user, password)`` of a local registry.
    ``docker/login-action`` with ``registry: ghcr.io`` then accepts exactly what ghcr.io accepts
    from a workflow (username ``github.actor``, password the job's GITHUB_TOKEN, the job granted
    ``packages: write``) and writes that registry's credentials into the job's Docker config.
    """

    root: Path
    source: Path
    venv: Path = field(default_factory=lambda: Path(sys.executable).parent.parent)
    env: dict[str, str] = field(default_factory=dict)
    sudo_home: Path | None = None
    registry_auth: dict[str, tuple[str, str]] = field(default_factory=dict)
    oidc: Callable[[str, Mapping[str, str]], str] | None = None
    github_token: Callable[[str, Mapping[str, str]], str] | None = None
    ghcr: tuple[str, str, str] | None = None

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.tools = self.root / "tools"
        self.tools.mkdir(exist_ok=True)
        self._install_sudo()

    def _install_sudo(self) -> None:
        """``sudo``: admits exactly the rules of deploy/benchseal.sudoers (user, command, no
        arguments), resets the environment like ``env_reset`` + ``secure_path`` and runs the
        deploy/ wrapper with the host paths mapped to this machine (/opt/benchseal -> the
        project checkout and venv, /var/lib/benchseal -> ``sudo_home``, /etc/benchseal/infra.yaml ->
        the runner's source's policies/infra.yaml)."""
        rules: list[dict[str, str]] = []
        for line in (DEPLOY / "benchseal.sudoers").read_text("utf-8").splitlines():
            m = re.fullmatch(r'(\S+) ALL=\((\S+)\) NOPASSWD: (\S+) ""', line.strip())
            if m:
                rules.append({"user": m.group(1), "runas": m.group(2), "command": m.group(3)})
            elif line.strip() and not line.lstrip().startswith(("#", "Defaults")):
                raise HarnessError(f"deploy/benchseal.sudoers: rule the harness does not understand: {line!r}")
        wrappers = self.root / "libexec"
        wrappers.mkdir(exist_ok=True)
        # /opt/benchseal/.venv/bin/benchseal: the project venv's interpreter running the checkout
        # under test (the venv's own editable install may point at another checkout).
        launcher = wrappers / "opt-benchseal-benchseal"
        launcher.write_text(f"#!{self.venv}/bin/python\nimport sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
                            "from pipeline.cli.main import main\nmain()\n", "utf-8")
        launcher.chmod(0o755)
        mapped: dict[str, str] = {}
        for rule in rules:
            name = Path(rule["command"]).name
            text = (DEPLOY / name).read_text("utf-8")
            text = text.replace("/opt/benchseal/.venv/bin/benchseal", str(launcher))
            text = text.replace("/opt/benchseal/.venv/bin/", f"{self.venv}/bin/").replace("/opt/benchseal", str(REPO_ROOT))
            # The operator's policy: the infra repository's own (what this runner checked out).
            text = text.replace("/etc/benchseal/infra.yaml", str(self.source / "policies" / "infra.yaml"))
            if self.sudo_home is not None:
                text = text.replace("/var/lib/benchseal", str(self.sudo_home))
            local = wrappers / name
            local.write_text(text, "utf-8")
            local.chmod(0o755)
            mapped[rule["command"]] = str(local)
        (self.tools / "sudo.json").write_text(json.dumps({"rules": rules, "mapped": mapped}), "utf-8")
        shim = self.tools / "sudo"
        shim.write_text(f"#!{sys.executable}\n" + _SUDO_SHIM, "utf-8")
        shim.chmod(0o755)


_SUDO_SHIM = r'''
import json, os, sys
from pathlib import Path
config = json.loads((Path(__file__).parent / "sudo.json").read_text())
args = sys.argv[1:]
if len(args) != 4 or args[0] != "-n" or args[1] != "-u":
    sys.exit(f"sudo (harness): only `sudo -n -u USER COMMAND` without arguments is admitted, got {args}")
runas, command = args[2], args[3]
if not any(r["runas"] == runas and r["command"] == command for r in config["rules"]):
    sys.exit(f"sudo: a password is required (no rule lets the runner run {command} as {runas})")
env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8",
       "SUDO_UID": str(os.getuid()), "SUDO_GID": str(os.getgid()), "SUDO_USER": "github-runner",
       "SUDO_COMMAND": command, "USER": runas, "LOGNAME": runas}
os.umask(0o027)
os.execve(config["mapped"][command], [command], env)
'''


# --- the one table of local equivalents ---------------------------------------------------


@dataclass(frozen=True)
class Action:
    equivalent: str
    run: Callable[[JobRun, Mapping[str, str]], None]
    inputs: frozenset[str]


def _checkout(job: JobRun, inputs: Mapping[str, str]) -> None:
    ref = inputs.get("ref") or str(job.ctx["github"]["sha"])
    workspace = job.workspace
    _git(["clone", "--quiet", "--no-hardlinks", str(job.runner.source), str(workspace)], cwd=job.dir)
    _git(["-c", "advice.detachedHead=false", "checkout", "--quiet", ref], cwd=workspace)
    job.log(f"checkout: {job.runner.source} at {ref} -> {_git(['rev-parse', 'HEAD'], cwd=workspace).strip()}")


def _setup_python(job: JobRun, inputs: Mapping[str, str]) -> None:
    want = inputs.get("python-version", "")
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if want and want != have:
        job.notes.append(f"setup-python asked for {want}; the project venv is {have}")
    # A venv of the job whose site-packages reads the project venv's (a plain path in a
    # .pth: the project's own editable install is not imported): the job's `pip install`
    # installs the checkout into it and never touches the project venv. Offline, like a
    # runner image with the dependencies preinstalled.
    overlay = job.dir / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(overlay)], check=True, timeout=120)
    site = next((overlay / "lib").glob("python3*/site-packages"))
    project_site = next((job.runner.venv / "lib").glob("python3*/site-packages"))
    (site / "project-venv.pth").write_text(f"{project_site}\n", "utf-8")
    job.path.insert(0, str(overlay / "bin"))
    job.env.update({"pythonLocation": str(overlay), "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
                    "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


def _upload_artifact(job: JobRun, inputs: Mapping[str, str]) -> None:
    name = _required(inputs, "name")
    store = job.artifacts / name
    if store.exists():
        raise HarnessError(f"upload-artifact: an artifact named {name!r} already exists in this run")
    policy = inputs.get("if-no-files-found", "warn")
    if policy not in ("warn", "error", "ignore"):
        raise HarnessError(f"upload-artifact: if-no-files-found must be warn|error|ignore, got {policy!r}")
    # Paths as the real action takes them: relative to the workspace or absolute, files or whole
    # directories; kept relative to their least common ancestor (a single file: its name only).
    files: list[Path] = []
    for pattern in _required(inputs, "path").split("\n"):
        pattern = pattern.strip()
        if not pattern:
            continue
        matched = [Path(pattern)] if Path(pattern).is_absolute() else list(job.workspace.glob(pattern))
        for path in matched:
            if path.is_dir():
                files += sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
            elif path.is_file():
                files.append(path)
    if not files:
        if policy == "error":
            raise StepFailed(f"upload-artifact: no files were found with the provided path: {inputs['path']}")
        job.log(f"upload-artifact: no files for {name!r} ({policy})")
        return
    root = Path(os.path.commonpath([p.parent for p in files]))
    for path in files:
        target = store / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    job.log(f"upload-artifact: {name!r}: {len(files)} file(s)")


def _download_artifact(job: JobRun, inputs: Mapping[str, str]) -> None:
    name = _required(inputs, "name")
    store = job.artifacts / name
    if not store.is_dir():
        raise StepFailed(f"download-artifact: artifact not found: {name}")
    dest = job.workspace / inputs.get("path", ".")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(store, dest, dirs_exist_ok=True)


GHCR = "ghcr.io"


def _docker_login(job: JobRun, inputs: Mapping[str, str]) -> None:
    registry = _required(inputs, "registry")
    username, password = _required(inputs, "username"), _required(inputs, "password")
    if registry == GHCR and job.runner.ghcr is not None:
        # ghcr.io takes a workflow's GITHUB_TOKEN when the job has packages: write.
        github = job.ctx["github"]
        if username != github["actor"] or password != github["token"]:
            raise StepFailed("docker/login-action: ghcr.io: unauthorized: the username is not the actor "
                             "or the password is not this job's GITHUB_TOKEN")
        if job.permissions.get("packages") != "write":
            raise StepFailed("docker/login-action: ghcr.io: denied: permission_denied: "
                             "The token provided does not match expected scopes (this job lacks packages: write)")
        registry, username, password = job.runner.ghcr
    elif job.runner.registry_auth.get(registry) != (username, password):
        raise StepFailed(f"docker/login-action: {registry} refused these credentials")
    import base64

    config = job.dir / "docker-config"
    config.mkdir(exist_ok=True)
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {registry: {"auth": auth}}}), "utf-8")
    (config / "config.json").chmod(0o600)
    job.env["DOCKER_CONFIG"] = str(config)


ACTIONS: dict[str, Action] = {
    "actions/checkout": Action(
        "`git clone` of Runner.source into the job's workspace, then `git checkout` of `ref` (default github.sha)",
        _checkout, frozenset({"ref", "persist-credentials"})),
    "actions/setup-python": Action(
        "the project venv, through a per-job venv that reads its site-packages (pip installs go to the job, offline)",
        _setup_python, frozenset({"python-version"})),
    "actions/upload-artifact": Action(
        "copies the files into <run>/artifacts/<name>; `if-no-files-found: error` fails the step",
        _upload_artifact, frozenset({"name", "path", "if-no-files-found", "retention-days"})),
    "actions/download-artifact": Action(
        "copies <run>/artifacts/<name> into `path` (default the workspace); a missing artifact fails the step",
        _download_artifact, frozenset({"name", "path"})),
    "docker/login-action": Action(
        "checks the credentials against Runner.registry_auth (ghcr.io: the job's GITHUB_TOKEN with "
        "packages: write, standing in Runner.ghcr), writes a DOCKER_CONFIG for the job",
        _docker_login, frozenset({"registry", "username", "password"})),
}

HOST: dict[str, str] = {
    "sudo": "Runner.tools/sudo: only the rules of deploy/benchseal.sudoers; runs the deploy/ wrapper with "
            "/opt/benchseal -> the checkout under test + the project venv's interpreter, "
            "/var/lib/benchseal -> Runner.sudo_home",
    "gh": "the GitHub CLI (Debian package gh, installed by scripts/setup.sh), against GITHUB_API_URL",
    "id-token": "`permissions: id-token: write` -> ACTIONS_ID_TOKEN_REQUEST_URL/_TOKEN served on loopback, "
                "tokens minted by Runner.oidc; local_issuer(instance): the private Sigstore instance's issuer, "
                "subject https://github.com/<job_workflow_ref>",
}


class StepFailed(Exception):
    """The step failed the way the real action would (not a harness limitation)."""


def _required(inputs: Mapping[str, str], name: str) -> str:
    value = inputs.get(name)
    if not value:
        raise HarnessError(f"input {name!r} is required")
    return value


def _git(args: list[str], cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=300)
    if done.returncode != 0:
        raise StepFailed(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


# --- results -----------------------------------------------------------------------------


@dataclass
class StepResult:
    id: str | None
    name: str
    conclusion: str  # success | failure | skipped
    outputs: dict[str, str] = field(default_factory=dict)
    log: str = ""


@dataclass
class JobResult:
    id: str
    result: str  # success | failure | skipped | cancelled
    outputs: dict[str, str] = field(default_factory=dict)
    legs: list[list[StepResult]] = field(default_factory=list)
    summary: str = ""
    notes: list[str] = field(default_factory=list)

    def step(self, step_id: str, leg: int = 0) -> StepResult:
        return next(s for s in self.legs[leg] if s.id == step_id)

    @property
    def log(self) -> str:
        return "\n".join(f"--- {s.name} [{s.conclusion}]\n{s.log}" for leg in self.legs for s in leg)


@dataclass
class RunResult:
    workflow: str
    jobs: dict[str, JobResult] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    unresolved_after_failure: list[str] = field(default_factory=list)
    references: list[tuple[str, str]] = field(default_factory=list)  # (reference, value)
    secret_leaks: list[str] = field(default_factory=list)
    run_dir: Path | None = None

    @property
    def conclusion(self) -> str:
        return "failure" if any(j.result in ("failure", "cancelled") for j in self.jobs.values()) else "success"

    @property
    def summary(self) -> str:
        return "".join(self.jobs[j].summary for j in self.order if j in self.jobs)

    def describe(self) -> str:
        return "\n".join(f"== {j} [{self.jobs[j].result}]\n{self.jobs[j].log[-4000:]}" for j in self.order)


# --- execution ---------------------------------------------------------------------------

_JOB_KEYS = {"name", "runs-on", "needs", "if", "permissions", "timeout-minutes", "strategy", "outputs", "steps",
             "env"}
_STEP_KEYS = {"id", "name", "uses", "with", "run", "shell", "env", "if", "working-directory", "timeout-minutes"}
_STEP_ID_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_run_ids = itertools.count(1000)


@dataclass
class Trigger:
    """The event that starts the run and the repository it runs in."""

    event_name: str
    repository: str
    sha: str
    ref: str
    event: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    vars: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    token: str = ""
    api_url: str = "https://api.github.com"
    server_url: str = "https://github.com"
    actor: str = "release-bot"


def run_workflow(path: Path, trigger: Trigger, runner: Runner, *, name: str | None = None) -> RunResult:
    """Run every job of the workflow at ``path`` for ``trigger`` on ``runner``."""
    doc = yaml.safe_load(path.read_text("utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), dict):
        raise HarnessError(f"{path}: not a workflow with jobs")
    run_id = next(_run_ids)
    run_dir = runner.root / f"run-{run_id}-{name or path.stem}"
    (run_dir / "artifacts").mkdir(parents=True)
    result = RunResult(workflow=str(path), run_dir=run_dir)
    github = _github_context(doc, path, trigger, run_id)
    event_path = run_dir / "event.json"
    event_path.write_text(json.dumps(trigger.event), "utf-8")
    base = _Evaluator(result, {
        "github": github, "inputs": trigger.inputs, "vars": trigger.vars, "secrets": trigger.secrets,
        "env": {}, "runner": {"os": "Linux", "arch": "X64", "temp": "", "name": "benchseal-harness"},
    })
    workflow_env = {k: base.text(v, f"env.{k}") for k, v in (doc.get("env") or {}).items()}
    jobs: dict[str, dict[str, Any]] = doc["jobs"]
    for job_id, job in jobs.items():
        unknown = set(job) - _JOB_KEYS
        if unknown:
            raise HarnessError(f"job {job_id}: keys the harness does not implement: {sorted(unknown)}")
    for job_id in _needs_order(jobs):
        result.order.append(job_id)
        job = jobs[job_id]
        needs = _as_list(job.get("needs"))
        need_results = {n: result.jobs[n].result for n in needs}
        ctx = dict(base.ctx, env=dict(workflow_env), needs={
            n: {"result": result.jobs[n].result, "outputs": result.jobs[n].outputs} for n in needs})
        evaluator = _Evaluator(result, ctx, needs=result.jobs, where=job_id)
        all_ok = all(r == "success" for r in need_results.values())
        any_failed = any(r == "failure" for r in need_results.values())
        functions = _status_functions(all_ok, any_failed)
        condition = job.get("if", "success()")
        if not evaluator.condition(condition, functions):
            result.jobs[job_id] = JobResult(job_id, "skipped")
            continue
        result.jobs[job_id] = _run_job(job_id, job, ctx, evaluator, runner, trigger, run_dir, event_path,
                                       dict(workflow_env))
    for secret in (v for v in trigger.secrets.values() if v):
        for job_result in result.jobs.values():
            if secret in job_result.log or secret in job_result.summary:
                result.secret_leaks.append(job_result.id)
    return result


def _github_context(doc: Mapping[str, Any], path: Path, trigger: Trigger, run_id: int) -> dict[str, Any]:
    ref_name = trigger.ref.rsplit("/", 1)[-1] if trigger.ref.startswith(("refs/tags/", "refs/heads/")) else trigger.ref
    event = dict(trigger.event)
    if trigger.event_name == "workflow_dispatch":
        event.setdefault("inputs", trigger.inputs)
    return {
        "repository": trigger.repository, "repository_owner": trigger.repository.split("/")[0],
        "sha": trigger.sha, "ref": trigger.ref, "ref_name": ref_name,
        "ref_type": "tag" if trigger.ref.startswith("refs/tags/") else "branch",
        "event_name": trigger.event_name, "event": event, "token": trigger.token,
        "api_url": trigger.api_url, "server_url": trigger.server_url, "actor": trigger.actor,
        "workflow": str(doc.get("name") or path.name), "run_id": str(run_id), "run_number": "1",
        "run_attempt": "1", "workflow_ref": f"{trigger.repository}/.github/workflows/{path.name}@{trigger.ref}",
    }


def _needs_order(jobs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    order: list[str] = []
    pending = dict(jobs)
    while pending:
        ready = [j for j, spec in pending.items() if all(n in order for n in _as_list(spec.get("needs")))]
        if not ready:
            missing = {j: _as_list(s.get("needs")) for j, s in pending.items()}
            raise HarnessError(f"jobs with unknown or circular needs: {missing}")
        for job_id in ready:  # file order among the ready ones
            for need in _as_list(pending[job_id].get("needs")):
                if need not in jobs:
                    raise HarnessError(f"job {job_id} needs unknown job {need}")
            order.append(job_id)
            del pending[job_id]
    return order


def _as_list(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [str(v) for v in value]
    raise HarnessError(f"needs must be a string or a list, got {value!r}")


def _status_functions(success: bool, failure: bool) -> dict[str, Callable[..., object]]:
    """success()/failure() as of now (job level: of the needs; step level: of this job's steps)."""

    def constant(value: bool) -> Callable[[], bool]:
        return lambda: value

    return {"success": constant(success), "failure": constant(failure), "always": constant(True),
            "cancelled": constant(False)}


class _Evaluator:
    """Evaluates expressions against ``ctx``, checking every context reference."""

    def __init__(self, result: RunResult, ctx: dict[str, Any], *, needs: Mapping[str, JobResult] | None = None,
                 where: str = "workflow") -> None:
        self.result = result
        self.ctx = ctx
        self.needs = needs or {}
        self.where = where
        self.steps: dict[str, StepResult] = {}
        self.step_ids: set[str] = set()

    def resolve(self, path: str) -> object:
        parts = path.split(".")
        root = parts[0]
        if root not in self.ctx:
            raise HarnessError(f"{self.where}: unknown context {root!r} in {path!r}")
        if root == "steps":
            return self._step_ref(path, parts)
        if root == "needs":
            return self._needs_ref(path, parts)
        node: object = self.ctx
        for part in parts:
            node = node.get(part) if isinstance(node, Mapping) else None
        return node

    def _step_ref(self, path: str, parts: list[str]) -> object:
        if len(parts) < 2 or parts[1] not in self.step_ids:
            raise HarnessError(f"{self.where}: {path!r} names no step id of this job")
        step = self.steps.get(parts[1])
        if len(parts) == 2:
            return None if step is None else {"outputs": step.outputs, "outcome": step.conclusion,
                                              "conclusion": step.conclusion}
        if parts[2] in ("outcome", "conclusion") and len(parts) == 3:
            return None if step is None else step.conclusion
        if parts[2] != "outputs" or len(parts) != 4:
            raise HarnessError(f"{self.where}: unsupported step reference {path!r}")
        return self._output(path, None if step is None else step.conclusion,
                            None if step is None else step.outputs, parts[3])

    def _needs_ref(self, path: str, parts: list[str]) -> object:
        if len(parts) < 2 or parts[1] not in self.ctx["needs"]:
            raise HarnessError(f"{self.where}: {path!r}: job {parts[1] if len(parts) > 1 else ''!r} is not in needs")
        job = self.needs[parts[1]]
        if len(parts) == 3 and parts[2] == "result":
            return job.result
        if parts[2] != "outputs" or len(parts) != 4:
            raise HarnessError(f"{self.where}: unsupported needs reference {path!r}")
        return self._output(path, job.result, job.outputs, parts[3])

    def _output(self, path: str, conclusion: str | None, outputs: Mapping[str, str] | None, name: str) -> object:
        if conclusion in (None, "skipped", "cancelled"):
            return ""  # it never ran: Actions gives '' too
        assert outputs is not None
        if name not in outputs:
            entry = f"{self.where}: {path} (never written)"
            (self.result.unresolved if conclusion == "success" else self.result.unresolved_after_failure).append(entry)
            return ""
        self.result.references.append((f"{self.where}: {path}", outputs[name]))
        return outputs[name]

    def text(self, value: object, where: str, functions: Mapping[str, Callable[..., object]] | None = None) -> str:
        if isinstance(value, bool | int | float):
            return to_str(value)
        if not isinstance(value, str):
            raise HarnessError(f"{self.where}: {where}: expected a string, got {value!r}")
        try:
            return interpolate(value, self.ctx, functions=functions, resolve=self.resolve)
        except ExpressionError as exc:
            raise HarnessError(f"{self.where}: {where}: {exc}") from exc

    def condition(self, value: object, functions: Mapping[str, Callable[..., object]]) -> bool:
        """An ``if:``; as in Actions, one without a status function is ``success() && (if)``."""
        try:
            if not evaluate_condition(value, self.ctx, functions=functions, resolve=self.resolve):
                return False
            if isinstance(value, str) and _STATUS_CALL.search(value):
                return True
            return bool(functions["success"]())
        except ExpressionError as exc:
            raise HarnessError(f"{self.where}: if: {exc}") from exc


_STATUS_CALL = re.compile(r"\b(?:success|failure|always|cancelled)\s*\(")


@dataclass
class JobRun:
    """One job (one matrix leg) on a fresh machine."""

    runner: Runner
    dir: Path
    artifacts: Path
    ctx: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    path: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    permissions: dict[str, str] = field(default_factory=dict)

    @property
    def workspace(self) -> Path:
        return self.dir / "workspace"

    def log(self, text: str) -> None:
        self.lines.append(text)


def _matrix_legs(job_id: str, job: Mapping[str, Any]) -> list[dict[str, Any]]:
    strategy = job.get("strategy")
    if not strategy:
        return [{}]
    unknown = set(strategy) - {"matrix", "fail-fast", "max-parallel"}
    matrix = strategy.get("matrix") or {}
    if unknown or not isinstance(matrix, dict) or set(matrix) & {"include", "exclude"}:
        raise HarnessError(f"job {job_id}: only a plain matrix of lists is implemented")
    for key, values in matrix.items():
        if not isinstance(values, list) or not values:
            raise HarnessError(f"job {job_id}: matrix.{key} must be a non-empty list")
    keys = list(matrix)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(matrix[k] for k in keys))]


def _run_job(job_id: str, job: Mapping[str, Any], ctx: dict[str, Any], evaluator: _Evaluator, runner: Runner,
             trigger: Trigger, run_dir: Path, event_path: Path, env: dict[str, str]) -> JobResult:
    legs = _matrix_legs(job_id, job)
    fail_fast = bool((job.get("strategy") or {}).get("fail-fast", True))
    result = JobResult(job_id, "success")
    leg_results: list[str] = []
    for index, matrix in enumerate(legs):
        if fail_fast and "failure" in leg_results:
            leg_results.append("cancelled")
            continue
        leg_ctx = dict(ctx, matrix=matrix, strategy={"job-index": index, "job-total": len(legs)},
                       job={"status": "success"}, steps={})
        leg_eval = _Evaluator(evaluator.result, leg_ctx, needs=evaluator.needs,
                              where=f"{job_id}" + (f" ({', '.join(map(str, matrix.values()))})" if matrix else ""))
        conclusion, steps, summary, notes, outputs = _run_leg(job_id, job, leg_eval, runner, trigger, run_dir,
                                                              event_path, dict(env), index)
        leg_results.append(conclusion)
        result.legs.append(steps)
        result.summary += summary
        result.notes += notes
        result.outputs.update(outputs)
    result.result = "failure" if "failure" in leg_results else ("cancelled" if "cancelled" in leg_results
                                                                else "success")
    return result


def _run_leg(job_id: str, job: Mapping[str, Any], ev: _Evaluator, runner: Runner, trigger: Trigger,
             run_dir: Path, event_path: Path, env: dict[str, str], index: int
             ) -> tuple[str, list[StepResult], str, list[str], dict[str, str]]:
    job_dir = run_dir / f"{job_id}-{index}"
    (job_dir / "workspace").mkdir(parents=True)
    (job_dir / "temp").mkdir()
    (job_dir / "home").mkdir()
    stated = _job_permissions(job_id, job)
    permissions = stated or {}
    if runner.github_token is not None:
        if stated is None:
            raise HarnessError(f"job {job_id}: no permissions key; the repository's default token "
                               "permissions are not implemented (Runner.github_token is set)")
        # This job's GITHUB_TOKEN: exactly its permissions (id-token is not a token permission).
        granted = {k: v for k, v in permissions.items() if k != "id-token" and v != "none"}
        ev.ctx["github"] = dict(ev.ctx["github"], token=runner.github_token(trigger.repository, granted))
    run = JobRun(runner, job_dir, run_dir / "artifacts", ev.ctx, permissions=permissions)
    ev.ctx["runner"] = dict(ev.ctx["runner"], temp=str(job_dir / "temp"))
    steps_spec = job.get("steps") or []
    for spec in steps_spec:
        unknown = set(spec) - _STEP_KEYS
        if unknown:
            raise HarnessError(f"job {job_id}: step keys the harness does not implement: {sorted(unknown)}")
        if "id" in spec:
            if not _STEP_ID_RE.fullmatch(str(spec["id"])) or spec["id"] in ev.step_ids:
                raise HarnessError(f"job {job_id}: invalid or duplicate step id {spec['id']!r}")
            ev.step_ids.add(str(spec["id"]))
    ev.ctx["env"] = dict(env)
    job_env = {k: ev.text(v, f"env.{k}") for k, v in (job.get("env") or {}).items()}
    env.update(job_env)
    token_server: _TokenServer | None = None
    if permissions.get("id-token") == "write":
        if runner.oidc is None:
            raise HarnessError(f"job {job_id} asks for id-token: write but the runner has no OIDC issuer")
        token_server = _TokenServer(runner.oidc, _oidc_claims(ev.ctx["github"]))
    timeout = min(float(job.get("timeout-minutes", 360)) * 60, STEP_TIMEOUT_CAP_S)
    results: list[StepResult] = []
    summary = ""
    failed = False
    try:
        for number, spec in enumerate(steps_spec):
            name = str(spec.get("name") or spec.get("uses") or str(spec.get("run", "")).split("\n")[0])
            ok = not failed
            functions = _status_functions(ok, not ok)
            if not ev.condition(spec.get("if", "success()"), functions):
                results.append(StepResult(spec.get("id"), name, "skipped"))
                if spec.get("id"):
                    ev.steps[str(spec["id"])] = results[-1]
                continue
            step = StepResult(spec.get("id"), name, "success")
            files = {k: job_dir / f"{k.lower()}-{number}" for k in
                     ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_STEP_SUMMARY", "GITHUB_PATH")}
            for f in files.values():
                f.write_text("", "utf-8")
            ev.ctx["env"] = dict(env, **run.env)
            step_env = {k: ev.text(v, f"steps[{number}].env.{k}") for k, v in (spec.get("env") or {}).items()}
            full_env = _base_env(runner, run, ev.ctx["github"], job_dir, event_path, token_server)
            full_env.update(env)
            full_env.update(run.env)
            full_env.update(step_env)
            full_env.update({k: str(v) for k, v in files.items()})
            try:
                if "uses" in spec:
                    _run_action(run, spec, ev, number)
                elif "run" in spec:
                    step.log = _run_script(spec, ev, number, full_env, run, job_dir,
                                           min(float(spec.get("timeout-minutes", 360)) * 60, timeout))
                else:
                    raise HarnessError(f"job {job_id}: step {number} has neither run nor uses")
            except StepFailed as exc:
                step.conclusion = "failure"
                step.log += f"\n{exc}"
            step.log = "\n".join(run.lines) + step.log
            run.lines.clear()
            step.outputs = _read_key_values(files["GITHUB_OUTPUT"], "GITHUB_OUTPUT")
            env.update(_read_key_values(files["GITHUB_ENV"], "GITHUB_ENV"))
            run.path[:0] = [p for p in reversed(files["GITHUB_PATH"].read_text("utf-8").splitlines()) if p.strip()]
            summary += files["GITHUB_STEP_SUMMARY"].read_text("utf-8")
            results.append(step)
            if spec.get("id"):
                ev.steps[str(spec["id"])] = step
                ev.ctx["steps"][str(spec["id"])] = {"outputs": step.outputs, "outcome": step.conclusion,
                                                   "conclusion": step.conclusion}
            if step.conclusion == "failure":
                failed = True
                ev.ctx["job"] = {"status": "failure"}
    finally:
        if token_server is not None:
            token_server.stop()
    conclusion = "failure" if failed else "success"
    outputs: dict[str, str] = {}
    out_eval = _Evaluator(ev.result, ev.ctx, needs=ev.needs, where=ev.where)
    out_eval.steps, out_eval.step_ids = ev.steps, ev.step_ids
    for key, template in (job.get("outputs") or {}).items():
        # Kept even when empty (Actions then reads ''): a declared output whose step wrote
        # it resolves. One built from a never-written step output was reported just now and
        # is left out, so every job reading it is reported too.
        before = len(ev.result.unresolved) + len(ev.result.unresolved_after_failure)
        value = out_eval.text(template, f"outputs.{key}")
        if len(ev.result.unresolved) + len(ev.result.unresolved_after_failure) == before:
            outputs[str(key)] = value
    return conclusion, results, summary, run.notes, outputs


_PERMISSION_LEVELS = ("read", "write", "none")


def _job_permissions(job_id: str, job: Mapping[str, Any]) -> dict[str, str] | None:
    """The job's ``permissions`` map (``{}``: none), or None when the job states none (the
    repository's default token permissions). The shorthands (read-all, write-all) are not implemented."""
    if "permissions" not in job:
        return None
    permissions = job.get("permissions") or {}
    if not isinstance(permissions, dict):
        raise HarnessError(f"job {job_id}: permissions {permissions!r}: only a map is implemented")
    for name, level in permissions.items():
        if level not in _PERMISSION_LEVELS:
            raise HarnessError(f"job {job_id}: permissions.{name}: {level!r} is not read|write|none")
    return {str(k): str(v) for k, v in permissions.items()}


def _base_env(runner: Runner, run: JobRun, github: Mapping[str, Any], job_dir: Path, event_path: Path,
              token_server: _TokenServer | None) -> dict[str, str]:
    system_path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env = {
        "PATH": os.pathsep.join([*run.path, str(runner.tools), system_path]),
        "HOME": str(job_dir / "home"), "LANG": "C.UTF-8", "CI": "true", "GITHUB_ACTIONS": "true",
        "GITHUB_WORKSPACE": str(run.workspace), "RUNNER_TEMP": str(job_dir / "temp"), "RUNNER_OS": "Linux",
        "GITHUB_EVENT_PATH": str(event_path), "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        "DOCKER_CONFIG": str(job_dir / "home" / ".docker"), "HARBOR_TELEMETRY": "0",
    }
    for key in ("repository", "sha", "ref", "ref_name", "ref_type", "event_name", "api_url", "server_url", "actor",
                "workflow", "run_id", "run_number", "run_attempt", "workflow_ref", "repository_owner"):
        env[f"GITHUB_{key.upper()}"] = str(github[key])
    if os.environ.get("DOCKER_HOST"):
        env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    env.update(runner.env)
    if token_server is not None:
        env["ACTIONS_ID_TOKEN_REQUEST_URL"] = token_server.url
        env["ACTIONS_ID_TOKEN_REQUEST_TOKEN"] = token_server.request_token
    return env


def _run_action(run: JobRun, spec: Mapping[str, Any], ev: _Evaluator, number: int) -> None:
    uses = str(spec["uses"])
    name, _, ref = uses.partition("@")
    action = ACTIONS.get(name)
    if action is None:
        raise HarnessError(f"uses: {uses}: no local equivalent in tests/workflows/harness.py ACTIONS")
    if not re.fullmatch(r"[0-9a-f]{40}", ref):
        raise HarnessError(f"uses: {uses}: not pinned to a commit SHA")
    inputs = {str(k): ev.text(v, f"steps[{number}].with.{k}") for k, v in (spec.get("with") or {}).items()}
    unknown = set(inputs) - action.inputs
    if unknown:
        raise HarnessError(f"uses: {name}: inputs the local equivalent does not implement: {sorted(unknown)}")
    action.run(run, inputs)


def _run_script(spec: Mapping[str, Any], ev: _Evaluator, number: int, env: dict[str, str], run: JobRun,
                job_dir: Path, timeout: float) -> str:
    script = ev.text(spec["run"], f"steps[{number}].run")
    shell = spec.get("shell")
    if shell is None:
        argv = ["bash", "-e"]
    elif shell == "bash":
        argv = ["bash", "--noprofile", "--norc", "-eo", "pipefail"]
    else:
        raise HarnessError(f"shell: {shell!r} is not implemented (bash only)")
    path = job_dir / "temp" / f"step-{number}.sh"
    path.write_text(script, "utf-8")
    cwd = run.workspace / str(spec.get("working-directory", "."))
    try:
        done = subprocess.run([*argv, str(path)], cwd=cwd, env=env, capture_output=True, text=True, check=False,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(f"the step ran longer than {timeout:.0f} s: {exc.stderr!r}") from exc
    log = f"$ {shlex.join(argv)} {path.name}\n{done.stdout}{done.stderr}"
    if done.returncode != 0:
        raise StepFailed(f"{log}\nProcess completed with exit code {done.returncode}.")
    return log


_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _read_key_values(path: Path, what: str) -> dict[str, str]:
    """``name=value`` lines and ``name<<DELIMITER`` ... ``DELIMITER`` blocks, as the runner reads them."""
    values: dict[str, str] = {}
    lines = path.read_text("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line == "":
            continue
        heredoc = line.find("<<")
        equals = line.find("=")
        if heredoc > 0 and (equals < 0 or heredoc < equals):
            name, delimiter = line[:heredoc], line[heredoc + 2:]
            if not delimiter:
                raise HarnessError(f"{what}: empty heredoc delimiter for {name!r}")
            body: list[str] = []
            while i < len(lines) and lines[i] != delimiter:
                body.append(lines[i])
                i += 1
            if i >= len(lines):
                raise HarnessError(f"{what}: matching delimiter not found {delimiter!r} for {name!r}")
            i += 1
            value = "\n".join(body)
        elif equals > 0:
            name, value = line[:equals], line[equals + 1:]
        else:
            raise HarnessError(f"{what}: invalid format {line!r} (expected name=value or name<<DELIMITER)")
        if not _NAME_RE.fullmatch(name):
            raise HarnessError(f"{what}: invalid name {name!r}")
        values[name] = value
    return values


# --- the Actions OIDC token, served by the local issuer ----------------------------------------


def _oidc_claims(github: Mapping[str, Any]) -> dict[str, str]:
    return {"repository": str(github["repository"]), "ref": str(github["ref"]), "sha": str(github["sha"]),
            "event_name": str(github["event_name"]), "job_workflow_ref": str(github["workflow_ref"]),
            "workflow_ref": str(github["workflow_ref"]), "run_id": str(github["run_id"]),
            "run_attempt": str(github["run_attempt"]),
            "sub": f"repo:{github['repository']}:ref:{github['ref']}"}


def local_issuer(instance: Any, server_url: str = "https://github.com") -> Callable[[str, Mapping[str, str]], str]:
    """``Runner.oidc`` backed by the private Sigstore instance's GitHub-shaped issuer
    (pipeline.local.sigstore): issuer, ``sub`` and claims as GitHub Actions gives a
    job, so its Fulcio certifies ``https://github.com/<job_workflow_ref>`` as public-good does."""
    from pipeline.local import sigstore as sigstore_local

    def mint(audience: str, claims: Mapping[str, str]) -> str:
        if audience != "sigstore":
            raise HarnessError(f"the local issuer mints tokens for audience 'sigstore' only, not {audience!r}")
        path, _, ref = claims["job_workflow_ref"].partition("@")
        repository, _, workflow_path = path.partition("/.github/workflows/")
        if not workflow_path or not ref:
            raise HarnessError(f"job_workflow_ref {claims['job_workflow_ref']!r} is not OWNER/REPO/.github/workflows/FILE@REF")
        job = sigstore_local.GitHubJob(repository=claims["repository"], ref=claims["ref"], sha=claims["sha"],
                                       workflow_file=workflow_path, event_name=claims["event_name"],
                                       workflow_repository=repository, workflow_ref=ref,
                                       run_id=claims["run_id"], run_attempt=claims["run_attempt"])
        return sigstore_local.mint_github_token(instance, job)

    return mint


class _TokenServer:
    def __init__(self, mint: Callable[[str, Mapping[str, str]], str], claims: Mapping[str, str]) -> None:
        import secrets as _secrets
        from urllib.parse import parse_qs, urlparse

        self.request_token = _secrets.token_hex(16)
        expected = self.request_token

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query)
                if self.headers.get("Authorization", "").lower() != f"bearer {expected}":
                    self.send_response(403)
                    self.end_headers()
                    return
                body = json.dumps({"value": mint(query.get("audience", [""])[0], claims)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/token?api-version=2.0"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- what a test asks of a finished run ----------------------------------------------------------


def references(path: Path) -> Iterator[str]:
    """Every steps.*.outputs.* / needs.*.outputs.* reference in a workflow file (for coverage checks)."""
    yield from re.findall(r"(?:steps|needs)\.[A-Za-z0-9_-]+\.outputs\.[A-Za-z0-9_-]+", path.read_text("utf-8"))
