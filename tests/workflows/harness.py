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

A job's ``uses: ./.github/workflows/FILE`` (the caller's repository at the triggering commit)
or ``uses: OWNER/REPO/.github/workflows/FILE@REF`` (``Runner.repositories``) runs a reusable
workflow (``on: workflow_call``) as GitHub does: its typed ``inputs`` (defaults applied), only
the ``secrets`` the caller passes (or ``inherit``), the caller's ``github`` and ``vars`` but not
its ``env``, each called job's GITHUB_TOKEN capped by the caller's permissions, its OIDC
``job_workflow_ref``/``job_workflow_sha`` naming the called file. Its jobs are reported as
``RunResult.jobs["<caller>/<job>"]``; the caller's own entry holds the aggregate result (failure
when a called job failed) and ``on.workflow_call.outputs`` (``needs.<caller>.outputs.*``).

Checks that fail the run (``HarnessError``) rather than pass silently:

* a ``uses:`` not in ``ACTIONS`` below, a key of a job or step the harness does not
  implement (``continue-on-error``, ``services``, ``container``, ...);
* an expression it cannot parse, an unknown context, ``steps.X`` naming no step of the
  job, ``needs.X`` naming a job not in ``needs``;
* a ``steps.<id>.outputs.<name>`` or ``needs.<job>.outputs.<name>`` reference to a step or
  job that succeeded but never wrote that output (``RunResult.unresolved``; after a
  failed step or job such references are recorded in ``unresolved_after_failure``);
* a malformed ``GITHUB_OUTPUT`` / ``GITHUB_ENV`` file (no ``=``, unterminated heredoc);
* a secret value in a step's log (the caller's secrets and those it passed to a called workflow);
* a reusable workflow that calls another, a caller job key beside those GitHub allows that the
  harness does not implement (``strategy``, ``concurrency``), an unknown ``Runner.repositories``
  name or a called file that is missing or has no ``on: workflow_call``.

What GitHub refuses when a run starts is reported as it is: a caller passing an input or secret
the called workflow does not declare, missing a required one, giving an input a value of another
type, or a called job asking for more permissions than its caller grants fails that caller job
(the reason in its ``notes``) and no job of the run runs (an input built from ``needs``
outputs is only known, and checked, when the caller job starts: then only that caller fails).
A job without a ``permissions`` key gets its workflow's top-level ``permissions``.

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

from tests.doubles.github.actions import ExpressionError, evaluate, evaluate_condition, interpolate, to_str

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

    ``source``: a git repository holding the workflow's commit (``actions/checkout`` clones it;
    ``uses: ./.github/workflows/FILE`` reads FILE from it at the triggering commit).
    ``repositories``: other repositories by ``owner/name`` -> a local git repository, for
    ``uses: OWNER/REPO/.github/workflows/FILE@REF`` and ``actions/checkout`` with ``repository:``.
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
    repositories: dict[str, Path] = field(default_factory=dict)

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
    github = job.ctx["github"]
    # Without `repository`, the workflow run's repository: in a called workflow that is the caller's.
    repository = inputs.get("repository") or str(github["repository"])
    if repository == github["repository"]:
        origin, ref = job.runner.source, inputs.get("ref") or str(github["sha"])
    elif repository in job.runner.repositories:
        # Another repository: its default branch (what a clone checks out) unless `ref` says otherwise.
        origin, ref = job.runner.repositories[repository], inputs.get("ref", "")
    else:
        raise StepFailed(f"checkout: repository {repository!r} not found (not github.repository, "
                         "not in Runner.repositories)")
    workspace = job.workspace.resolve()
    target = (workspace / inputs.get("path", ".")).resolve()
    if target != workspace and workspace not in target.parents:
        raise StepFailed(f"checkout: Repository path '{target}' is not under '{workspace}'")
    if target.is_dir() and any(target.iterdir()):
        # As the action does with a directory that is not already this repository's clone.
        for entry in target.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    target.mkdir(parents=True, exist_ok=True)
    _git(["clone", "--quiet", "--no-hardlinks", str(origin), str(target)], cwd=job.dir)
    if ref:
        # A branch as refs/heads/X exists in the clone as its remote-tracking branch.
        local = f"refs/remotes/origin/{ref.removeprefix('refs/heads/')}" if ref.startswith("refs/heads/") else ref
        _git(["-c", "advice.detachedHead=false", "checkout", "--quiet", local], cwd=target)
    job.log(f"checkout: {repository} ({origin}) at {ref or 'its default branch'} -> "
            f"{_git(['rev-parse', 'HEAD'], cwd=target).strip()} in {target}")


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


