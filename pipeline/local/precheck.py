"""What ``release --local`` checks of a project before anything is built: each a one-line refusal (exit 2).

A cold build takes minutes; everything these need is in the source repository and the infra policy,
so they run first, in this order:

1. the tag exists in the adopter's git checkout and names the commit being built (HEAD): a missing
   tag is reported as missing (an example is tagged by pipeline.local.sources; benchseal's own
   checkout is released under a demo tag it never carries);
2. the agent's version in the package at that commit is the tag's (``version_for_tag``): a python
   agent's static ``[project] version`` in its pyproject.toml (a dynamic one is checked on the built
   wheel, pipeline.agent.wheel), an npm agent's package.json beside the project file when it names the
   package (else only the registry has it: pipeline.agent.npm checks it at the build);
3. the repository (stated by the caller with where its name came from) is a source of the infra
   policy whose signers admit the local builder (which signs every local release's images), and the
   agent scored is admitted for it (an adopter's checkout without ``--policy``: the local world's
   policy admits it, pipeline.local.admission);
4. a python agent's import path names a module file of the package at that commit and a name that
   module defines at its top level.

The import path is checked by reading, never by importing: importing runs the adopter's code (its
package's ``__init__``, whatever it imports) on this machine, outside the sandbox every agent is
confined to, before anything is signed. So the module is located in the commit's tree (the wheel is
built from the commit, never the work tree) under the package directory, its ``src/`` or the
``[tool.setuptools] package-dir`` root, and parsed with ``ast`` (parsing executes nothing). A name
bound dynamically (a module ``__getattr__``, ``from x import *``) is accepted: the runner's import
inside the container is the final word. The model key (or ``--scripted-model``) is checked after these
by pipeline.local.model.
"""

from __future__ import annotations

import ast
import json
import os
import posixpath
import subprocess
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from pipeline.core.errors import UsageError, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.core.project import NpmAgent, ProjectFile, PythonAgent, version_for_tag
from pipeline.infra.intake.policy import InfraPolicy, ReleaseAgentPolicy
from pipeline.local.sources import LOCAL_BUILDER_SIGNER

_GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
_MAX_SOURCE = 4 * 1024 * 1024  # a module or package file larger than this is not parsed


@dataclass(frozen=True)
class _Tree:
    """The files of a project as the release builds them: a git commit of a checkout, or (a directory in no
    checkout, released as its own repository from what it holds) the directory itself."""

    root: Path  # the checkout's top, or the directory
    commit: str | None  # None: the directory's files

    def read(self, relative: str) -> bytes | None:
        relative = posixpath.normpath(relative)
        if self.commit is None:
            path = self.root / relative
            if path.is_symlink() or not path.is_file() or path.stat().st_size > _MAX_SOURCE:
                return None
            return path.read_bytes()
        done = _git(self.root, "cat-file", "blob", f"{self.commit}:{relative}")
        return done.stdout if done.returncode == 0 and len(done.stdout) <= _MAX_SOURCE else None

    def is_file(self, relative: str) -> bool:
        relative = posixpath.normpath(relative)
        if self.commit is None:
            path = self.root / relative
            return path.is_file() and not path.is_symlink()
        done = _git(self.root, "cat-file", "-t", f"{self.commit}:{relative}")
        return done.returncode == 0 and done.stdout.strip() == b"blob"


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False,
                          env={**os.environ, **_GIT_ENV}, timeout=60)


def _toplevel(directory: Path) -> Path | None:
    done = _git(directory, "rev-parse", "--show-toplevel")
    return Path(done.stdout.decode().strip()).resolve() if done.returncode == 0 and done.stdout.strip() else None


def _commit(root: Path, rev: str) -> str | None:
    done = _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    return done.stdout.decode().strip() if done.returncode == 0 else None


def check_tag(checkout: Path, tag: str) -> str:
    """The commit ``tag`` names in ``checkout``, which must be its HEAD (the commit the build takes)."""
    head = _commit(checkout, "HEAD")
    if head is None:
        raise UsageError(f"{checkout} has no commit: commit the agent, tag that commit {tag}, then release")
    tagged = _commit(checkout, f"refs/tags/{tag}")
    if tagged is None:
        raise UsageError(f"tag {tag} does not exist in {checkout}: tag the commit to release "
                         f"(git tag {tag}), then run again")
    if tagged != head:
        raise UsageError(f"tag {tag} names commit {tagged[:12]}, but HEAD of {checkout} is {head[:12]}: "
                         f"check out the tag (git checkout {tag}) or tag HEAD")
    return head


