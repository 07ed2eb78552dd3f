"""summary.json and SHA256SUMS of a run's published artifacts.

``SHA256SUMS`` is exactly what ``sha256sum -c`` reads: ``<64 hex><space><space><name>``
per line, sorted by name, covering every file in the artifacts directory except
SHA256SUMS itself and its own bundle (which signs it). Hashing is streamed.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import paths
from pipeline.contracts import DispatchPayload, Grading
from pipeline.digests import parse_ref
from pipeline.errors import CheckFailed, ValidationError
from pipeline.evidence.signing import BUNDLE_SUFFIX
from pipeline.fsutil import atomic_write_text, canonical_json, sha256_file

if TYPE_CHECKING:
    from pipeline.evidence.signing import Signer

SUMMARY_SCHEMA = "benchseal.summary/v1"
SUMMARY = "summary.json"
CHECKSUMS = "SHA256SUMS"
CHECKSUMS_BUNDLE = CHECKSUMS + BUNDLE_SUFFIX
PUBLISHER_ERROR = "publisher-error.json"
# Nested evidence (the worker's copies of Harbor trial dirs under artifacts/evidence/) is
# not published (release assets are flat); its files are listed in this top-level file,
# which SHA256SUMS covers and so signs transitively.
NESTED_SUMS = "evidence-SHA256SUMS"
EVALUATION_METHOD = "harbor-verifier-reward: a trial is resolved when its verifier reward is >= 1; score = resolved / completed"
_LINE_RE = re.compile(r"\A([0-9a-f]{64})  ([A-Za-z0-9._+-]+)\Z")
_NESTED_LINE_RE = re.compile(r"\A([0-9a-f]{64})  ([^\\\n]+)\Z")
_NAME_RE = re.compile(r"\A[A-Za-z0-9._+-]+\Z")


def suite_revision(suite: str, suites_root: Path | None = None) -> str | None:
    """``sha256:<hex>`` over the suite directory's files (relative path + content hash), or None."""
    root = (suites_root or paths.REPO_ROOT / "suites") / suite
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel = file.relative_to(root).as_posix()
        digest.update(f"{sha256_file(file)}  {rel}\n".encode())
    return f"sha256:{digest.hexdigest()}"


def build_summary(grading: Grading, payload: DispatchPayload, *, harbor_version: str | None = None,
                  suites_root: Path | None = None) -> dict[str, Any]:
    """The benchseal.summary/v1 document for a graded run."""
    runner = parse_ref(grading.runner_ref, "grading.runner_ref")
    api = parse_ref(grading.api_ref, "grading.api_ref")
    if runner.ref != payload.runner or api.ref != payload.api:
        raise CheckFailed("grading image refs differ from the dispatch payload's: the run did not use the dispatched images")
    agent_versions = sorted({t.agent_version for t in grading.trials if t.agent_version})
    harbor_versions = sorted({t.harbor_version for t in grading.trials if t.harbor_version})
    counts = grading.counts
    summary = {
        "schema": SUMMARY_SCHEMA,
        "suite": grading.suite,
        "dataset": {"name": grading.suite, "revision": suite_revision(grading.suite, suites_root)},
        "evaluation_method": EVALUATION_METHOD,
        "status": grading.status,
        "reason": grading.reason,
        "counts": counts.model_dump(mode="json"),
        "score": grading.score,
        "source": payload.source.model_dump(mode="json"),
        "images": {
            "runner": {"name": runner.name, "digest": runner.digest, "ref": runner.ref},
            "api": {"name": api.name, "digest": api.digest, "ref": api.ref},
        },
        "harbor_version": grading.harbor_version or harbor_version or (harbor_versions[0] if harbor_versions else None),
        "agent": _agent(grading, agent_versions),
        "infra_run_id": grading.run_id,
        "run_id": grading.run_id,
        "correlation_id": payload.correlation_id,
        "timings": {
            "started_at": grading.started_at,
            "finished_at": grading.finished_at,
            "trials": [
                {"task": t.task, "trial": t.trial_name, "outcome": t.outcome, "reward": t.reward,
                 "total_seconds": t.total_seconds, "agent_seconds": t.agent_seconds,
                 "verifier_seconds": t.verifier_seconds, "model_calls": t.model_calls,
                 "input_tokens": t.input_tokens, "output_tokens": t.output_tokens}
                for t in grading.trials
            ],
        },
    }
    usage = _model_usage(grading)
    if usage is not None:
        summary["model_usage"] = usage
    return summary


