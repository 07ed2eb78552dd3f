"""``benchseal verify``: check a release directory the way a consumer must.

The consumer states what they expect (``Expectation``: source repository and tag, and
from the policy the signer identity and issuer and, for a builder's reusable workflow, the
caller it signed for: the certificate's workflow repository and ref); nothing of it is read
from the release.

1. SHA256SUMS is signed by the expected signer, and every file in the
   directory is listed in it with the right hash (``body.md``, the release notes,
   is the only file allowed outside it);
2. every ``<file>.sigstore.json`` bundle verifies for ``<file>`` against the
   expected signer: a DSSE envelope for the in-toto statements
   (``*.intoto.json``; the payload must be the exact bytes of ``<file>``), a message
   signature for every other file;
3. summary.json names the expected repository and tag, is internally consistent
   (counts, status, score) and its image references are digest-pinned
   (pipeline.core.digests) and exactly the provenance subjects; both statements name the
   same source repository, tag and commit as summary.json; the summary provenance
   binds summary.json and those digests, and each SBOM describes the image by that digest;
4. the score is what the trials say: ``trial-results.json`` carries the plan and every trial's
   result.json byte for byte as ``evidence-SHA256SUMS`` lists them (signed through SHA256SUMS);
   each trial is graded again with the worker's rule (``pipeline.core.scoring``) and summary.json's
   trials, counts and score must be exactly that;
5. ``test-result.intoto.json``, the result as in-toto's test-result attestation, is what that
   summary.json gives (``pipeline.verify.testresult``);
6. when the consumer pins the infra policy (``infra_policy_digest``), summary.json records exactly that
   digest as the policy the run was run and graded under.

The first failure raises the ``ReleaseRefused`` subclass of its rule (``pipeline.core.errors``), naming the
file. The Sigstore boundary is typed with sigstore-python's own classes (``Verifier``, ``VerificationPolicy``,
``Bundle``) and catches only its errors: anything else is a bug, not a refusal.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from sigstore.errors import Error as SigstoreError
from sigstore.hashes import Hashed
from sigstore.models import Bundle, TrustedRoot
from sigstore.verify import Verifier
from sigstore.verify import policy as sigstore_policy  # not `policy`: pipeline.verify.policy is a submodule
from sigstore.verify.policy import VerificationPolicy
from sigstore_models.common.v1 import HashAlgorithm

from pipeline.core import strictjson
from pipeline.core.digests import ImageRef, parse_ref, validate_digest
from pipeline.core.documents import DigestSet, ProvenanceStatement, ReleaseSummary, TrialResults, parse_document
from pipeline.core.errors import (
    BundleInvalid,
    BundleKindWrong,
    CheckFailed,
    ChecksumMismatch,
    ClaimNotSupported,
    EntryNotPlain,
    EvidenceMissing,
    ImageEvidenceMismatch,
    NotValidJson,
    PolicyDigestMismatch,
    ProvenanceMismatch,
    ReleaseRefused,
    SignatureRefused,
    SignedStatementMismatch,
    SourceMismatch,
    SummaryInvalid,
    TrialEvidenceMismatch,
    TrustedRootUnavailable,
    ValidationError,
)
from pipeline.core.fsutil import is_plain_entry, sha256_file
from pipeline.core.history import check_comparison
from pipeline.core.layout import (
    CHECKSUMS,
    CHECKSUMS_BUNDLE,
    MANIFESTS,
    NESTED_SUMS,
    NOT_ASSETS,
    PROVENANCE_IMAGES,
    PROVENANCE_SUMMARY,
    REQUIRED_SIGNED,
    SBOMS,
    SUMMARY,
    TRIAL_RESULTS,
    bundle_name,
    is_statement,
    nested_files,
    parse_checksums,
)
from pipeline.core.scoring import (
    PLAN_NAME,
    Claim,
    ClaimedTrial,
    TrialEvidence,
    check_claim,
    evidence_trials,
    is_result_name,
)
from pipeline.verify.archive import verify_evidence_archive
from pipeline.verify.policy import Builder, Expectation, expectation
from pipeline.verify.testresult import check_test_result

__all__ = ["VerifiedRelease", "check_policy_pin", "check_summary", "select_profile", "signer_policy", "verify_release"]

INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
GITHUB_SERVER = "https://github.com"  # the source repository URI's prefix (the identities' too)


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
    builder: Builder | None = None
    infra_repository: str | None = None
    workflow_repository: str | None = None  # the caller the signer's certificate names (when pinned)
    workflow_ref: str | None = None
    # The infra policy the run was run and graded under, as the verified summary.json records it.
    policy_digest: str | None = None

    def to_json_dict(self) -> dict[str, object]:
        return {"directory": str(self.directory), "profile": self.profile, "identity": self.identity,
                "issuer": self.issuer, "repository": self.repository, "tag": self.tag, "commit": self.commit,
                "bundles": list(self.bundles), "builder": None if self.builder is None else str(self.builder),
                "infra_repository": self.infra_repository, "workflow_repository": self.workflow_repository,
                "workflow_ref": self.workflow_ref, "policy_digest": self.policy_digest}


def select_profile(profile: str | None, trusted_root: Path | None) -> str:
    return profile or ("local" if trusted_root is not None else "production")


def _read_json(path: Path) -> object:
    """Strict JSON: no duplicate keys, no NaN/Infinity (Python's json accepts both)."""
    try:
        return strictjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise EvidenceMissing(f"{path.name}: missing", subject=path.name) from None
    except (ValueError, RecursionError) as exc:
        raise NotValidJson(f"{path.name}: not valid JSON ({exc})", subject=path.name) from None


def load_summary(directory: Path) -> ReleaseSummary:
    """summary.json through its model (strict JSON first); SummaryInvalid names the field and rule."""
    return check_summary(_read_json(directory / SUMMARY))


# What loading a trusted root can raise (sigstore's Error: TUF, metadata, a root without logs; ValueError: the
# JSON and its pydantic model, keys cryptography cannot load; OSError: the file or the TUF cache): measured by
# mutating every field of a real trusted_root.json. Anything else is a bug and surfaces as one.
_ROOT_ERRORS = (SigstoreError, ValueError, OSError)
# What loading a bundle can raise (InvalidBundle and the verifier's errors are sigstore Errors; the JSON and
# its model raise ValueError), measured by mutating every field of real bundles.
_BUNDLE_ERRORS = (SigstoreError, ValueError)


def _verifier(trusted_root: Path | None, offline: bool) -> Verifier:
    if trusted_root is not None:
        try:
            return Verifier(trusted_root=TrustedRoot.from_file(str(trusted_root)))
        except FileNotFoundError:
            raise ValidationError("--trusted-root", "file does not exist", str(trusted_root)) from None
        except _ROOT_ERRORS as exc:
            raise ValidationError("--trusted-root", f"is not a Sigstore trusted root: {exc}", str(trusted_root)) from None
    try:
        return Verifier.production(offline=offline)
    except _ROOT_ERRORS as exc:
        raise TrustedRootUnavailable(f"cannot load the public-good trusted root (try --offline or --trusted-root): "
                                     f"{exc}", subject="--trusted-root") from None


def signer_policy(expect: Expectation) -> VerificationPolicy:
    """sigstore-python's policy for ``expect``: the identity (SAN) and issuer, and when the profile
    pins the caller of a reusable workflow, its repository and ref in both of Fulcio's forms (the
    GitHub workflow repository / ref extensions, 1.5 / 1.6, which cosign's
    --certificate-github-workflow-* flags read, and the source repository URI / ref, 1.12 / 1.14):
    a certificate missing either is refused."""
    checks: list[VerificationPolicy] = [sigstore_policy.Identity(identity=expect.identity, issuer=expect.issuer)]
    if expect.workflow_repository is not None:
        checks += [sigstore_policy.GitHubWorkflowRepository(expect.workflow_repository),
                   sigstore_policy.OIDCSourceRepositoryURI(f"{GITHUB_SERVER}/{expect.workflow_repository}")]
    if expect.workflow_ref is not None:
        checks += [sigstore_policy.GitHubWorkflowRef(expect.workflow_ref),
                   sigstore_policy.OIDCSourceRepositoryRef(expect.workflow_ref)]
    return checks[0] if len(checks) == 1 else sigstore_policy.AllOf(checks)


def _is_dsse(bundle: Bundle) -> bool:
    """Whether the bundle's content is a DSSE envelope (else a message signature), read from its public JSON
    form: the v0.3 bundle holds exactly one of ``dsseEnvelope`` and ``messageSignature`` (sigstore-python
    has no public accessor for the envelope)."""
    content = json.loads(bundle.to_json())
    return isinstance(content, dict) and content.get("dsseEnvelope") is not None


def verify_bundle(verifier: Verifier, target: Path, bundle_file: Path, expect: Expectation) -> None:
    """Verify one bundle for one file; raise the ``ReleaseRefused`` of the rule it breaks, naming the bundle.

    The kind of bundle is decided by the file, not by the bundle: an in-toto statement
    (``*.intoto.json``) must be signed as a DSSE attestation, anything else as a message
    signature over the file's digest.
    """

    name = bundle_file.name
    if not target.is_file():
        raise EvidenceMissing(f"{name}: the file it signs ({target.name}) is missing", subject=name)
    try:
        bundle = Bundle.from_json(bundle_file.read_bytes())
    except FileNotFoundError:
        raise EvidenceMissing(f"{name}: missing", subject=name) from None
    except (*_BUNDLE_ERRORS, OSError) as exc:  # OSError: a directory (or unreadable entry) by a bundle's name
        raise BundleInvalid(f"{name}: not a valid Sigstore bundle: {exc}", subject=name) from None
    is_dsse = _is_dsse(bundle)
    dsse_expected = is_statement(target.name)
    if dsse_expected and not is_dsse:
        raise BundleKindWrong(f"{name}: must be a DSSE attestation of the in-toto statement {target.name}; "
                              "a plain message signature over the statement file is refused", subject=name)
    if is_dsse and not dsse_expected:
        raise BundleKindWrong(f"{name}: is a DSSE envelope, but {target.name} is not an in-toto statement: "
                              "it must be signed as a message signature over the file", subject=name)
    identity = signer_policy(expect)
    try:
        if not is_dsse:
            digest = Hashed(algorithm=HashAlgorithm.SHA2_256, digest=bytes.fromhex(sha256_file(target)))
            verifier.verify_artifact(digest, bundle, identity)
            return
        payload_type, payload = verifier.verify_dsse(bundle, identity)
    except _BUNDLE_ERRORS as exc:
        raise SignatureRefused(f"{name}: signature does not verify for {target.name} as {expect.describe()}: "
                               f"{exc}", subject=name) from None
    # verify_dsse checks the signature, not what was signed: the payload must be in-toto and exactly the file.
    if payload_type != INTOTO_PAYLOAD_TYPE:
        raise SignedStatementMismatch(f"{name}: DSSE payload type is {payload_type!r}, not {INTOTO_PAYLOAD_TYPE!r}",
                                      subject=name)
    if payload != target.read_bytes():
        raise SignedStatementMismatch(f"{name}: the signed statement differs from {target.name}", subject=name)


def _refuse_irregular_entries(directory: Path) -> None:
    """Every entry below ``directory`` is a regular file or a real directory.

    A symbolic link anywhere on a path can point outside the release (and change between two
    reads of it); a FIFO or a device is not evidence. Checked on the entries themselves (lstat),
    before any file is read.
    """
    for root, dirs, names in os.walk(directory):  # does not descend into symlinked directories
        dirs.sort()
        for name in sorted(dirs + names):
            path = Path(root) / name
            if not is_plain_entry(path):
                what = ("a symbolic link; a release holds only regular files and directories" if path.is_symlink()
                        else "not a regular file or directory")
                relative = path.relative_to(directory).as_posix()
                raise EntryNotPlain(f"{relative}: {what}", subject=relative)


def _checksums(directory: Path, source: str, *, nested: bool = False) -> dict[str, str]:
    """A checksum file's entries; its format's CheckFailed (``core.layout``: the one parser) as ChecksumMismatch."""
    try:
        return parse_checksums((directory / source).read_bytes(), source, nested=nested)  # bytes: undecodable fails
    except CheckFailed as exc:
        raise ChecksumMismatch(str(exc), subject=source) from None


def verify_checksums(directory: Path) -> dict[str, str]:
    entries = _checksums(directory, CHECKSUMS)
    for name, expected in entries.items():
        path = directory / name
        if "/" in name or not path.is_file():
            raise ChecksumMismatch(f"{CHECKSUMS}: lists {name}, which is missing", subject=CHECKSUMS)
        if sha256_file(path) != expected:
            raise ChecksumMismatch(f"{name}: sha256 does not match SHA256SUMS", subject=name)
    subdirs = [p for p in directory.iterdir() if p.is_dir() and not p.is_symlink()]
    for path in sorted(directory.iterdir()):
        if path.name in NOT_ASSETS and not path.is_file():
            raise EntryNotPlain(f"{path.name}: must be a regular file", subject=path.name)
        if path.name in entries or path.name in (CHECKSUMS, CHECKSUMS_BUNDLE) or path.name in NOT_ASSETS:
            continue
        if path in subdirs and NESTED_SUMS in entries:
            continue  # checked below
        raise ChecksumMismatch(f"{path.name}: not covered by SHA256SUMS", subject=path.name)
    if subdirs and NESTED_SUMS in entries:
        # Nested evidence is present only in a run dir (releases are flat): check it all.
        nested = _checksums(directory, NESTED_SUMS, nested=True)
        for name, expected in nested.items():
            path = directory / name
            if not path.is_file() or path.is_symlink() or sha256_file(path) != expected:
                raise ChecksumMismatch(f"{name}: missing or does not match {NESTED_SUMS}", subject=name)
        for path in nested_files(directory):
            relative = path.relative_to(directory).as_posix()
            if relative not in nested:
                raise ChecksumMismatch(f"{relative}: not covered by {NESTED_SUMS}", subject=relative)
    return entries


def load_statement(data: object, name: str) -> ProvenanceStatement:
    """A provenance statement through its model (in-toto v1, SLSA provenance v1); ProvenanceMismatch names the field."""
    try:
        return parse_document(ProvenanceStatement, data, name)
    except ValidationError as exc:
        raise ProvenanceMismatch(f"{exc.field}: {exc.rule} (got {repr(exc.value)[:200]})", subject=name) from None


def _subjects(statement: ProvenanceStatement) -> set[tuple[str, str]]:
    return {(s.name, f"sha256:{s.digest.sha256}") for s in statement.subject}


def check_summary(data: object) -> ReleaseSummary:
    """Parsed summary.json as ``ReleaseSummary``; raise SummaryInvalid naming the field and rule.

    The model holds every rule (``pipeline.core.documents``): counts are non-negative strict integers
    whose parts never exceed the whole; status is SUCCEEDED, FAILED or INFRA_ERROR; score is
    present, null unless SUCCEEDED, and on SUCCEEDED equal to round(resolved / completed, 6)
    with completed > 0; image refs are digest-pinned; source.commit is 40 lowercase hex.
    """
    try:
        return parse_document(ReleaseSummary, data, SUMMARY)
    except ValidationError as exc:
        field = exc.field.removeprefix(f"{SUMMARY}: ")
        if field == "(root)":  # a rule across fields: the message names them
            raise SummaryInvalid(f"{SUMMARY}: {exc.rule}", subject=SUMMARY) from None
        raise SummaryInvalid(f"{SUMMARY}: {field}: {exc.rule} (got {repr(exc.value)[:200]})", subject=SUMMARY) from None


def check_source(summary: ReleaseSummary, expect: Expectation) -> str:
    """summary.json's source must be the expected repository and tag; return its commit."""
    for key, got, want in (("repository", summary.source.repository, expect.repository),
                           ("tag", summary.source.tag, expect.tag)):
        if got != want:
            raise SourceMismatch(f"{SUMMARY}: source.{key} is {got!r}, expected {want!r}: this release is not "
                                 f"the one you asked for", subject=SUMMARY)
    return summary.source.commit


def _mapping(value: object) -> dict[str, object]:
    # The SBOM is CycloneDX (validated where it is made); verify reads one field of it.
    return value if isinstance(value, dict) else {}


def check_statement_source(statement: ProvenanceStatement, name: str, repository: str, tag: str,
                           commit: str) -> None:
    """The statement's source repository, tag and commit equal summary.json's (its types: the model)."""
    definition = statement.predicate.buildDefinition
    source = definition.externalParameters.source
    if (source.repository, source.ref) != (repository, f"refs/tags/{tag}"):
        raise ProvenanceMismatch(f"{name}: externalParameters.source is {source.to_json_dict()!r}, but summary.json "
                                 f"is for {repository} refs/tags/{tag}", subject=name)
    commits = [d for d in definition.resolvedDependencies if d.digest.gitCommit is not None]
    uri = f"git+https://github.com/{repository}@refs/tags/{tag}"
    if len(commits) != 1 or commits[0].uri != uri or commits[0].digest != DigestSet(gitCommit=commit):
        raise ProvenanceMismatch(f"{name}: resolvedDependencies must name exactly one source, {uri} at commit "
                                 f"{commit}, the source of summary.json (got {[c.to_json_dict() for c in commits]!r})",
                                 subject=name)


def verify_consistency(directory: Path, summary: ReleaseSummary, repository: str, tag: str, commit: str) -> None:
    # The model already checked each image entry (digest-pinned, ref = name@digest).
    refs: dict[str, ImageRef] = {role: parse_ref(image.ref) for role, image in
                                 (("runner", summary.images.runner), ("api", summary.images.api))}
    expected = {(r.name, r.digest) for r in refs.values()}

    images_st = load_statement(_read_json(directory / PROVENANCE_IMAGES), PROVENANCE_IMAGES)
    if _subjects(images_st) != expected:
        raise ProvenanceMismatch(f"{PROVENANCE_IMAGES}: subjects are not the runner and api images of summary.json",
                                 subject=PROVENANCE_IMAGES)
    check_statement_source(images_st, PROVENANCE_IMAGES, repository, tag, commit)

    summary_st = load_statement(_read_json(directory / PROVENANCE_SUMMARY), PROVENANCE_SUMMARY)
    if _subjects(summary_st) != {(SUMMARY, "sha256:" + sha256_file(directory / SUMMARY))}:
        raise ProvenanceMismatch(f"{PROVENANCE_SUMMARY}: subject is not this summary.json", subject=PROVENANCE_SUMMARY)
    check_statement_source(summary_st, PROVENANCE_SUMMARY, repository, tag, commit)
    definition = summary_st.predicate.buildDefinition
    bound = {(d.name, f"sha256:{d.digest.sha256}") for d in definition.resolvedDependencies
             if d.name in ("runner", "api")}
    if bound != {(role, ref.digest) for role, ref in refs.items()}:
        raise ProvenanceMismatch(f"{PROVENANCE_SUMMARY}: does not bind summary.json to the runner and api digests",
                                 subject=PROVENANCE_SUMMARY)
    if definition.internalParameters.run_id != summary.run_id:
        raise ProvenanceMismatch(f"{PROVENANCE_SUMMARY}: run_id {definition.internalParameters.run_id!r} is not "
                                 "summary.json's run", subject=PROVENANCE_SUMMARY)
    correlation = definition.externalParameters.correlation_id
    if correlation != summary.correlation_id:
        raise ProvenanceMismatch(f"{PROVENANCE_SUMMARY}: correlation_id {correlation!r} is not summary.json's",
                                 subject=PROVENANCE_SUMMARY)

    for role, ref in refs.items():
        manifest = directory / MANIFESTS[role]
        if not manifest.is_file() or "sha256:" + sha256_file(manifest) != ref.digest:
            raise ImageEvidenceMismatch(f"{manifest.name}: missing or its sha256 is not the {role} digest {ref.digest}",
                                        subject=manifest.name)
        sbom = _read_json(directory / SBOMS[role])
        component = _mapping(_mapping(_mapping(sbom).get("metadata")).get("component"))
        if (component.get("name"), component.get("version")) != (ref.name, ref.digest):
            raise ImageEvidenceMismatch(f"{SBOMS[role]}: describes {component.get('name')!r}@"
                                        f"{component.get('version')!r}, not {ref.ref}", subject=SBOMS[role])


def _decoded(content: str, name: str) -> bytes:
    try:
        return base64.b64decode(content, validate=True)
    except (ValueError, binascii.Error):
        raise TrialEvidenceMismatch(f"{TRIAL_RESULTS}: {name}: content is not base64", subject=TRIAL_RESULTS) from None


def verify_trial_results(directory: Path, summary: ReleaseSummary) -> None:
    """summary.json's trials, counts, score, interval and per-task counts are what the shipped trial
    evidence says (graded again).

    ``trial-results.json`` must carry exactly the plan and the result.json files evidence-SHA256SUMS
    lists, with the bytes it lists them with; then every planned trial is graded with the worker's rule."""
    try:
        shipped = parse_document(TrialResults, _read_json(directory / TRIAL_RESULTS), TRIAL_RESULTS)
    except ValidationError as exc:
        raise TrialEvidenceMismatch(f"{exc.field}: {exc.rule}", subject=TRIAL_RESULTS) from None
    except ReleaseRefused as exc:  # missing or not JSON: the same rule, said for this file
        raise type(exc)(f"{exc}; a release carries the trial evidence its score is graded from",
                        subject=exc.subject) from None
    if shipped.run_id != summary.run_id:
        raise TrialEvidenceMismatch(f"{TRIAL_RESULTS}: run_id {shipped.run_id!r} is not summary.json's "
                                    f"{summary.run_id!r}", subject=TRIAL_RESULTS)
    listed = _checksums(directory, NESTED_SUMS, nested=True) if (directory / NESTED_SUMS).is_file() else {}
    carried: dict[str, bytes] = {}
    for entry in shipped.files:
        if entry.name in carried:
            raise TrialEvidenceMismatch(f"{TRIAL_RESULTS}: {entry.name} is carried twice", subject=TRIAL_RESULTS)
        if entry.name != PLAN_NAME and not is_result_name(entry.name):
            raise TrialEvidenceMismatch(f"{TRIAL_RESULTS}: {entry.name!r} is neither {PLAN_NAME} nor a trial's "
                                        "result.json", subject=TRIAL_RESULTS)
        data = _decoded(entry.content, entry.name)
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry.sha256 or listed.get(entry.name) != digest:
            raise TrialEvidenceMismatch(f"{TRIAL_RESULTS}: {entry.name}: its bytes (sha256 {digest}) are not what "
                                        f"{NESTED_SUMS} lists ({listed.get(entry.name, 'nothing')})",
                                        subject=TRIAL_RESULTS)
        carried[entry.name] = data
    for name in sorted(listed):
        if (name == PLAN_NAME or is_result_name(name)) and name not in carried:
            raise TrialEvidenceMismatch(f"{NESTED_SUMS}: lists {name}, but {TRIAL_RESULTS} does not carry it",
                                        subject=TRIAL_RESULTS)
    evidence = TrialEvidence(plan=carried.get(PLAN_NAME), names=frozenset(listed),
                             results={name.split("/")[2]: data for name, data in carried.items() if name != PLAN_NAME})
    claim = Claim(document=SUMMARY, label="summary", run_id=summary.run_id, status=summary.status,
                  counts=summary.counts, score=summary.score,
                  trials=tuple(ClaimedTrial(t.task, t.trial, t.outcome, t.reward) for t in summary.timings.trials),
                  # The interval and per-task counts of a scored run, when summary.json states them (older ones do not).
                  interval=summary.interval, tasks=summary.tasks,
                  states_noise=bool({"interval", "tasks"} & summary.model_fields_set))
    try:  # the evidence itself: every planned trial (and attempt) has its result, nothing unplanned
        trials = evidence_trials(evidence, claim)
    except CheckFailed as exc:
        raise TrialEvidenceMismatch(str(exc), subject=TRIAL_RESULTS) from None
    try:  # the grader's and the history's rules (core, shared with the worker): the claim against the evidence
        check_claim(claim, trials)
        if summary.comparison is not None:
            # The comparison with the previous release, recomputed from the scores just checked against the
            # trials (the previous release's own figures are as the signed summary names them).
            if summary.status != "SUCCEEDED":
                raise CheckFailed(f"{SUMMARY} comparison: present for a {summary.status} run; only a scored run is "
                                  "compared")
            check_comparison(summary.comparison, score=summary.score, interval=summary.interval, tasks=summary.tasks,
                             dataset_digest=summary.dataset.digest, subset=summary.dataset.subset,
                             where=f"{SUMMARY} comparison")
    except CheckFailed as exc:
        raise ClaimNotSupported(str(exc), subject=SUMMARY) from None


def verify_release(directory: Path, *, repository: str | None = None, tag: str | None = None,
                   policy: Path | None = None, trusted_root: Path | None = None, offline: bool = False,
                   profile: str | None = None, infra_repository: str | None = None,
                   builder: str | Builder | None = None, infra_policy_digest: str | None = None) -> VerifiedRelease:
    """Verify ``directory`` as the release of ``repository`` at ``tag``, sealed for
    ``infra_repository`` by ``builder``'s reusable benchmark.yml when the profile names them
    (production: both required).

    ``repository`` and ``tag`` (or ``expect:`` in ``policy``) are required: without them a
    ValidationError (usage, exit 2) is raised before anything is read. Raise the ``ReleaseRefused``
    subclass of the first rule that fails, naming its file; return what was verified.
    ``infra_policy_digest``: the consumer's pin of the infra policy (``sha256:HEX`` of the infra repository's
    policies/infra.yaml) summary.json must record.
    """
    directory = Path(directory)
    if infra_policy_digest is not None:
        validate_digest(infra_policy_digest, "--infra-policy-digest")  # usage: before anything is read
    expect = expectation(policy, select_profile(profile, trusted_root), repository=repository, tag=tag,
                         infra_repository=infra_repository, builder=builder)
    if not directory.is_dir():
        raise ValidationError("DIR", "must be a directory", str(directory))
    _refuse_irregular_entries(directory)
    for name in (SUMMARY, CHECKSUMS, CHECKSUMS_BUNDLE):
        if not (directory / name).is_file():
            raise EvidenceMissing(f"{name}: missing", subject=name)
    verifier = _verifier(trusted_root, offline)

    verify_bundle(verifier, directory / CHECKSUMS, directory / CHECKSUMS_BUNDLE, expect)
    verify_checksums(directory)
    verify_evidence_archive(directory)  # the logs behind the score: exactly what evidence-SHA256SUMS lists
    for name in REQUIRED_SIGNED:
        if not (directory / bundle_name(name)).is_file():
            raise EvidenceMissing(f"{bundle_name(name)}: missing ({name} must be signed)", subject=bundle_name(name))
    bundles = [CHECKSUMS_BUNDLE]
    for bundle_file in sorted(directory.glob(bundle_name("*"))):
        if bundle_file.name == CHECKSUMS_BUNDLE:
            continue
        verify_bundle(verifier, directory / bundle_file.name.removesuffix(bundle_name("")), bundle_file, expect)
        bundles.append(bundle_file.name)
    # Only now, with every signature checked, is summary.json read for its content.
    summary = load_summary(directory)
    commit = check_source(summary, expect)
    verify_consistency(directory, summary, expect.repository, expect.tag, commit)
    verify_trial_results(directory, summary)
    check_test_result(directory, summary, infra_repository=expect.infra_repository)
    check_policy_pin(summary, infra_policy_digest)
    return VerifiedRelease(directory=directory, profile=expect.profile, identity=expect.identity,
                           issuer=expect.issuer, repository=expect.repository, tag=expect.tag, commit=commit,
                           bundles=tuple(bundles), builder=expect.builder, infra_repository=expect.infra_repository,
                           workflow_repository=expect.workflow_repository, workflow_ref=expect.workflow_ref,
                           policy_digest=summary.policy_digest)


def check_policy_pin(summary: ReleaseSummary, pinned: str | None) -> None:
    """PolicyDigestMismatch unless summary.json records the consumer's pinned infra policy (no pin: any)."""
    if pinned is not None and summary.policy_digest != pinned:
        recorded = summary.policy_digest or "no infra policy digest"
        raise PolicyDigestMismatch(f"{SUMMARY}: policy_digest: the run was run and graded under {recorded}, not the "
                                   f"infra policy you pinned ({pinned})", subject=SUMMARY)