def _check_python_version(tree: _Tree, package_dir: str, expected: str, tag: str) -> dict[str, object]:
    """The package's pyproject.toml (its table), after checking a static version against the tag's."""
    where = posixpath.normpath(posixpath.join(package_dir, "pyproject.toml"))
    raw = tree.read(where)
    if raw is None:
        raise UsageError(f"{where}: not found in the release's tree (agent.path names the package's directory, "
                         "the one holding pyproject.toml)")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValidationError(where, f"must be UTF-8 TOML: {exc}") from None
    project = data.get("project")
    if not isinstance(project, dict):
        raise ValidationError(f"{where}: [project]", "is required (name and version of the agent's package)")
    dynamic = project.get("dynamic")
    version = project.get("version")
    if isinstance(dynamic, list) and "version" in dynamic:
        return data  # computed by the build backend: pipeline.agent.wheel checks the built wheel's
    if not isinstance(version, str):
        raise ValidationError(f"{where}: project.version", f"is required: {expected}, the version tag {tag} "
                              "stands for")
    try:
        same = Version(version) == Version(expected)
    except InvalidVersion:
        same = False
    if not same:
        raise ValidationError(f"{where}: project.version", f"must be {expected}, the version tag {tag} stands for "
                              "(set it, commit, and tag that commit)", version)
    return data


def _check_npm_version(tree: _Tree, project_dir: str, spec: NpmAgent, expected: str, tag: str) -> None:
    where = posixpath.normpath(posixpath.join(project_dir, "package.json"))
    raw = tree.read(where)
    if raw is None:
        return  # the package is built elsewhere: only the registry has its version (checked at the build)
    try:
        data = json.loads(raw)
    except ValueError:
        return
    if not isinstance(data, dict) or data.get("name") != spec.package:
        return  # another package's manifest (a workspace root, say): not the released one
    if data.get("version") != expected:
        raise ValidationError(f"{where}: version", f"must be {expected}, the version tag {tag} stands for "
                              "(set it, commit, publish, and tag that commit)", data.get("version"))


def _roots(package_dir: str, pyproject: dict[str, object]) -> list[str]:
    """Where a module of the package may live: the package directory, its ``src/``, and a setuptools
    ``package-dir`` root."""
    roots = [package_dir, posixpath.join(package_dir, "src")]
    tool = pyproject.get("tool")
    setuptools = tool.get("setuptools") if isinstance(tool, dict) else None
    mapping = setuptools.get("package-dir") if isinstance(setuptools, dict) else None
    if isinstance(mapping, dict) and isinstance(mapping.get(""), str):
        roots.insert(0, posixpath.join(package_dir, mapping[""]))
    return [posixpath.normpath(r) for r in roots if not posixpath.normpath(r).startswith("..")]


def _defines(body: Iterable[ast.stmt], name: str) -> bool:
    """Whether module-level statements bind ``name`` (or may, dynamically)."""
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in (name, "__getattr__"):
                return True
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)):
                    return True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound = alias.asname or alias.name.partition(".")[0]
                if alias.name == "*" or bound == name:
                    return True
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.AsyncWith)):
            parts: list[ast.stmt] = [*node.body]
            if isinstance(node, ast.If):
                parts += node.orelse
            if isinstance(node, ast.Try):
                parts += node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
            if _defines(parts, name):
                return True
    return False


def _check_import_path(tree: _Tree, package_dir: str, spec: PythonAgent, pyproject: dict[str, object],
                       field: str) -> None:
    module, _, attribute = spec.import_path.partition(":")
    relative = module.replace(".", "/")
    roots = _roots(package_dir, pyproject)
    candidates = [posixpath.join(root, relative + suffix) for root in roots for suffix in (".py", "/__init__.py")]
    found = next((c for c in candidates if tree.is_file(c)), None)
    if found is None:
        looked = ", ".join(dict.fromkeys(f"{r}/{relative}.py" for r in roots))
        raise ValidationError(field, f"module {module} is not in the release's tree (looked for {looked} and "
                              "its package __init__.py)", spec.import_path)
    source = tree.read(found)
    if source is None:
        raise ValidationError(field, f"{found} cannot be read (larger than {_MAX_SOURCE} bytes?)", spec.import_path)
    try:
        parsed = ast.parse(source, filename=found)
    except (SyntaxError, ValueError, RecursionError) as exc:
        line = getattr(exc, "lineno", None)
        raise ValidationError(field, f"{found} does not parse as Python" + (f" (line {line})" if line else ""),
                              spec.import_path) from None
    if not _defines(parsed.body, attribute):
        raise ValidationError(field, f"{found} defines no {attribute} at its top level", spec.import_path)