def _agent(grading: Grading, versions: list[str]) -> dict[str, Any]:
    agent: dict[str, Any] = {"name": grading.agent, "version": versions[0] if len(versions) == 1 else (versions or None)}
    # Model-backed agents: the policy's version pin and the model they called.
    if grading.agent_version_pin is not None:
        agent["version_pin"] = grading.agent_version_pin
    if grading.model is not None:
        agent["model"] = grading.model
    return agent


def _model_usage(grading: Grading) -> dict[str, int] | None:
    """Totals over the trials that reported model usage (None when no trial called a model)."""
    reported = [t for t in grading.trials if t.model_calls is not None]
    if not reported:
        return None
    return {"trials": len(reported), "model_calls": sum(t.model_calls or 0 for t in reported),
            "input_tokens": sum(t.input_tokens or 0 for t in reported),
            "output_tokens": sum(t.output_tokens or 0 for t in reported)}


def write_summary(artifacts: Path, summary: dict[str, Any]) -> Path:
    path = artifacts / SUMMARY
    atomic_write_text(path, canonical_json(summary))
    return path


def nested_files(artifacts: Path) -> list[Path]:
    """Regular files below the artifacts dir's subdirectories (symlinks are not followed)."""
    found = []
    for directory in sorted(p for p in artifacts.iterdir() if p.is_dir() and not p.is_symlink()):
        for root, dirs, names in os.walk(directory):
            dirs.sort()
            for name in sorted(names):
                path = Path(root) / name
                if path.is_file() and not path.is_symlink():
                    found.append(path)
    return found


def checksummed_files(artifacts: Path) -> list[Path]:
    """Every published (top-level) file that SHA256SUMS must cover (sorted by name)."""
    files = []
    for path in sorted(artifacts.iterdir(), key=lambda p: p.name):
        if path.name in (CHECKSUMS, CHECKSUMS_BUNDLE) or path.name.startswith("."):
            continue
        if path.is_dir() and not path.is_symlink():
            continue  # nested evidence: listed in NESTED_SUMS
        if not path.is_file() or path.is_symlink():
            raise CheckFailed(f"{path}: published artifacts must be regular files (no symlinks)")
        if not _NAME_RE.match(path.name):
            raise ValidationError(str(path), "artifact names must match [A-Za-z0-9._+-]+")
        files.append(path)
    return files


def render_checksums(files: list[Path]) -> str:
    return "".join(f"{sha256_file(p)}  {p.name}\n" for p in files)


def write_checksums(artifacts: Path) -> Path:
    nested = nested_files(artifacts)
    if nested:
        lines = []
        for p in nested:
            rel = p.relative_to(artifacts).as_posix()
            if "\\" in rel or "\n" in rel:
                raise CheckFailed(f"{p}: a nested evidence file name must not contain a backslash or newline")
            lines.append(f"{sha256_file(p)}  {rel}\n")
        atomic_write_text(artifacts / NESTED_SUMS, "".join(lines))
    else:
        (artifacts / NESTED_SUMS).unlink(missing_ok=True)
    path = artifacts / CHECKSUMS
    atomic_write_text(path, render_checksums(checksummed_files(artifacts)))
    return path


def parse_checksums(text: str, source: str = CHECKSUMS, *, nested: bool = False) -> dict[str, str]:
    """Strictly parse a SHA256SUMS file: name -> hex; reject anything sha256sum would not write."""
    entries: dict[str, str] = {}
    if not text.endswith("\n"):
        raise CheckFailed(f"{source}: must end with a newline")
    pattern = _NESTED_LINE_RE if nested else _LINE_RE
    for number, line in enumerate(text.splitlines(), start=1):
        match = pattern.match(line)
        if not match:
            raise CheckFailed(f"{source}: line {number} is not '<64 lowercase hex>  <name>'")
        digest, name = match.groups()
        if nested and (name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/"))):
            raise CheckFailed(f"{source}: line {number} is not a relative path inside the artifacts dir")
        if name in entries:
            raise CheckFailed(f"{source}: {name} is listed twice")
        entries[name] = digest
    return entries


def recheck_and_resign(artifacts: Path, signer: Signer) -> Path:
    """After a file was added (e.g. publisher-error.json): rewrite SHA256SUMS and re-sign it."""
    path = write_checksums(artifacts)
    signer.sign_file(path)
    return path
