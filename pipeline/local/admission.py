"""The local world's infra policy for an adopter's own repository (issue 38.2): nothing to copy or write.

``benchseal release TAG --local`` in an adopter's checkout, without ``--policy``, benchmarks the repository
the way the local chain's infra repository would once it admitted it: the embedded policy
(``$BENCHSEAL_INFRA_POLICY``, else policies/infra.yaml) plus what admitting one repository takes there:

* a ``sources`` entry for the repository (when the policy lists none): its images are the release's
  runner and api names, signed by the local builder's release.yml (the signer every local source has);
* an ``agents`` entry for the agent its ``benchseal.toml`` declares (name, kind, package, repositories:
  [the repository]; a Python agent's package is the ``[project] name`` of its pyproject.toml at the
  release commit, as the wheel's metadata names it); ``model: true`` for a Python agent (a Harbor agent
  class gets the suite's model) and for an npm agent whose args or env use a ``{model_*}`` placeholder.
  An entry of that name for the same kind and package gets the repository added; one for anything else
  is refused (rename the agent), never replaced.

The result is validated as any policy is (``InfraPolicy``), stated on the terminal (what was added and from
where) and written to the release's state directory, with its sha256 in the release report: the run is
accepted, graded, sealed and published under exactly that document. Production admission
(pipeline.infra.intake.policy) is untouched: this module only ever adds one repository's entries, and only
in the local world (which production never imports). ``--policy FILE`` is taken as it is (the adopter
rehearses its own infra's policy): nothing is added.
"""

from __future__ import annotations

import copy
import hashlib
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.contracts import canonical_repository, load_model
from pipeline.core.errors import UsageError
from pipeline.core.fsutil import atomic_write_text
from pipeline.core.project import PLACEHOLDERS, NpmAgent, ProjectFile
from pipeline.core.yamlfile import load_yaml
from pipeline.imaging.names import ImageNames
from pipeline.infra.intake.policy import POLICY_PATH, InfraPolicy, ReleaseAgentPolicy
from pipeline.local.precheck import python_distribution
from pipeline.local.sources import LOCAL_BUILDER_SIGNER

POLICY_FILE = "infra-policy.yaml"  # in the release's state directory
_MODEL_PLACEHOLDERS = tuple("{" + p + "}" for p in sorted(PLACEHOLDERS) if p.startswith("model_"))


@dataclass(frozen=True)
class LocalAdmission:
    """The policy a local release of an adopter's repository runs under, and what was added to the base."""

    policy: InfraPolicy
    base: Path  # the embedded policy it extends
    added: tuple[str, ...]  # one line each; empty: the base already admitted the repository and its agent
    document: str  # the policy as YAML

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.document.encode("utf-8")).hexdigest()

    def write(self, directory: Path) -> Path:
        """Write the document (``POLICY_FILE``) into ``directory``: where the run's report points."""
        path = directory / POLICY_FILE
        atomic_write_text(path, self.document)
        return path

    def to_json_dict(self, path: Path | None) -> dict[str, Any]:
        return {"base": str(self.base), "added": list(self.added), "sha256": self.sha256,
                "path": str(path) if path is not None else None}


def base_policy_path() -> Path:
    """The embedded policy ``load_policy()`` reads without a path (it has checked the variable)."""
    configured = os.environ.get("BENCHSEAL_INFRA_POLICY")
    return Path(configured) if configured else POLICY_PATH


def _model_backed(project: ProjectFile) -> bool:
    spec = project.agent
    if not isinstance(spec, NpmAgent):
        return True  # a Harbor agent class is given the suite's model; whether it calls it is not readable
    texts = [*spec.args, *spec.env.values()]
    return any(p in text for text in texts for p in _MODEL_PLACEHOLDERS)


def admit_adopter(repository: str, origin: str, project: Path, project_file: ProjectFile, checkout: Path,
                  commit: str, names: ImageNames) -> LocalAdmission:
    """The embedded policy with ``repository`` (named from ``origin``) and its ``benchseal.toml``'s agent admitted.

    ``checkout``/``commit``: the adopter's checkout and the release commit (a Python agent's package name is
    read from it, as the wheel is built from it)."""
    base = base_policy_path()
    data = copy.deepcopy(load_yaml(base, what="policy", max_bytes=65536))
    if not isinstance(data, dict) or not isinstance(data.get("sources"), list) or \
            not isinstance(data.get("agents"), list):
        raise UsageError(f"the embedded infra policy {base} has no sources and agents lists to admit {repository} in")
    added: list[str] = []
    canonical = canonical_repository(repository)
    if not any(isinstance(s, dict) and isinstance(s.get("repository"), str)
               and canonical_repository(s["repository"]) == canonical for s in data["sources"]):
        builder = LOCAL_BUILDER_SIGNER
        images = {role: [{"registry": names.registry, "repository": names.repository(role)}] for role in ("runner", "api")}
        data["sources"].append({"repository": repository, "signer": {"builder": builder}, "images": images})
        added.append(f"sources: {repository} (from {origin}), images {names.name('runner')} and {names.name('api')} "
                     f"signed by {builder}")
    spec = project_file.agent
    if isinstance(spec, NpmAgent):
        package = spec.package
    else:
        package_dir = posixpath.normpath(posixpath.join(_relative(project.parent, checkout), spec.path))
        package = python_distribution(checkout, commit, package_dir)
    model = _model_backed(project_file)
    entry = next((a for a in data["agents"] if (a if isinstance(a, str) else
                                                (a.get("name") if isinstance(a, dict) else None)) == spec.name), None)
    where = f"{project.name}'s agent"
    if entry is None:
        data["agents"].append({"name": spec.name, "kind": spec.kind, "package": package, "repositories": [repository],
                               "model": model})
        added.append(f"agents: {spec.name} ({spec.kind} package {package}, from {where}) for {repository}"
                     + (", model-backed" if model else ""))
    else:
        same = isinstance(entry, dict) and entry.get("kind") == spec.kind and entry.get("package") == package
        if not same:
            raise UsageError(f"{project.name}: agent.name {spec.name} is the infra policy's name for another agent "
                             f"({base}): give your agent a name of its own")
        listed = entry.get("repositories")
        if not isinstance(listed, list):
            raise UsageError(f"the embedded infra policy {base}: agents entry {spec.name} has no repositories list")
        if canonical not in {canonical_repository(r) for r in listed if isinstance(r, str)}:
            listed.append(repository)
            added.append(f"agents: {spec.name} ({spec.kind} package {package}) also for {repository} (from {origin})")
    policy = load_model(InfraPolicy, data, f"the local infra policy ({base} with {repository} admitted)")
    agent, _ = policy.agent(spec.name, next(iter(policy.suites)))
    if not isinstance(agent, ReleaseAgentPolicy) or not agent.admits(repository):  # what was added must admit it
        raise UsageError(f"the local infra policy does not admit {spec.name} for {repository}")
    header = (f"# The local world's infra policy for {repository}: {base} with what admitting it takes\n"
              + "".join(f"#   added {line}\n" for line in added)
              + "# (pipeline/local/admission.py; release --local --policy FILE runs under FILE instead)\n")
    return LocalAdmission(policy=policy, base=base, added=tuple(added),
                          document=header + yaml.safe_dump(data, sort_keys=False, width=120))


def _relative(directory: Path, checkout: Path) -> str:
    directory, checkout = directory.resolve(), checkout.resolve()
    return directory.relative_to(checkout).as_posix() if directory != checkout else "."