def check_project(project: Path, project_file: ProjectFile, tag: str, *, adopter_checkout: Path | None) -> str | None:
    """Checks 1, 2 and 4 of the module's list for ``project`` (a benchseal.toml) at ``tag``; the commit checked
    (None: a directory in no checkout).

    ``adopter_checkout``: the top of the adopter's own git checkout holding ``project`` (released as it
    is: its tag must exist and name HEAD), or None for an example (benchseal's checkout at HEAD, or a
    directory in no checkout, released from what it holds: pipeline.local.sources tags it)."""
    expected = version_for_tag(tag)
    project = project.resolve()
    if adopter_checkout is not None:
        tree = _Tree(adopter_checkout, check_tag(adopter_checkout, tag))
    else:
        top = _toplevel(project.parent)
        tree = _Tree(top, _commit(top, "HEAD")) if top == REPO_ROOT.resolve() else _Tree(project.parent, None)
    project_dir = project.parent.relative_to(tree.root).as_posix() if project.parent != tree.root else "."
    spec = project_file.agent
    if isinstance(spec, NpmAgent):
        _check_npm_version(tree, project_dir, spec, expected, tag)
        return tree.commit
    package_dir = posixpath.normpath(posixpath.join(project_dir, spec.path))
    pyproject = _check_python_version(tree, package_dir, expected, tag)
    _check_import_path(tree, package_dir, spec, pyproject, f"{project.name}: agent.import_path")
    return tree.commit


def python_distribution(checkout: Path, commit: str, package_dir: str) -> str:
    """``[project] name`` of the pyproject.toml in ``package_dir`` at ``commit`` (``check_project`` has checked it is
    there): the distribution the wheel built from that commit is named by."""
    raw = _Tree(checkout, commit).read(posixpath.join(package_dir, "pyproject.toml"))
    try:
        project = tomllib.loads(raw.decode("utf-8")).get("project") if raw is not None else None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        project = None
    name = project.get("name") if isinstance(project, dict) else None
    if not isinstance(name, str) or not name:
        where = posixpath.normpath(posixpath.join(package_dir, "pyproject.toml"))
        raise ValidationError(f"{where}: project.name", "is required (the agent's distribution name)")
    return name


def check_admitted(policy: InfraPolicy, repository: str, origin: str, agent: str, suite: str, field: str,
                   policy_file: str = "the infra policy") -> None:
    """Check 3: ``repository`` is a source of ``policy`` (read from ``policy_file``) and ``agent`` is admitted for
    it. An adopter's checkout released without ``--policy`` is admitted by pipeline.local.admission first; this
    refuses what an explicit ``--policy`` (or benchseal's own examples) does not list."""
    try:
        policy.source(repository)
    except ValidationError:
        raise UsageError(f"repository {repository} (from {origin}) is not a source of {policy_file}: add it under "
                         "sources there, or name another with --repository") from None
    signers = policy.source(repository).signer
    if not any(s.builder == LOCAL_BUILDER_SIGNER and s.ref == "tag" for s in signers):
        # The worker would refuse the images as signed by no admitted identity, after a build of minutes.
        listed = ", ".join(s.builder or f"{s.workflow}@{s.ref}" for s in signers)
        raise UsageError(f"repository {repository}'s sources entry in {policy_file} admits images signed by {listed} "
                         f"only; release --local signs them as {LOCAL_BUILDER_SIGNER} at the tag: add that builder "
                         "to its signer list")
    entry, _ = policy.agent(agent, suite, field=field)
    if isinstance(entry, ReleaseAgentPolicy) and not entry.admits(repository):
        raise UsageError(f"agent {agent} is admitted by the infra policy for {', '.join(entry.repositories)}, "
                         f"not {repository} (from {origin}): add it to that agent's repositories")