def _cosign_installer(job: JobRun, inputs: Mapping[str, str]) -> None:
    # The machine's cosign (scripts/install-tools.sh) stands in for the release the step asks for only within its
    # series (install-tools takes whatever 3.1.x Debian ships): a workflow pinning another series fails the step.
    from pipeline.verify.external import cosign_path

    want = _required(inputs, "cosign-release")
    cosign = cosign_path()
    # install-tools.sh records the Debian package's version in the tools dir the binary is unpacked under.
    records = [d / "cosign.version" for d in (cosign.resolve().parents if cosign else ()) if (d / "cosign.version").is_file()]
    have = "v" + records[0].read_text("utf-8").strip().split("-", 1)[0] if records else None
    if cosign is None or have is None or have.rsplit(".", 1)[0] != want.rsplit(".", 1)[0]:
        raise StepFailed(f"sigstore/cosign-installer: cosign-release {want}, this machine has {have} (make setup)")
    bindir = job.dir / "cosign-bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "cosign").symlink_to(cosign.resolve())
    job.path.insert(0, str(bindir))


ACTIONS: dict[str, Action] = {
    "actions/checkout": Action(
        "`git clone` of `repository` (default github.repository: Runner.source; another one: "
        "Runner.repositories, else 'not found') into `path` under the workspace, then `git checkout` of `ref` "
        "(default github.sha for github.repository, the default branch for another one)",
        _checkout, frozenset({"repository", "ref", "path", "persist-credentials"})),
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
    "sigstore/cosign-installer": Action(
        "puts the machine's cosign (scripts/install-tools.sh) first on the job's PATH when it is of the "
        "`cosign-release` asked for's series (v3.1.x), else fails the step",
        _cosign_installer, frozenset({"cosign-release"})),
}

