"""``benchseal init``: benchseal.toml and the caller workflow for an adopter's repository, and what to set on GitHub.

Run at the top of the adopter's git checkout. It detects the agent's package, a Python one
(``pyproject.toml`` with ``[project]`` name and version) or an npm one (``package.json`` with name and
version), writes ``benchseal.toml`` (checked with the loader every release uses,
``pipeline.core.project.load_project``, before it is written) and ``.github/workflows/benchseal.yml``, the
caller of benchseal's reusable ``release.yml`` pinned to the 40-hex commit of the benchseal installed here
(its source checkout's HEAD; an installed wheel has none: ``--benchseal-commit``). Then it prints, as one
list, the variables and the secret to set on GitHub, the infra policy's entries for this repository, and
whatever it could not detect. Nothing is guessed silently: a value it could not find is written as a
placeholder that the next ``release --local`` refuses before the build, and listed.

Code found in the repository is read (``ast``), never imported: importing would run it.
Exit codes: 0 written; 2 nothing to detect, both kinds found without ``--kind``, a file already there
(without ``--force``), no checkout, no benchseal commit.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.core.contracts import COMMIT_RE
from pipeline.core.doctor import setting_lines
from pipeline.core.errors import UsageError, ValidationError
from pipeline.core.fsutil import atomic_write_text
from pipeline.core.paths import REPO_ROOT
from pipeline.core.project import NPM_PACKAGE_PATTERN, PROJECT_FILE, load_project

WORKFLOW_PATH = ".github/workflows/benchseal.yml"
PLACEHOLDER_COMMIT = "BENCHSEAL_COMMIT"
# The adopter's caller of benchseal's release.yml, as examples/hello-agent/.github/workflows/release.yml
# holds it with BENCHSEAL_COMMIT for the pin (a test keeps the two equal; docs/github.md step 2 explains it).
CALLER_WORKFLOW = """\
# benchseal in an adopter's repository: this file, benchseal.toml and the agent's code (docs/github.md).
name: release
run-name: ${{ format('Release {0} {1}', inputs.deploy_ref || github.ref_name, inputs.switchboard_correlation_id) }}
on:
  push:
    tags: ["v*"]
  workflow_dispatch:  # Switchboard-style: the tag to deploy; the correlation id ends the run-name
    inputs:
      deploy_ref: {description: Release tag (vX.Y.Z), required: true, type: string}
      switchboard_correlation_id: {description: Switchboard correlation id, required: true, type: string}
permissions: {}
concurrency: {group: "benchseal-release-${{ inputs.deploy_ref || github.ref_name }}", cancel-in-progress: false}
jobs:
  release:
    permissions:
      contents: read  # check out the release and benchseal
      packages: write  # push the images to the registry with GITHUB_TOKEN
      id-token: write  # keyless signing inside benchseal's release.yml
      checks: write  # the benchseal/benchmark check run: success after the benchmark, failure if held back
    uses: benchseal/benchseal/.github/workflows/release.yml@BENCHSEAL_COMMIT  # the 40-hex commit you adopt
    with:
      tag: ${{ inputs.deploy_ref || github.ref_name }}
      infra-repository: ${{ vars.BENCHSEAL_INFRA_REPOSITORY }}
      image-prefix: ${{ vars.BENCHSEAL_IMAGE_PREFIX }}
      sigstore-url: ${{ vars.BENCHSEAL_SIGSTORE_URL }}  # empty: public-good Sigstore
      trusted-root: ${{ vars.BENCHSEAL_TRUSTED_ROOT }}
    secrets:
      infra-dispatch-token: ${{ secrets.BENCHSEAL_INFRA_DISPATCH_TOKEN }}
