"""The release directory: every file name, and the SHA256SUMS format that binds them.

The one home of the layout. Evidence writes it, publish uploads it, verify checks it; all
three import these names, none defines its own. A run's ``artifacts/`` directory and a
published release hold the same top-level files (a release is flat: nested evidence stays
in the run directory, listed in ``evidence-SHA256SUMS``).

``SHA256SUMS`` is exactly what ``sha256sum -c`` reads: ``<64 hex><space><space><name>`` per
line, sorted by name, covering every top-level file except SHA256SUMS itself and its own
bundle (which signs it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.fsutil import name_problem

ARTIFACTS_DIR = "artifacts"  # inside a run directory
SUMMARY = "summary.json"
CHECKSUMS = "SHA256SUMS"
# Nested evidence (the worker's copies of Harbor trial dirs under artifacts/evidence/) is not
# published (release assets are flat); its files are listed in this top-level file, which
# SHA256SUMS covers and so signs transitively.
NESTED_SUMS = "evidence-SHA256SUMS"
# Every file NESTED_SUMS lists, as one deterministic tar.gz (pipeline.core.evidence_archive): a release
# is flat, so this asset carries the logs behind the score; SHA256SUMS lists (and so signs) it.
EVIDENCE_ARCHIVE = "evidence-logs.tar.gz"
# A release signed by a private Sigstore instance carries its trust material, one file per tool's form
# (pipeline.evidence.trust): the trusted root as JSON (cosign, benchseal), as JSON Lines (gh's
# --custom-trusted-root) and as a ClientTrustConfig (sigstore-python's --trust-config). Public-good
# releases carry none.
TRUSTED_ROOT = "trusted_root.json"
TRUSTED_ROOT_LINES = "trusted_root.jsonl"
CLIENT_TRUST_CONFIG = "client_trust_config.json"
TRUST_FILES = (TRUSTED_ROOT, TRUSTED_ROOT_LINES, CLIENT_TRUST_CONFIG)
# The plan and every trial's result.json, byte for byte (a release is flat): verify re-grades them.
TRIAL_RESULTS = "trial-results.json"
PUBLISHER_ERROR = "publisher-error.json"
BODY = "body.md"  # the release notes of a local release: the only file outside SHA256SUMS
NOT_ASSETS = frozenset({BODY})
BUNDLE_SUFFIX = ".sigstore.json"
# Files whose bundle must be a DSSE attestation (an in-toto statement); every other file's
# bundle is a plain message signature.
STATEMENT_SUFFIX = ".intoto.json"
SBOMS = {"runner": "sbom-runner.cdx.json", "api": "sbom-api.cdx.json"}
MANIFESTS = {"runner": "manifest-runner.oci.json", "api": "manifest-api.oci.json"}
PROVENANCE_IMAGES = "provenance-images.intoto.json"
PROVENANCE_SUMMARY = "provenance-summary.intoto.json"
# The run's result as in-toto's test-result v0.1 attestation (subjects: the runner image and summary.json);
# its DSSE bundle is also attached to the runner image in the registry (pipeline.attest.testresult).
TEST_RESULT = "test-result.intoto.json"
# The score, its interval and per-task pass rates for the charting tools (pipeline.evidence.exports):
# Bencher Metric Format and github-action-benchmark's custom JSON. Only a scored run has them; SHA256SUMS
# signs them (no bundle of their own).
BENCHER_EXPORT = "bencher.bmf.json"
ACTION_BENCHMARK_EXPORT = "github-action-benchmark.json"
# Every release carries these, each with its bundle.
REQUIRED_SIGNED = (SUMMARY, SBOMS["runner"], SBOMS["api"], PROVENANCE_IMAGES, PROVENANCE_SUMMARY, TEST_RESULT,
                   CHECKSUMS)

_LINE_RE = re.compile(r"\A([0-9a-f]{64})  ([A-Za-z0-9._+-]+)\Z")
# A nested name is whatever follows the two spaces; fsutil.name_problem then judges it.
_NESTED_LINE_RE = re.compile(r"\A([0-9a-f]{64})  (.+)\Z", re.DOTALL)
NAME_RE = re.compile(r"\A[A-Za-z0-9._+-]+\Z")


def bundle_name(name: str) -> str:
    """The Sigstore bundle of the file ``name``."""
    return name + BUNDLE_SUFFIX


def bundle_path(path: Path) -> Path:
    return path.with_name(bundle_name(path.name))


CHECKSUMS_BUNDLE = bundle_name(CHECKSUMS)


def is_statement(name: str) -> bool:
    return name.endswith(STATEMENT_SUFFIX)


def nested_files(artifacts: Path) -> list[Path]:
    """Regular files below the artifacts dir's subdirectories (symlinks are not followed). Every
    one's name (relative to ``artifacts``) must be plain (fsutil.name_problem): a name that could not
    be written into evidence-SHA256SUMS and read back the same is refused, on both sides."""
    found = []
    for directory in sorted(p for p in artifacts.iterdir() if p.is_dir() and not p.is_symlink()):
        for root, dirs, names in os.walk(directory):
            dirs.sort()
            for name in sorted(names):
                path = Path(root) / name
                if path.is_file() and not path.is_symlink():
                    relative = path.relative_to(artifacts).as_posix()
                    problem = name_problem(relative)
                    if problem:
                        raise CheckFailed(f"{relative!r}: {problem}; evidence names must be plain relative names")
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
        if not NAME_RE.match(path.name):
            raise ValidationError(str(path), "artifact names must match [A-Za-z0-9._+-]+")
        files.append(path)
    return files


def parse_checksums(text: str | bytes, source: str = CHECKSUMS, *, nested: bool = False) -> dict[str, str]:
    """Strictly parse a SHA256SUMS file (its bytes, or text): name -> hex; reject anything sha256sum
    would not write and, in a nested listing, any name fsutil.name_problem refuses."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CheckFailed(f"{source}: not UTF-8 (byte {exc.start})") from None
    entries: dict[str, str] = {}
    if not text.endswith("\n"):
        raise CheckFailed(f"{source}: must end with a newline")
    pattern = _NESTED_LINE_RE if nested else _LINE_RE
    # Lines end at LF only (str.splitlines would also break at CR, U+2028, U+0085, ...).
    for number, line in enumerate(text[:-1].split("\n"), start=1):
        match = pattern.match(line)
        if not match:
            raise CheckFailed(f"{source}: line {number} is not '<64 lowercase hex>  <name>'")
        digest, name = match.groups()
        # Top-level names match the regex and still pass the rule ('.' and '..' do not).
        problem = name_problem(name)
        if problem:
            raise CheckFailed(f"{source}: line {number}: the name {problem}")
        if name in entries:
            raise CheckFailed(f"{source}: {name} is listed twice")
        entries[name] = digest
    return entries


def render_checksums(entries: list[tuple[str, str]]) -> str:
    """``(hex, name)`` pairs as sha256sum lines; every name (nested relative paths too) must pass
    fsutil.name_problem, the rule parse_checksums reads them back with."""
    lines = []
    for digest, name in entries:
        problem = name_problem(name)
        if problem:
            raise CheckFailed(f"{name!r}: a checksummed file name {problem}")
        lines.append(f"{digest}  {name}\n")
    return "".join(lines)