HOST: dict[str, str] = {
    "sudo": "Runner.tools/sudo: only the rules of deploy/benchseal.sudoers; runs the deploy/ wrapper with "
            "/opt/benchseal -> the checkout under test + the project venv's interpreter, "
            "/var/lib/benchseal -> Runner.sudo_home",
    "gh": "the GitHub CLI (Debian package gh, installed by scripts/setup.sh), against GITHUB_API_URL",
    "id-token": "`permissions: id-token: write` -> ACTIONS_ID_TOKEN_REQUEST_URL/_TOKEN served on loopback, "
                "tokens minted by Runner.oidc; local_issuer(instance): the private Sigstore instance's issuer, "
                "subject https://github.com/<job_workflow_ref> (a called workflow's job: the called file at its "
                "ref, job_workflow_sha its commit; workflow_ref the caller's)",
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
    # By job id; a called workflow's jobs as "<caller>/<job>" (GitHub shows "caller / job") beside
    # the caller's own entry (their aggregate result and the workflow_call outputs).
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
        return "\n".join(f"== {j} [{self.jobs[j].result}]\n" + "".join(f"note: {n}\n" for n in self.jobs[j].notes)
                         + self.jobs[j].log[-4000:] for j in self.order)


# --- execution ---------------------------------------------------------------------------

_JOB_KEYS = {"name", "runs-on", "needs", "if", "permissions", "timeout-minutes", "strategy", "outputs", "steps",
             "env"}
# A job that calls a reusable workflow takes only these (GitHub allows `strategy` and `concurrency` too;
# the harness does not implement them).
_CALLER_KEYS = {"name", "uses", "with", "secrets", "needs", "if", "permissions"}
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


@dataclass(frozen=True)
class _Workflow:
    """The file a job's steps come from, as its OIDC token names it: ``job_workflow_ref``
    (OWNER/REPO/.github/workflows/FILE@REF) and ``job_workflow_sha``."""

    ref: str
    sha: str


@dataclass
class _Run:
    """What every job of one run shares."""

    runner: Runner
    trigger: Trigger
    result: RunResult
    dir: Path
    event_path: Path
    # Every value a log must not show: the caller's secrets and whatever it passed to a called workflow.
    secret_values: set[str] = field(default_factory=set)


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
    state = _Run(runner, trigger, result, run_dir, event_path, {v for v in trigger.secrets.values() if v})
    base = _Evaluator(result, {
        "github": github, "inputs": trigger.inputs, "vars": trigger.vars, "secrets": trigger.secrets,
        "env": {}, "runner": {"os": "Linux", "arch": "X64", "temp": "", "name": "benchseal-harness"},
    })
    workflow_env = {k: base.text(v, f"env.{k}") for k, v in (doc.get("env") or {}).items()}
    jobs: dict[str, dict[str, Any]] = doc["jobs"]
    calls: dict[str, _Call] = {}
    for job_id, job in jobs.items():
        unknown = set(job) - (_CALLER_KEYS if "uses" in job else _JOB_KEYS)
        if unknown:
            raise HarnessError(f"job {job_id}: keys the harness does not implement: {sorted(unknown)}")
        if "uses" in job:
            calls[job_id] = _load_call(job_id, str(job["uses"]), runner, github)
    order = _needs_order(jobs)
    workflow_permissions = _stated_permissions("workflow", doc)
    # A job without a permissions key gets the workflow's (None: neither states any).
    permissions = {job_id: _or(_stated_permissions(f"job {job_id}", job), workflow_permissions)
                   for job_id, job in jobs.items()}
    # GitHub validates every call (inputs, secrets, permissions) before the run starts: a bad one
    # fails the whole run and no job runs.
    refused: dict[str, str] = {}
    for job_id, call in calls.items():
        try:
            _bind_call(job_id, jobs[job_id], call, base.ctx, {}, result, setup=True)
            _called_permissions(job_id, call, permissions[job_id])
        except _Refused as exc:
            refused[job_id] = str(exc)
    if refused:
        for job_id in order:
            result.order.append(job_id)
            if job_id in refused:
                result.jobs[job_id] = JobResult(job_id, "failure", notes=[
                    f"GitHub refused the run before it started: job {job_id} (uses: {calls[job_id].uses}): "
                    f"{refused[job_id]}"])
            else:
                result.jobs[job_id] = JobResult(job_id, "skipped", notes=[
                    f"not run: GitHub refused the run before it started ({', '.join(sorted(refused))})"])
        return result
    _run_jobs(state, jobs, dict(base.ctx), workflow_env, prefix="", permissions=permissions,
              workflow=_Workflow(str(github["workflow_ref"]), trigger.sha), calls=calls)
    for job_result in result.jobs.values():
        if any(s in job_result.log or s in job_result.summary for s in state.secret_values):
            result.secret_leaks.append(job_result.id)
    return result


def _run_jobs(state: _Run, jobs: Mapping[str, Mapping[str, Any]], ctx: dict[str, Any], workflow_env: dict[str, str],
              *, prefix: str, permissions: Mapping[str, dict[str, str] | None], workflow: _Workflow,
              calls: Mapping[str, _Call]) -> dict[str, JobResult]:
    """The jobs of one workflow file in ``needs`` order; ``needs.X`` names a job of that file.
    Results go into the run's result as ``prefix + job id``; returned by job id."""
    done: dict[str, JobResult] = {}
    for job_id in _needs_order(jobs):
        full = prefix + job_id
        state.result.order.append(full)
        job = jobs[job_id]
        needs = _as_list(job.get("needs"))
        need_results = {n: done[n].result for n in needs}
        job_ctx = dict(ctx, env=dict(workflow_env), needs={
            n: {"result": done[n].result, "outputs": done[n].outputs} for n in needs})
        evaluator = _Evaluator(state.result, job_ctx, needs=done, where=full)
        all_ok = all(r == "success" for r in need_results.values())
        any_failed = any(r == "failure" for r in need_results.values())
        functions = _status_functions(all_ok, any_failed)
        condition = job.get("if", "success()")
        if not evaluator.condition(condition, functions):
            done[job_id] = JobResult(full, "skipped")
        elif job_id in calls:
            done[job_id] = _run_call(full, job, calls[job_id], job_ctx, done, state, permissions[job_id])
        else:
            done[job_id] = _run_job(full, job, job_ctx, evaluator, state, dict(workflow_env),
                                    permissions=permissions[job_id], workflow=workflow)
        state.result.jobs[full] = done[job_id]
    return done


def _or(stated: dict[str, str] | None, fallback: dict[str, str] | None) -> dict[str, str] | None:
    return fallback if stated is None else stated


# --- reusable workflows (a job's `uses: .../.github/workflows/FILE`) ----------------------------


class _Refused(Exception):
    """GitHub refuses this call of a reusable workflow (the caller job fails, no called job runs)."""


_INPUT_TYPES = ("string", "boolean", "number")
# Unset, not required, no default: Actions gives the type's empty value.
_INPUT_EMPTY: dict[str, object] = {"string": "", "boolean": False, "number": 0}


@dataclass(frozen=True)
class _Call:
    """A reusable workflow as one caller job names it."""

    uses: str
    file: str
    doc: dict[str, Any]
    workflow: _Workflow
    inputs: dict[str, dict[str, Any]]
    secrets: dict[str, dict[str, Any]]
    outputs: dict[str, dict[str, Any]]


def _load_call(job_id: str, uses: str, runner: Runner, github: Mapping[str, Any]) -> _Call:
    """The called file as GitHub reads it: ``./.github/workflows/FILE`` from the caller's
    repository at the triggering commit, ``OWNER/REPO/.github/workflows/FILE@REF`` from that
    repository (Runner.repositories) at REF (a commit, tag or branch)."""
    local = re.fullmatch(r"\./\.github/workflows/([^/@]+\.ya?ml)", uses)
    remote = re.fullmatch(r"([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)/\.github/workflows/([^/@]+\.ya?ml)@([^@\s]+)", uses)
    if local:
        repository, file, origin, commit = str(github["repository"]), local.group(1), runner.source, str(github["sha"])
        ref = f"{repository}/.github/workflows/{file}@{github['ref']}"
    elif remote:
        repository, file, at = remote.groups()
        if repository not in runner.repositories:
            raise HarnessError(f"job {job_id}: uses: {uses}: repository {repository} is not in Runner.repositories")
        origin, ref = runner.repositories[repository], uses
        commit = _git_or_raise(["rev-parse", "--verify", "--quiet", f"{at}^{{commit}}"], origin,
                               f"job {job_id}: uses: {uses}: {at!r} is no commit, tag or branch of {repository}")
    else:
        raise HarnessError(f"job {job_id}: uses: {uses!r} is neither ./.github/workflows/FILE nor "
                           "OWNER/REPO/.github/workflows/FILE@REF")
    text = _git_or_raise(["show", f"{commit}:.github/workflows/{file}"], origin,
                         f"job {job_id}: uses: {uses}: no .github/workflows/{file} in {repository} at {commit}")
    doc = yaml.safe_load(text)
    where = f"{repository}/.github/workflows/{file}@{commit}"
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), dict):
        raise HarnessError(f"{where}: not a workflow with jobs")
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads the key `on` as True
    if isinstance(triggers, str):
        triggers = {triggers: None}
    elif isinstance(triggers, list):
        triggers = dict.fromkeys(triggers)
    if not isinstance(triggers, dict) or "workflow_call" not in triggers:
        raise HarnessError(f"job {job_id}: uses: {uses}: {where} has no `on: workflow_call`, it cannot be called")
    spec = triggers["workflow_call"] or {}
    if not isinstance(spec, dict) or set(spec) - {"inputs", "secrets", "outputs"}:
        raise HarnessError(f"{where}: on.workflow_call: only inputs, secrets and outputs are implemented")
    inputs = _declared(where, "inputs", spec, {"description", "required", "type", "default"})
    for name, declared in inputs.items():
        if declared.get("type") not in _INPUT_TYPES:
            raise HarnessError(f"{where}: on.workflow_call.inputs.{name}.type must be one of {_INPUT_TYPES}")
    outputs = _declared(where, "outputs", spec, {"description", "value"})
    for name, declared in outputs.items():
        if "value" not in declared:
            raise HarnessError(f"{where}: on.workflow_call.outputs.{name} has no value")
    for called_id, job in doc["jobs"].items():
        if "uses" in job:
            raise HarnessError(f"{where}: job {called_id}: a called workflow calling another is not implemented")
        unknown = set(job) - _JOB_KEYS
        if unknown:
            raise HarnessError(f"{where}: job {called_id}: keys the harness does not implement: {sorted(unknown)}")
    return _Call(uses, file, doc, _Workflow(ref, commit), inputs,
                 _declared(where, "secrets", spec, {"description", "required"}), outputs)