"""
_SKIP_DIRS = frozenset({".git", ".venv", "venv", "node_modules", "build", "dist", "__pycache__", "tests", "test"})
_MAX_SCANNED = 2000  # Python files read when looking for the Harbor agent class


@dataclass
class Detected:
    """What ``init`` found: the project file's text, the agent's name and kind, and what is left to the user."""

    kind: str
    name: str
    package: str
    version: str
    toml: str
    todo: list[str] = field(default_factory=list)


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False, timeout=60,
                          env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    return done.stdout.strip() if done.returncode == 0 else ""


def benchseal_commit(given: str | None) -> str:
    """The commit the caller workflow pins: ``given``, else the HEAD of the checkout this benchseal runs from."""
    if given is not None:
        if not COMMIT_RE.match(given):
            raise ValidationError("--benchseal-commit", "must be a 40-hex commit of benchseal (a tag or branch "
                                  "could be moved by whoever controls it)", given)
        return given
    top = _git(REPO_ROOT, "rev-parse", "--show-toplevel")
    commit = _git(REPO_ROOT, "rev-parse", "HEAD") if top and Path(top).resolve() == REPO_ROOT.resolve() else ""
    if not COMMIT_RE.match(commit):
        raise UsageError(f"init: the benchseal here ({REPO_ROOT}) is no git checkout, so its commit is unknown: "
                         "pass --benchseal-commit <the 40-hex benchseal commit you adopt>")
    return commit


def _slug(value: str) -> str:
    slug = re.sub(r"[^a-z0-9_-]+", "-", value.lower()).strip("-_")[:64]
    return slug or "agent"


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string of printable text is a TOML basic string


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_pyproject(path: Path) -> dict[str, Any] | None:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    project = data.get("project")
    if not isinstance(project, dict) or not isinstance(project.get("name"), str):
        return None
    dynamic = project.get("dynamic")
    dynamic = dynamic if isinstance(dynamic, list) else []
    if not isinstance(project.get("version"), str) and "version" not in dynamic:
        return None
    return data


def _agent_classes(directory: Path) -> list[str]:
    """``module:Class`` of each class in the repository's Python files whose base is named like Harbor's
    ``BaseAgent`` / ``BaseInstalledAgent``, by reading the files (never importing them)."""
    found: list[str] = []
    scanned = 0
    roots = [directory / "src", directory] if (directory / "src").is_dir() else [directory]
    seen: set[Path] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
            for filename in sorted(filenames):
                path = Path(dirpath) / filename
                if not filename.endswith(".py") or path in seen or path.is_symlink() or scanned >= _MAX_SCANNED:
                    continue
                seen.add(path)
                scanned += 1
                relative = path.relative_to(root).with_suffix("")
                parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
                if not parts or not all(p.isidentifier() for p in parts):
                    continue
                try:
                    tree = ast.parse(path.read_bytes(), filename=str(path))
                except (OSError, SyntaxError, ValueError, RecursionError):
                    continue
                for node in tree.body:
                    if isinstance(node, ast.ClassDef) and any(_base_name(b) in ("BaseAgent", "BaseInstalledAgent")
                                                              for b in node.bases):
                        found.append(f"{'.'.join(parts)}:{node.name}")
    return found


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def detect_python(directory: Path, data: dict[str, Any]) -> Detected:
    project = data["project"]
    package = str(project["name"])
    version = project.get("version") if isinstance(project.get("version"), str) else "(dynamic)"
    name = _slug(package)
    todo = []
    classes = _agent_classes(directory)
    if len(classes) == 1:
        import_path = classes[0]
    else:
        module = re.sub(r"[^A-Za-z0-9_]", "_", package.lower())
        import_path = classes[0] if classes else f"{module}.agent:Agent"
        todo.append(f"benchseal.toml: check [agent].import_path = {import_path!r}: "
                    + (f"{len(classes)} Harbor agent classes found ({', '.join(classes)})" if classes else
                       "no subclass of Harbor's BaseAgent found"))
    toml = (f'schema = "benchseal.project/v1"\n\n'
            f"# {package} {version}: its wheel is built from the release commit and must carry the tag's version\n"
            "# (v1.2.3 -> 1.2.3, pyproject.toml [project] version); docs/build.md.\n"
            "[agent]\n"
            f"name = {_toml_string(name)}\n"
            'kind = "python"\n'
            'path = "."\n'
            f"import_path = {_toml_string(import_path)}\n")
    return Detected(kind="python", name=name, package=package, version=str(version), toml=toml, todo=todo)


def _npm_bin(data: dict[str, Any], package: str) -> str | None:
    bins = data.get("bin")
    if isinstance(bins, str):
        chosen: object = bins
    elif isinstance(bins, dict) and bins:
        unscoped = package.rpartition("/")[2]
        chosen = bins.get(unscoped, next(iter(bins.values())) if len(bins) == 1 else None)
    else:
        chosen = data.get("main")
    if not isinstance(chosen, str):
        return None
    chosen = chosen.removeprefix("./")
    return chosen if chosen and not chosen.startswith(("/", "..")) else None


def detect_npm(data: dict[str, Any]) -> Detected:
    package = str(data["name"])
    if not re.match(NPM_PACKAGE_PATTERN, package):
        raise ValidationError("package.json: name", "must be an npm package name (lowercase, an optional @scope/)",
                              package)
    name = _slug(package.rpartition("/")[2])
    binary = _npm_bin(data, package)
    todo = [
        "benchseal.toml: check [agent].args: how your CLI takes the task's instruction ({instruction}) headless",
        "benchseal.toml: check [agent.env]: the variables your CLI reads the model endpoint, name and key from",
    ]
    if binary is None:
        binary = "cli.js"
        todo.insert(0, "benchseal.toml: set [agent].bin: package.json names no bin or main (the file Node runs)")
    toml = (f'schema = "benchseal.project/v1"\n\n'
            f"# {package}: the release of tag vX.Y.Z is this npm package at X.Y.Z; the build waits for it on the\n"
            "# registry and checks the tarball against dist.integrity (docs/build.md).\n"
            "[agent]\n"
            f"name = {_toml_string(name)}\n"
            'kind = "npm"\n'
            f"package = {_toml_string(package)}\n"
            f"bin = {_toml_string(binary)}\n"
            'args = ["-p", "{instruction}"]\n'
            'version_args = ["--version"]\n'
            "publish_wait_seconds = 600\n\n"
            "[agent.env]\n"
            'OPENAI_BASE_URL = "{model_base_url}"\n'
            'OPENAI_MODEL = "{model_name}"\n'
            "# A placeholder: the worker's model relay replaces it with the real key, outside the sandbox.\n"
            'OPENAI_API_KEY = "{model_key}"\n')
    return Detected(kind="npm", name=name, package=package, version=str(data["version"]), toml=toml, todo=todo)


def detect(directory: Path, kind: str | None) -> Detected:
    """The agent package at the top of ``directory``; UsageError when there is none (or two, without ``kind``)."""
    pyproject = _read_pyproject(directory / "pyproject.toml")
    package_json = _read_json(directory / "package.json")
    if package_json is not None and not (isinstance(package_json.get("name"), str)
                                         and isinstance(package_json.get("version"), str)):
        package_json = None
    if kind == "python" or (kind is None and pyproject is not None and package_json is None):
        if pyproject is None:
            raise UsageError(f"init: no pyproject.toml with [project] name and version in {directory}")
        return detect_python(directory, pyproject)
    if kind == "npm" or (kind is None and package_json is not None and pyproject is None):
        if package_json is None:
            raise UsageError(f"init: no package.json with name and version in {directory}")
        return detect_npm(package_json)
    if pyproject is not None and package_json is not None:
        raise UsageError(f"init: {directory} holds both a Python package (pyproject.toml) and an npm package "
                         "(package.json): pass --kind python or --kind npm")
    raise UsageError(f"init: found no agent package in {directory}: looked for pyproject.toml with [project] "
                     "name and version (Python) and package.json with name and version (npm)")


def github_list(detected: Detected, repository: str | None, commit: str) -> list[str]:
    """What the user sets and asks for, one item a line (docs/github.md steps 4-7)."""
    owner_name = repository or "OWNER/NAME"
    prefix = f"ghcr.io/{owner_name.lower()}-"
    return [
        *setting_lines("adopter", owner_name),  # the names doctor checks (one home)
        f"infra policy (the infra repository's policies/infra.yaml): sources entry {owner_name} with signer builder "
        f"benchseal/benchseal/.github/workflows/release.yml@{commit} and images {prefix}runner, {prefix}api; agents "
        f"entry {{name: {detected.name}, kind: {detected.kind}, package: {detected.package}, "
        f"repositories: [{owner_name}]}} (docs/github.md step 7; `benchseal init --infra --source {owner_name}` "
        "in the infra repository writes both)",
        *detected.todo,
    ]


def init(
    directory: Annotated[Path, typer.Option("--dir", help="The top of the adopter's git checkout (default: here).")] = Path("."),
    kind: str | None = typer.Option(None, "--kind", help="python|npm, when the directory holds both packages."),
    force: bool = typer.Option(False, "--force", help="Overwrite benchseal.toml and the workflow if they exist."),
    commit: str | None = typer.Option(None, "--benchseal-commit", help="The 40-hex benchseal commit the workflow "
                                      "pins (default: the HEAD of the checkout this benchseal runs from)."),
    infra: bool = typer.Option(False, "--infra", help="In the infra repository: write its benchmark.yml caller, "
                               "policies/infra.yaml and suites/smoke instead (docs/github.md step 3)."),
    source: Annotated[list[str] | None, typer.Option("--source", help="With --infra: an adopter repository "
                      "OWNER/NAME the policy admits, with its agent (repeatable).")] = None,
    source_dir: Annotated[list[Path] | None, typer.Option("--source-dir", help="With --infra: each --source's "
                          "checkout, where its agent package is detected, in the same order.")] = None,
) -> None:
    """Write benchseal.toml and .github/workflows/benchseal.yml for this repository's agent; print what to set on GitHub."""
    if infra or source or source_dir:
        # lazy: pipeline.cli.init_infra imports this module (detect): a top-level import would be circular
        from pipeline.cli.init_infra import init_infra

        init_infra(directory, infra=infra, sources=source or [], source_dirs=source_dir or [], kind=kind, force=force,
                   commit=benchseal_commit(commit))
        return
    if kind is not None and kind not in ("python", "npm"):
        raise ValidationError("--kind", "must be python or npm", kind)
    directory = directory.resolve()
    top = _git(directory, "rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != directory:
        raise UsageError(f"init: {directory} is not the top of a git checkout (run it there, or git init first)")
    project_path, workflow_path = directory / PROJECT_FILE, directory / WORKFLOW_PATH
    existing = [str(p.relative_to(directory)) for p in (project_path, workflow_path) if p.exists() or p.is_symlink()]
    if existing and not force:
        raise UsageError(f"init: {' and '.join(existing)} already exist{'s' if len(existing) == 1 else ''} in "
                         f"{directory}: not overwritten (pass --force to replace)")
    detected = detect(directory, kind)
    pinned = benchseal_commit(commit)
    # The written file must load as every release will load it: check it before it is in place.
    staged = directory / f".{PROJECT_FILE}.init"
    try:
        staged.write_text(detected.toml, encoding="utf-8")
        load_project(staged)
    finally:
        staged.unlink(missing_ok=True)
    for path in (project_path, workflow_path):
        if path.is_symlink():
            path.unlink()  # replaced, never written through (--force only: refused above otherwise)
    workflow_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(project_path, detected.toml)
    atomic_write_text(workflow_path, CALLER_WORKFLOW.replace(PLACEHOLDER_COMMIT, pinned))
    # lazy: pipeline.local.sources loads the build (and the Docker SDK): 1.3 s at CLI start (2026-12-07)
    from pipeline.local.sources import remote_repository

    repository = remote_repository(_git(directory, "remote", "get-url", "origin"))
    typer.echo(f"wrote {PROJECT_FILE} ({detected.kind} agent {detected.name}: {detected.package} {detected.version}) "
               f"and {WORKFLOW_PATH} (benchseal pinned at {pinned})")
    typer.echo(f"To do on GitHub for {repository or 'this repository'} (Settings > Secrets and variables > Actions), "
               "and in the infra repository:")
    for item in github_list(detected, repository, pinned):
        typer.echo(f"  - {item}")
    typer.echo("Then: commit both files, tag the commit (git tag vX.Y.Z, the package's version), and rehearse with "
               "benchseal release vX.Y.Z --local (docs/github.md, Adopting benchseal).")


def register(app: typer.Typer) -> None:
    app.command(name="init")(init)
