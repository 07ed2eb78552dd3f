"""``benchseal init --infra``: an infra repository's files, so a team copies nothing by hand.

Run at the top of the infra repository's git checkout. It writes the caller of benchseal's reusable
``benchmark.yml`` (examples/bench-infra's, pinned to benchseal's 40-hex commit), ``policies/infra.yaml``
(examples/bench-infra's, its signer pinned to the same commit) and ``suites/smoke`` (benchseal's own,
the digest the policy pins). With ``--source OWNER/NAME --source-dir CHECKOUT`` (repeatable) the policy's
``sources`` and ``agents`` list each adopter and the agent ``init`` detects in its checkout, in place of the
example's acme/widget; without, the example's entry stays for the user to replace (printed). The policy is
loaded with the worker's own ``load_policy`` before anything is written. Nothing is overwritten without
``--force``. Exit codes: 2 bad input or a file already there.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import typer

from pipeline.cli.init import PLACEHOLDER_COMMIT, Detected, _git, detect
from pipeline.core.contracts import canonical_repository, validate_repository
from pipeline.core.doctor import setting_lines
from pipeline.core.errors import UsageError, ValidationError
from pipeline.core.fsutil import atomic_write_text
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.policy import load_policy

EXAMPLE = REPO_ROOT / "examples" / "bench-infra"
CALLER_PATH = ".github/workflows/benchmark.yml"
POLICY_PATH = "policies/infra.yaml"
SUITE_PATH = "suites/smoke"
# The example policy's one adopter, replaced by the --source entries (a test keeps the example holding them).
_EXAMPLE_SOURCE = """\
  - repository: acme/widget
    signer:
      builder: benchseal/benchseal/.github/workflows/release.yml@BENCHSEAL_COMMIT
    images:
      runner:
        - registry: ghcr.io
          repository: acme/widget-runner
      api:
        - registry: ghcr.io
          repository: acme/widget-api
"""
_EXAMPLE_AGENT = """\
  - name: hello-agent
    kind: python
    package: hello-agent
    repositories: [acme/widget]
    model: true
"""


def _source_entry(repository: str) -> str:
    image = repository.lower()
    return (f"  - repository: {repository}\n"
            "    signer:\n"
            f"      builder: benchseal/benchseal/.github/workflows/release.yml@{PLACEHOLDER_COMMIT}\n"
            "    images:\n"
            "      runner:\n"
            "        - registry: ghcr.io\n"
            f"          repository: {image}-runner\n"
            "      api:\n"
            "        - registry: ghcr.io\n"
            f"          repository: {image}-api\n")


def _agent_entry(agent: Detected, repository: str) -> str:
    return (f"  - name: {agent.name}\n"
            f"    kind: {agent.kind}\n"
            f"    package: \"{agent.package}\"\n"
            f"    repositories: [{repository}]\n"
            "    model: true\n")


def render_policy(commit: str, adopters: list[tuple[str, Detected]]) -> str:
    """The example policy, its signer pinned at ``commit``, with ``adopters`` in place of acme/widget."""
    text = (EXAMPLE / POLICY_PATH).read_text(encoding="utf-8")
    if adopters:
        if _EXAMPLE_SOURCE not in text or _EXAMPLE_AGENT not in text:  # pragma: no cover - a test keeps them
            raise UsageError("init --infra: examples/bench-infra/policies/infra.yaml no longer holds acme/widget's "
                             "entries this command replaces")
        text = text.replace(_EXAMPLE_SOURCE, "".join(_source_entry(r) for r, _ in adopters))
        text = text.replace(_EXAMPLE_AGENT, "".join(_agent_entry(a, r) for r, a in adopters))
    return text.replace(PLACEHOLDER_COMMIT, commit)


def init_infra(directory: Path, *, infra: bool, sources: list[str], source_dirs: list[Path], kind: str | None,
               force: bool, commit: str) -> None:
    if not infra:
        raise UsageError("init: --source and --source-dir are for the infra repository: pass --infra")
    if len(sources) != len(source_dirs):
        raise ValidationError("--source-dir", f"one per --source ({len(sources)} --source, {len(source_dirs)} "
                              "--source-dir)", str(len(source_dirs)))
    if kind is not None:
        raise UsageError("init --infra: --kind is detected in each --source-dir, not given")
    seen: set[str] = set()
    for repository in sources:
        validate_repository(repository, "--source")
        if canonical_repository(repository) in seen:
            raise ValidationError("--source", "is given twice", repository)
        seen.add(canonical_repository(repository))
    directory = directory.resolve()
    top = _git(directory, "rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != directory:
        raise UsageError(f"init: {directory} is not the top of a git checkout (run it there, or git init first)")
    targets = [directory / CALLER_PATH, directory / POLICY_PATH, directory / SUITE_PATH]
    existing = [str(p.relative_to(directory)) for p in targets if p.exists() or p.is_symlink()]
    if existing and not force:
        raise UsageError(f"init --infra: {' and '.join(existing)} already exist in {directory}: not overwritten "
                         "(pass --force to replace)")
    adopters = [(repository, detect(path.resolve(), None)) for repository, path in zip(sources, source_dirs, strict=True)]
    policy = render_policy(commit, adopters)
    # The policy must load as the worker loads it, its suite's dataset the bytes it pins: checked before writing.
    with tempfile.TemporaryDirectory(prefix=".benchseal-init-", dir=directory) as scratch:
        staged = Path(scratch) / "infra.yaml"
        staged.write_text(policy, encoding="utf-8")
        load_policy(staged)
    for path in targets:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
    for path in targets[:2]:
        path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(targets[0], (EXAMPLE / CALLER_PATH).read_text(encoding="utf-8").replace(PLACEHOLDER_COMMIT, commit))
    atomic_write_text(targets[1], policy)
    shutil.copytree(REPO_ROOT / SUITE_PATH, targets[2], symlinks=False)
    typer.echo(f"wrote {CALLER_PATH}, {POLICY_PATH} and {SUITE_PATH} (benchseal pinned at {commit})")
    for repository, agent in adopters:
        typer.echo(f"  the policy admits {repository}: images ghcr.io/{repository.lower()}-runner and -api, agent "
                   f"{agent.name} ({agent.kind} {agent.package})")
    typer.echo("To do on GitHub for this repository (Settings > Secrets and variables > Actions):")
    for line in setting_lines("infra", "OWNER/NAME"):
        typer.echo(f"  - {line}")
    if not adopters:
        typer.echo("  - policies/infra.yaml: replace the example adopter acme/widget and its agent hello-agent with "
                   "yours (or run again with --source OWNER/NAME --source-dir CHECKOUT --force)")
    typer.echo("  - the model endpoint: suites.smoke.model in policies/infra.yaml (e.g. https://api.openai.com/v1)")
    typer.echo("Then: commit and push; on the infra host, install this commit's policy and suites (docs/host.md, "
               "One home for the policy).")