def _declared(where: str, kind: str, spec: Mapping[str, Any], keys: set[str]) -> dict[str, dict[str, Any]]:
    declared: dict[str, dict[str, Any]] = {}
    for name, entry in (spec.get(kind) or {}).items():
        _string_key(where, f"on.workflow_call.{kind}", name)
        entry = entry or {}
        if not isinstance(entry, dict) or set(entry) - keys:
            raise HarnessError(f"{where}: on.workflow_call.{kind}.{name}: only {sorted(keys)} are implemented")
        declared[str(name)] = entry
    return declared


def _string_key(where: str, what: str, key: object) -> None:
    # PyYAML reads YAML 1.1: an unquoted on/off/yes/no key is a boolean, where GitHub reads a name.
    if not isinstance(key, str):
        raise HarnessError(f"{where}: {what}: key {key!r} is not a string (quote it: PyYAML reads on/off/yes/no "
                           "as booleans)")


def _git_or_raise(args: list[str], cwd: Path, message: str) -> str:
    try:
        return _git(args, cwd=cwd).strip()
    except StepFailed as exc:
        raise HarnessError(f"{message} ({exc})") from exc


def _bind_call(caller_id: str, job: Mapping[str, Any], call: _Call, ctx: Mapping[str, Any],
               needs: Mapping[str, JobResult], result: RunResult, *, setup: bool
               ) -> tuple[dict[str, object], dict[str, str]]:
    """The called workflow's ``inputs`` (typed, defaults applied) and ``secrets`` from the
    caller's ``with:`` and ``secrets:``, or _Refused as GitHub refuses the call. ``setup``:
    before the run starts, when values built from ``needs`` are not known yet (checked when the
    caller job starts)."""
    # The contexts Actions allows in a caller's `with:` (secrets only under `secrets:`).
    scope = {"github": ctx["github"], "inputs": ctx["inputs"], "vars": ctx["vars"], "needs": ctx.get("needs", {})}
    with_ev = _Evaluator(result, scope, needs=needs, where=caller_id)
    secrets_ev = _Evaluator(result, dict(scope, secrets=ctx["secrets"]), needs=needs, where=caller_id)
    given = job.get("with") or {}
    if not isinstance(given, dict):
        raise HarnessError(f"job {caller_id}: with: must be a map")
    for name in given:
        _string_key(f"job {caller_id}", "with", name)
        if name not in call.inputs:
            raise _Refused(f"Invalid input, {name} is not defined in the referenced workflow.")
    inputs: dict[str, object] = {}
    for name, declared in call.inputs.items():
        kind = str(declared["type"])
        if name in given:
            if setup and _mentions_needs(given[name]):
                continue
            inputs[name] = _typed_input(name, kind, with_ev.value(given[name], f"with.{name}"))
        elif declared.get("required"):
            raise _Refused(f"Input {name} is required, but not provided while calling.")
        elif "default" in declared:
            inputs[name] = _typed_input(name, kind, with_ev.value(declared["default"], f"inputs.{name}.default"))
        else:
            inputs[name] = _INPUT_EMPTY[kind]
    passed = job.get("secrets")
    secrets: dict[str, str] = {}
    if passed == "inherit":
        # Every secret of the caller, declared or not.
        secrets = dict(ctx["secrets"])
    elif isinstance(passed, dict):
        for name, value in passed.items():
            if name not in call.secrets:
                raise _Refused(f"Invalid secret, {name} is not defined in the referenced workflow.")
            if not (setup and _mentions_needs(value)):
                secrets[str(name)] = secrets_ev.text(value, f"secrets.{name}")
    elif passed is not None:
        raise HarnessError(f"job {caller_id}: secrets: must be `inherit` or a map")
    provided = set(ctx["secrets"]) if passed == "inherit" else set(passed or {})
    for name, declared in call.secrets.items():
        if declared.get("required") and name not in provided:
            raise _Refused(f"Secret {name} is required, but not provided while calling.")
    return inputs, secrets


