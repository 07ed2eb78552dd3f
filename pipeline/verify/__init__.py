"""``benchseal verify``: check a release directory the way a consumer must.

The consumer states what they expect (``Expectation``: source repository and tag, and
from the policy the signer identity and issuer); nothing of it is read from the release.

1. SHA256SUMS is signed by the expected identity/issuer, and every file in the
   directory is listed in it with the right hash (``body.md``, the release notes,
   is the only file allowed outside it);
2. every ``<file>.sigstore.json`` bundle verifies for ``<file>`` against the
   expected identity and issuer: a DSSE envelope for the in-toto statements
   (``*.intoto.json``; the payload must be the exact bytes of ``<file>``), a message
   signature for every other file;
3. summary.json names the expected repository and tag, is internally consistent
   (counts, status, score) and its image references are digest-pinned
   (pipeline.digests) and exactly the provenance subjects; both statements name the
   same source repository, tag and commit as summary.json; the summary provenance
   binds summary.json and those digests, and each SBOM describes the image by that digest.

The first failure raises CheckFailed naming it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.digests import parse_ref
from pipeline.errors import CheckFailed, Error, ValidationError
from pipeline.verify.policy import Expectation, expectation

__all__ = ["REQUIRED_SIGNED", "VerifiedRelease", "check_summary", "select_profile", "verify_release"]

SUMMARY = "summary.json"
CHECKSUMS = "SHA256SUMS"
BUNDLE_SUFFIX = ".sigstore.json"
NOT_ASSETS = frozenset({"body.md"})
REQUIRED_SIGNED = (
    SUMMARY,
    "sbom-runner.cdx.json",
    "sbom-api.cdx.json",
    "provenance-images.intoto.json",
    "provenance-summary.intoto.json",
    CHECKSUMS,
)
# Files whose bundle must be a DSSE attestation (an in-toto statement); every other file's
# bundle must be a plain message signature.
STATEMENT_SUFFIX = ".intoto.json"
SUMMARY_SCHEMA = "benchseal.summary/v1"
INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
STATUSES = ("SUCCEEDED", "FAILED", "INFRA_ERROR")
COUNT_KEYS = ("total", "completed", "resolved", "unresolved", "infra_errors")
# The grader stores score = round(resolved / completed, SCORE_DIGITS) (pipeline.infra.grading).
SCORE_DIGITS = 6
_COMMIT_RE = re.compile(r"\A[0-9a-f]{40}\Z")


@dataclass(frozen=True)
class VerifiedRelease:
    """What was verified: the signer and the source the release is bound to."""

    directory: Path
    profile: str
    identity: str
    issuer: str
    repository: str
    tag: str
    commit: str
    bundles: tuple[str, ...]

    def to_json_dict(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "profile": self.profile, "identity": self.identity,
                "issuer": self.issuer, "repository": self.repository, "tag": self.tag, "commit": self.commit,
                "bundles": list(self.bundles)}


def select_profile(profile: str | None, trusted_root: Path | None) -> str:
    return profile or ("local" if trusted_root is not None else "production")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            # Readers disagree on which duplicate wins: refuse instead of picking one.
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _read_json(path: Path) -> Any:
    """Strict JSON: no duplicate keys, no NaN/Infinity (Python's json accepts both)."""
    try:
        return json.loads(path.read_bytes(), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except FileNotFoundError:
        raise CheckFailed(f"{path.name}: missing") from None
    except (ValueError, RecursionError) as exc:
        raise CheckFailed(f"{path.name}: not valid JSON ({exc})") from None


def load_summary(directory: Path) -> dict[str, Any]:
    summary = _read_json(directory / SUMMARY)
    if not isinstance(summary, dict) or summary.get("schema") != SUMMARY_SCHEMA:
        raise CheckFailed(f"{SUMMARY}: schema must be {SUMMARY_SCHEMA!r}")
    return summary


def _verifier(trusted_root: Path | None, offline: bool) -> Any:
    from sigstore.models import TrustedRoot
    from sigstore.verify import Verifier

    if trusted_root is not None:
        try:
            return Verifier(trusted_root=TrustedRoot.from_file(str(trusted_root)))
        except FileNotFoundError:
            raise ValidationError("--trusted-root", "file does not exist", str(trusted_root)) from None
        except Exception as exc:
            raise ValidationError("--trusted-root", f"is not a Sigstore trusted root: {exc}", str(trusted_root)) from None
    try:
        return Verifier.production(offline=offline)
    except Exception as exc:
        raise CheckFailed(f"cannot load the public-good trusted root (try --offline or --trusted-root): {exc}") from None


def verify_bundle(verifier: Any, target: Path, bundle_file: Path, expect: Expectation) -> None:
    """Verify one bundle for one file; raise CheckFailed naming the bundle.

    The kind of bundle is decided by the file, not by the bundle: an in-toto statement
    (``*.intoto.json``) must be signed as a DSSE attestation, anything else as a message
    signature over the file's digest.
    """
    from sigstore.errors import Error as SigstoreError
    from sigstore.hashes import Hashed
    from sigstore.models import Bundle
    from sigstore.verify import policy
    from sigstore_models.common.v1 import HashAlgorithm

    from pipeline.fsutil import sha256_file

    name = bundle_file.name
    if not target.is_file():
        raise CheckFailed(f"{name}: the file it signs ({target.name}) is missing")
    try:
        raw = bundle_file.read_bytes()
        bundle = Bundle.from_json(raw)
    except FileNotFoundError:
        raise CheckFailed(f"{name}: missing") from None
    except Exception as exc:
        raise CheckFailed(f"{name}: not a valid Sigstore bundle: {exc}") from None
    is_dsse = bundle._dsse_envelope is not None
    dsse_expected = target.name.endswith(STATEMENT_SUFFIX)
    if dsse_expected and not is_dsse:
        raise CheckFailed(f"{name}: must be a DSSE attestation of the in-toto statement {target.name}; "
                          "a plain message signature over the statement file is refused")
    if is_dsse and not dsse_expected:
        raise CheckFailed(f"{name}: is a DSSE envelope, but {target.name} is not an in-toto statement: "
                          "it must be signed as a message signature over the file")
    identity = policy.Identity(identity=expect.identity, issuer=expect.issuer)
    try:
        if is_dsse:
            payload_type, payload = verifier.verify_dsse(bundle, identity)
            if payload_type != INTOTO_PAYLOAD_TYPE:
                raise CheckFailed(f"{name}: DSSE payload type is {payload_type!r}, not {INTOTO_PAYLOAD_TYPE!r}")
            if payload != target.read_bytes():
                raise CheckFailed(f"{name}: the signed statement differs from {target.name}")
        else:
            digest = Hashed(algorithm=HashAlgorithm.SHA2_256, digest=bytes.fromhex(sha256_file(target)))
            verifier.verify_artifact(digest, bundle, identity)
    except CheckFailed:
        raise
    except (SigstoreError, ValueError) as exc:
        raise CheckFailed(f"{name}: signature does not verify for {target.name} as {expect.identity} "
                          f"(issuer {expect.issuer}): {exc}") from None


def verify_checksums(directory: Path) -> dict[str, str]:
    from pipeline.evidence.artifacts import CHECKSUMS_BUNDLE, NESTED_SUMS, nested_files, parse_checksums
    from pipeline.fsutil import sha256_file

    entries = parse_checksums((directory / CHECKSUMS).read_text("utf-8"))
    for name, expected in entries.items():
        path = directory / name
        if "/" in name or not path.is_file():
            raise CheckFailed(f"{CHECKSUMS}: lists {name}, which is missing")
        if sha256_file(path) != expected:
            raise CheckFailed(f"{name}: sha256 does not match SHA256SUMS")
    subdirs = [p for p in directory.iterdir() if p.is_dir() and not p.is_symlink()]
    for path in sorted(directory.iterdir()):
        if path.name in entries or path.name in (CHECKSUMS, CHECKSUMS_BUNDLE) or path.name in NOT_ASSETS:
            continue
        if path in subdirs and NESTED_SUMS in entries:
            continue  # checked below
        raise CheckFailed(f"{path.name}: not covered by SHA256SUMS")
    if subdirs and NESTED_SUMS in entries:
        # Nested evidence is present only in a run dir (releases are flat): check it all.
        nested = parse_checksums((directory / NESTED_SUMS).read_text("utf-8"), NESTED_SUMS, nested=True)
        for name, expected in nested.items():
            path = directory / name
            if not path.is_file() or path.is_symlink() or sha256_file(path) != expected:
                raise CheckFailed(f"{name}: missing or does not match {NESTED_SUMS}")
        for path in nested_files(directory):
            if path.relative_to(directory).as_posix() not in nested:
                raise CheckFailed(f"{path.relative_to(directory).as_posix()}: not covered by {NESTED_SUMS}")
    return entries


def _subjects(statement: dict[str, Any], name: str) -> set[tuple[str, str]]:
    subjects = statement.get("subject")
    if not isinstance(subjects, list):
        raise CheckFailed(f"{name}: statement has no subject list")
    out = set()
    for s in subjects:
        digest = _mapping(s.get("digest")).get("sha256") if isinstance(s, dict) else None
        if not isinstance(digest, str):
            raise CheckFailed(f"{name}: a subject has no sha256 digest")
        out.add((str(s.get("name")), f"sha256:{digest}"))
    return out


def _count(counts: dict[str, Any], key: str) -> int:
    value = counts.get(key)
    # bool is an int in Python; JSON true is not a count.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckFailed(f"{SUMMARY}: counts.{key} must be a non-negative integer (got {value!r})")
    return value


def check_summary(summary: dict[str, Any]) -> None:
    """summary.json must be internally consistent; raise CheckFailed naming the field and rule.

    * counts has exactly total, completed, resolved, unresolved, infra_errors, each a
      non-negative integer; resolved + unresolved <= completed and
      completed + infra_errors <= total (every trial has one outcome);
    * status is SUCCEEDED, FAILED or INFRA_ERROR;
    * score is present; null unless SUCCEEDED; on SUCCEEDED completed > 0 and score is a
      finite number equal to round(resolved / completed, 6) (the grader's stored precision).
    """
    counts = summary.get("counts")
    if not isinstance(counts, dict):
        raise CheckFailed(f"{SUMMARY}: counts must be an object with {', '.join(COUNT_KEYS)}")
    if set(counts) != set(COUNT_KEYS):
        raise CheckFailed(f"{SUMMARY}: counts must have exactly the keys {', '.join(COUNT_KEYS)} "
                          f"(got {', '.join(sorted(map(str, counts)))})")
    total, completed, resolved, unresolved, infra = (_count(counts, key) for key in COUNT_KEYS)
    if resolved + unresolved > completed:
        raise CheckFailed(f"{SUMMARY}: counts.resolved + counts.unresolved ({resolved} + {unresolved}) "
                          f"must not exceed counts.completed ({completed})")
    if completed > total:
        raise CheckFailed(f"{SUMMARY}: counts.completed ({completed}) must not exceed counts.total ({total})")
    if completed + infra > total:
        raise CheckFailed(f"{SUMMARY}: counts.completed + counts.infra_errors ({completed} + {infra}) "
                          f"must not exceed counts.total ({total})")
    status = summary.get("status")
    if status not in STATUSES:
        raise CheckFailed(f"{SUMMARY}: status must be one of {', '.join(STATUSES)} (got {status!r})")
    if "score" not in summary:
        raise CheckFailed(f"{SUMMARY}: score must be present (null, or a number for a SUCCEEDED run)")
    score = summary["score"]
    if status != "SUCCEEDED":
        if score is not None:
            raise CheckFailed(f"{SUMMARY}: score must be null for a {status} run (got {score!r})")
        return
    if completed == 0:
        raise CheckFailed(f"{SUMMARY}: a SUCCEEDED run must have counts.completed > 0")
    # (an int is finite; math.isfinite would overflow on a huge one)
    if isinstance(score, bool) or not isinstance(score, int | float) or (isinstance(score, float)
                                                                          and not math.isfinite(score)):
        raise CheckFailed(f"{SUMMARY}: score of a SUCCEEDED run must be a finite number (got {score!r})")
    expected = round(resolved / completed, SCORE_DIGITS)
    if score != expected:
        raise CheckFailed(f"{SUMMARY}: score {score!r} is not resolved / completed = {resolved}/{completed} "
                          f"rounded to {SCORE_DIGITS} decimals ({expected!r})")


def check_source(summary: dict[str, Any], expect: Expectation) -> str:
    """summary.json's source must be the expected repository and tag; return its commit."""
    source = summary.get("source")
    if not isinstance(source, dict):
        raise CheckFailed(f"{SUMMARY}: source must be an object with repository, tag and commit")
    for key, want in (("repository", expect.repository), ("tag", expect.tag)):
        got = source.get(key)
        if got != want:
            raise CheckFailed(f"{SUMMARY}: source.{key} is {got!r}, expected {want!r}: this release is not "
                              f"the one you asked for")
    commit = source.get("commit")
    if not isinstance(commit, str) or not _COMMIT_RE.match(commit):
        raise CheckFailed(f"{SUMMARY}: source.commit must be a 40-character lowercase hex commit (got {commit!r})")
    return commit


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def check_statement_source(statement: dict[str, Any], name: str, repository: str, tag: str, commit: str) -> None:
    """The statement's type, and its source repository, tag and commit, equal summary.json's."""
    if statement.get("_type") != STATEMENT_TYPE:
        raise CheckFailed(f"{name}: _type must be {STATEMENT_TYPE!r}")
    if statement.get("predicateType") != SLSA_PROVENANCE:
        raise CheckFailed(f"{name}: predicateType must be {SLSA_PROVENANCE!r}")
    definition = _mapping(_mapping(statement.get("predicate")).get("buildDefinition"))
    source = _mapping(definition.get("externalParameters")).get("source")
    if source != {"repository": repository, "ref": f"refs/tags/{tag}"}:
        raise CheckFailed(f"{name}: externalParameters.source is {source!r}, but summary.json is for "
                          f"{repository} refs/tags/{tag}")
    deps = definition.get("resolvedDependencies")
    commits = [d for d in deps if isinstance(d, dict) and "gitCommit" in _mapping(d.get("digest"))] \
        if isinstance(deps, list) else []
    uri = f"git+https://github.com/{repository}@refs/tags/{tag}"
    if len(commits) != 1 or commits[0].get("uri") != uri or commits[0]["digest"] != {"gitCommit": commit}:
        raise CheckFailed(f"{name}: resolvedDependencies must name exactly one source, {uri} at commit {commit}, "
                          f"the source of summary.json (got {commits!r})")


def verify_consistency(directory: Path, summary: dict[str, Any], repository: str, tag: str, commit: str) -> None:
    from pipeline.fsutil import sha256_file

    images = summary.get("images")
    if not isinstance(images, dict) or set(images) != {"runner", "api"}:
        raise CheckFailed(f"{SUMMARY}: images must name exactly runner and api")
    refs = {}
    for role in ("runner", "api"):
        entry = images[role]
        try:
            ref = parse_ref(entry.get("ref") if isinstance(entry, dict) else entry, f"summary.json images.{role}.ref")
        except Error as exc:
            raise CheckFailed(f"{SUMMARY}: images.{role} is not digest-pinned: {exc.diagnostics()}") from None
        if isinstance(entry, dict) and (entry.get("name"), entry.get("digest")) != (ref.name, ref.digest):
            raise CheckFailed(f"{SUMMARY}: images.{role} name/digest disagree with its ref")
        refs[role] = ref
    expected = {(r.name, r.digest) for r in refs.values()}

    images_name = "provenance-images.intoto.json"
    images_st = _read_json(directory / images_name)
    if not isinstance(images_st, dict):
        raise CheckFailed(f"{images_name}: must be a JSON object")
    if _subjects(images_st, images_name) != expected:
        raise CheckFailed(f"{images_name}: subjects are not the runner and api images of summary.json")
    check_statement_source(images_st, images_name, repository, tag, commit)

    summary_name = "provenance-summary.intoto.json"
    summary_st = _read_json(directory / summary_name)
    if not isinstance(summary_st, dict):
        raise CheckFailed(f"{summary_name}: must be a JSON object")
    if _subjects(summary_st, summary_name) != {(SUMMARY, "sha256:" + sha256_file(directory / SUMMARY))}:
        raise CheckFailed(f"{summary_name}: subject is not this summary.json")
    check_statement_source(summary_st, summary_name, repository, tag, commit)
    definition = _mapping(_mapping(summary_st.get("predicate")).get("buildDefinition"))
    deps = definition.get("resolvedDependencies")
    bound = {(str(d.get("name")), "sha256:" + str(_mapping(d.get("digest")).get("sha256")))
             for d in (deps if isinstance(deps, list) else [])
             if isinstance(d, dict) and d.get("name") in ("runner", "api")}
    if bound != {(role, ref.digest) for role, ref in refs.items()}:
        raise CheckFailed(f"{summary_name}: does not bind summary.json to the runner and api digests")
    run_id = _mapping(definition.get("internalParameters")).get("infra_run_id")
    if run_id != summary.get("infra_run_id", summary.get("run_id")):
        raise CheckFailed(f"{summary_name}: infra_run_id {run_id!r} is not summary.json's run")
    correlation = _mapping(definition.get("externalParameters")).get("correlation_id")
    if correlation != summary.get("correlation_id"):
        raise CheckFailed(f"{summary_name}: correlation_id {correlation!r} is not summary.json's")

    for role, ref in refs.items():
        manifest = directory / f"manifest-{role}.oci.json"
        if not manifest.is_file() or "sha256:" + sha256_file(manifest) != ref.digest:
            raise CheckFailed(f"{manifest.name}: missing or its sha256 is not the {role} digest {ref.digest}")
        sbom = _read_json(directory / f"sbom-{role}.cdx.json")
        component = _mapping(_mapping(sbom if isinstance(sbom, dict) else {}).get("metadata")).get("component")
        component = _mapping(component)
        if (component.get("name"), component.get("version")) != (ref.name, ref.digest):
            raise CheckFailed(f"sbom-{role}.cdx.json: describes {component.get('name')!r}@{component.get('version')!r}, "
                              f"not {ref.ref}")


def verify_release(directory: Path, *, repository: str | None = None, tag: str | None = None,
                   policy: Path | None = None, trusted_root: Path | None = None, offline: bool = False,
                   profile: str | None = None, infra_repository: str | None = None) -> VerifiedRelease:
    """Verify ``directory`` as the release of ``repository`` at ``tag``, sealed by the benchmark
    workflow of ``infra_repository`` when the profile's identity names it (production).

    ``repository`` and ``tag`` (or ``expect:`` in ``policy``) are required: without them a
    ValidationError (usage, exit 2) is raised before anything is read. Raise CheckFailed
    naming the first failure; return what was verified.
    """
    directory = Path(directory)
    expect = expectation(policy, select_profile(profile, trusted_root), repository=repository, tag=tag,
                         infra_repository=infra_repository)
    if not directory.is_dir():
        raise ValidationError("DIR", "must be a directory", str(directory))
    for name in (SUMMARY, CHECKSUMS, CHECKSUMS + BUNDLE_SUFFIX):
        if not (directory / name).is_file():
            raise CheckFailed(f"{name}: missing")
    verifier = _verifier(trusted_root, offline)

    verify_bundle(verifier, directory / CHECKSUMS, directory / (CHECKSUMS + BUNDLE_SUFFIX), expect)
    verify_checksums(directory)
    for name in REQUIRED_SIGNED:
        if not (directory / (name + BUNDLE_SUFFIX)).is_file():
            raise CheckFailed(f"{name}{BUNDLE_SUFFIX}: missing ({name} must be signed)")
    bundles = [CHECKSUMS + BUNDLE_SUFFIX]
    for bundle_file in sorted(directory.glob("*" + BUNDLE_SUFFIX)):
        if bundle_file.name == CHECKSUMS + BUNDLE_SUFFIX:
            continue
        verify_bundle(verifier, directory / bundle_file.name.removesuffix(BUNDLE_SUFFIX), bundle_file, expect)
        bundles.append(bundle_file.name)
    # Only now, with every signature checked, is summary.json read for its content.
    summary = load_summary(directory)
    commit = check_source(summary, expect)
    check_summary(summary)
    verify_consistency(directory, summary, expect.repository, expect.tag, commit)
    return VerifiedRelease(directory=directory, profile=expect.profile, identity=expect.identity,
                           issuer=expect.issuer, repository=expect.repository, tag=expect.tag, commit=commit,
                           bundles=tuple(bundles))