def _mentions_needs(value: object) -> bool:
    return isinstance(value, str) and re.search(r"\$\{\{[^}]*\bneeds\.", value) is not None


def _typed_input(name: str, kind: str, value: object) -> object:
    """As Actions checks a caller's value against the input's type: a boolean or a number must
    be one (a string such as 'true' is refused); a string input takes any scalar as its text."""
    if kind == "string" and not isinstance(value, dict | list):
        return to_str(value)
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return value
    raise _Refused(f"input {name} (type: {kind}): Unexpected value '{to_str(value)}'")


_LEVELS = {"none": 0, "read": 1, "write": 2}


def _called_permissions(caller_id: str, call: _Call, granted: dict[str, str] | None
                        ) -> dict[str, dict[str, str] | None]:
    """Each called job's GITHUB_TOKEN permissions: its own (or its workflow's) when stated, else
    the caller's. A called job may ask for less than the caller grants, never more: GitHub then
    refuses the run."""
    workflow_level = _stated_permissions(f"{call.uses}", call.doc)
    effective: dict[str, dict[str, str] | None] = {}
    for called_id, job in call.doc["jobs"].items():
        stated = _or(_stated_permissions(f"job {caller_id}/{called_id}", job), workflow_level)
        if stated is not None and granted is None:
            raise HarnessError(f"job {caller_id}/{called_id} states permissions but its caller {caller_id} states "
                               "none (job or workflow): the repository's default token permissions are not implemented")
        for scope, level in (stated or {}).items():
            allowed = (granted or {}).get(scope, "none")
            if _LEVELS[level] > _LEVELS[allowed]:
                raise _Refused(f"The nested job '{called_id}' is requesting '{scope}: {level}', "
                               f"but is only allowed '{scope}: {allowed}'.")
        effective[called_id] = granted if stated is None else stated
    return effective


def _run_call(caller_id: str, job: Mapping[str, Any], call: _Call, ctx: dict[str, Any],
              needs: Mapping[str, JobResult], state: _Run, granted: dict[str, str] | None) -> JobResult:
    """The called workflow's jobs as ``<caller>/<job>``; the caller's result aggregates them: failure
    when one failed, its outputs ``on.workflow_call.outputs`` evaluated with the ``jobs`` context."""
    try:
        inputs, secrets = _bind_call(caller_id, job, call, ctx, needs, state.result, setup=False)
        permissions = _called_permissions(caller_id, call, granted)
    except _Refused as exc:
        return JobResult(caller_id, "failure", notes=[f"GitHub refused to call {call.uses}: {exc}"])
    state.secret_values.update(v for v in secrets.values() if v)
    # github and vars are the caller's; env is not passed (the called file's own env only).
    called_ctx = {"github": ctx["github"], "inputs": inputs, "vars": ctx["vars"], "secrets": secrets, "env": {},
                  "runner": ctx["runner"]}
    env_ev = _Evaluator(state.result, called_ctx, where=f"{caller_id} ({call.file})")
    workflow_env = {k: env_ev.text(v, f"env.{k}") for k, v in (call.doc.get("env") or {}).items()}
    done = _run_jobs(state, call.doc["jobs"], called_ctx, workflow_env, prefix=f"{caller_id}/",
                     permissions=permissions, workflow=call.workflow, calls={})
    out_ev = _Evaluator(state.result, {
        "github": ctx["github"], "inputs": inputs, "vars": ctx["vars"],
        "jobs": {n: {"result": r.result, "outputs": r.outputs} for n, r in done.items()},
    }, needs=done, where=f"{caller_id} (on.workflow_call.outputs)")
    outputs: dict[str, str] = {}
    for key, declared in call.outputs.items():
        # As a job's outputs: one built from a never-written output is reported and left out.
        before = len(state.result.unresolved) + len(state.result.unresolved_after_failure)
        value = out_ev.text(declared["value"], f"outputs.{key}.value")
        if len(state.result.unresolved) + len(state.result.unresolved_after_failure) == before:
            outputs[key] = value
    failed = any(r.result in ("failure", "cancelled") for r in done.values())
    return JobResult(caller_id, "failure" if failed else "success", outputs=outputs)


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
        if root in ("needs", "jobs"):
            return self._job_ref(path, parts)
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

    def _job_ref(self, path: str, parts: list[str]) -> object:
        """``needs.<job>.*``, or ``jobs.<job>.*`` (a called workflow's outputs: any of its jobs)."""
        if len(parts) < 2 or parts[1] not in self.ctx[parts[0]]:
            known = "in needs" if parts[0] == "needs" else "a job of the called workflow"
            raise HarnessError(f"{self.where}: {path!r}: job {parts[1] if len(parts) > 1 else ''!r} is not {known}")
        job = self.needs[parts[1]]
        if len(parts) == 3 and parts[2] == "result":
            return job.result
        if parts[2] != "outputs" or len(parts) != 4:
            raise HarnessError(f"{self.where}: unsupported {parts[0]} reference {path!r}")
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

    def value(self, value: object, where: str) -> object:
        """A value as Actions passes it to a called workflow's input: a YAML scalar keeps its type,
        one whole ``${{ }}`` is the expression's own value (boolean, number, ...), any other
        string the interpolated text."""
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, str):
            whole = _WHOLE_EXPR.fullmatch(value.strip())
            if whole and value.count("${{") == 1:
                try:
                    return evaluate(whole.group(1), self.ctx, resolve=self.resolve)
                except ExpressionError as exc:
                    raise HarnessError(f"{self.where}: {where}: {exc}") from exc
        return self.text(value, where)

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


_WHOLE_EXPR = re.compile(r"\$\{\{(.*)\}\}", re.S)
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


def _run_job(job_id: str, job: Mapping[str, Any], ctx: dict[str, Any], evaluator: _Evaluator, state: _Run,
             env: dict[str, str], *, permissions: dict[str, str] | None, workflow: _Workflow) -> JobResult:
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
        conclusion, steps, summary, notes, outputs = _run_leg(job_id, job, leg_eval, state, dict(env), index,
                                                              permissions, workflow)
        leg_results.append(conclusion)
        result.legs.append(steps)
        result.summary += summary
        result.notes += notes
        result.outputs.update(outputs)
    result.result = "failure" if "failure" in leg_results else ("cancelled" if "cancelled" in leg_results
                                                                else "success")
    return result


def _run_leg(job_id: str, job: Mapping[str, Any], ev: _Evaluator, state: _Run, env: dict[str, str], index: int,
             stated: dict[str, str] | None, workflow: _Workflow
             ) -> tuple[str, list[StepResult], str, list[str], dict[str, str]]:
    """One leg; ``stated``: its GITHUB_TOKEN permissions (None: nobody stated any)."""
    runner, trigger, run_dir, event_path = state.runner, state.trigger, state.dir, state.event_path
    job_dir = run_dir / f"{job_id.replace('/', '--')}-{index}"
    (job_dir / "workspace").mkdir(parents=True)
    (job_dir / "temp").mkdir()
    (job_dir / "home").mkdir()
    permissions = stated or {}
    if runner.github_token is not None:
        if stated is None:
            raise HarnessError(f"job {job_id}: no permissions key (job or workflow); the repository's default "
                               "token permissions are not implemented (Runner.github_token is set)")
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
        token_server = _TokenServer(runner.oidc, _oidc_claims(ev.ctx["github"], workflow))
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


def _stated_permissions(where: str, node: Mapping[str, Any]) -> dict[str, str] | None:
    """The ``permissions`` map of a job or a workflow (``{}``: none), or None when it states none.
    The shorthands (read-all, write-all) are not implemented."""
    if "permissions" not in node:
        return None
    permissions = node.get("permissions") or {}
    if not isinstance(permissions, dict):
        raise HarnessError(f"{where}: permissions {permissions!r}: only a map is implemented")
    for name, level in permissions.items():
        if level not in _LEVELS:
            raise HarnessError(f"{where}: permissions.{name}: {level!r} is not read|write|none")
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


def _oidc_claims(github: Mapping[str, Any], workflow: _Workflow) -> dict[str, str]:
    """As GitHub fills a job's token: the run (repository, ref, sha, workflow_ref: the caller's in a
    called workflow) and the file the job's steps come from (job_workflow_ref/_sha: the called one)."""
    return {"repository": str(github["repository"]), "ref": str(github["ref"]), "sha": str(github["sha"]),
            "event_name": str(github["event_name"]), "job_workflow_ref": workflow.ref,
            "job_workflow_sha": workflow.sha, "workflow_ref": str(github["workflow_ref"]),
            "workflow_sha": str(github["sha"]), "run_id": str(github["run_id"]),
            "run_attempt": str(github["run_attempt"]),
            "sub": f"repo:{github['repository']}:ref:{github['ref']}"}


def _workflow_file_ref(claim: str, value: str) -> tuple[str, str, str]:
    """OWNER/REPO/.github/workflows/FILE@REF -> (OWNER/REPO, FILE, REF)."""
    path, _, ref = value.partition("@")
    repository, _, file = path.partition("/.github/workflows/")
    if not file or not ref:
        raise HarnessError(f"{claim} {value!r} is not OWNER/REPO/.github/workflows/FILE@REF")
    return repository, file, ref


def local_issuer(instance: Any, server_url: str = "https://github.com") -> Callable[[str, Mapping[str, str]], str]:
    """``Runner.oidc`` backed by the private Sigstore instance's GitHub-shaped issuer
    (pipeline.local.sigstore): issuer, ``sub`` and claims as GitHub Actions gives a
    job, so its Fulcio certifies ``https://github.com/<job_workflow_ref>`` as public-good does
    (a called workflow's job: the called file's ref, its commit in ``job_workflow_sha``)."""
    from pipeline.local import sigstore as sigstore_local

    def mint(audience: str, claims: Mapping[str, str]) -> str:
        if audience != "sigstore":
            raise HarnessError(f"the local issuer mints tokens for audience 'sigstore' only, not {audience!r}")
        repository, file, ref = _workflow_file_ref("job_workflow_ref", claims["job_workflow_ref"])
        _, caller_file, _ = _workflow_file_ref("workflow_ref", claims["workflow_ref"])
        job = sigstore_local.GitHubJob(repository=claims["repository"], ref=claims["ref"], sha=claims["sha"],
                                       workflow_file=file, event_name=claims["event_name"],
                                       workflow_repository=repository, workflow_ref=ref,
                                       workflow_sha=claims["job_workflow_sha"], caller_workflow_file=caller_file,
                                       run_id=claims["run_id"], run_attempt=claims["run_attempt"])
        # The issuer's token must say what GitHub's would say for this job.
        differ = {k: (v, claims[k]) for k, v in job.claims().items() if k in claims and claims[k] != v}
        if differ:
            raise HarnessError(f"the local issuer would mint other claims than GitHub's: {differ}")
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
