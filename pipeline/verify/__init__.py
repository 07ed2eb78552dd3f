"""``benchseal verify``: check a release directory the way a consumer must.

1. SHA256SUMS is signed by the expected identity/issuer, and every file in the
   directory is listed in it with the right hash (``body.md``, the release notes,
   is the only file allowed outside it);
2. every ``<file>.sigstore.json`` bundle verifies for ``<file>`` against the
   expected identity and issuer (DSSE bundles: the envelope's payload must be the
   exact bytes of ``<file>``);
3. summary.json's image references are digest-pinned (pipeline.digests) and are
   exactly the provenance subjects, the summary provenance binds summary.json and
   those digests, and each SBOM describes the image by that digest.

The first failure raises CheckFailed naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.digests import parse_ref
from pipeline.errors import CheckFailed, Error, ValidationError
from pipeline.verify.policy import Expectation, expectation

__all__ = ["REQUIRED_SIGNED", "select_profile", "verify_release"]

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
SUMMARY_SCHEMA = "benchseal.summary/v1"
INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"


def select_profile(profile: str | None, trusted_root: Path | None) -> str:
    return profile or ("local" if trusted_root is not None else "production")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CheckFailed(f"{path.name}: missing") from None
    except ValueError as exc:
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
    """Verify one bundle for one file; raise CheckFailed naming the bundle."""
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
    identity = policy.Identity(identity=expect.identity, issuer=expect.issuer)
    try:
        if bundle._dsse_envelope is not None:
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
        digest = (s.get("digest") or {}).get("sha256") if isinstance(s, dict) else None
        if not isinstance(digest, str):
            raise CheckFailed(f"{name}: a subject has no sha256 digest")
        out.add((str(s.get("name")), f"sha256:{digest}"))
    return out


def verify_consistency(directory: Path, summary: dict[str, Any]) -> None:
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

    images_st = _read_json(directory / "provenance-images.intoto.json")
    if _subjects(images_st, "provenance-images.intoto.json") != expected:
        raise CheckFailed("provenance-images.intoto.json: subjects are not the runner and api images of summary.json")

    summary_st = _read_json(directory / "provenance-summary.intoto.json")
    if _subjects(summary_st, "provenance-summary.intoto.json") != {(SUMMARY, "sha256:" + sha256_file(directory / SUMMARY))}:
        raise CheckFailed("provenance-summary.intoto.json: subject is not this summary.json")
    deps = (((summary_st.get("predicate") or {}).get("buildDefinition") or {}).get("resolvedDependencies")) or []
    bound = {(str(d.get("name")), "sha256:" + str((d.get("digest") or {}).get("sha256"))) for d in deps
             if isinstance(d, dict) and d.get("name") in ("runner", "api")}
    if bound != {(role, ref.digest) for role, ref in refs.items()}:
        raise CheckFailed("provenance-summary.intoto.json: does not bind summary.json to the runner and api digests")

    for role, ref in refs.items():
        manifest = directory / f"manifest-{role}.oci.json"
        if not manifest.is_file() or "sha256:" + sha256_file(manifest) != ref.digest:
            raise CheckFailed(f"{manifest.name}: missing or its sha256 is not the {role} digest {ref.digest}")
        sbom = _read_json(directory / f"sbom-{role}.cdx.json")
        component = ((sbom.get("metadata") or {}).get("component")) or {}
        if (component.get("name"), component.get("version")) != (ref.name, ref.digest):
            raise CheckFailed(f"sbom-{role}.cdx.json: describes {component.get('name')}@{component.get('version')}, "
                              f"not {ref.ref}")


def verify_release(directory: Path, *, policy: Path | None = None, trusted_root: Path | None = None,
                   offline: bool = False, profile: str | None = None) -> None:
    """Raise CheckFailed naming the first failure; return None when the release verifies."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValidationError("DIR", "must be a directory", str(directory))
    for name in (SUMMARY, CHECKSUMS, CHECKSUMS + BUNDLE_SUFFIX):
        if not (directory / name).is_file():
            raise CheckFailed(f"{name}: missing")
    summary = load_summary(directory)
    expect = expectation(policy, select_profile(profile, trusted_root), summary)
    verifier = _verifier(trusted_root, offline)

    verify_bundle(verifier, directory / CHECKSUMS, directory / (CHECKSUMS + BUNDLE_SUFFIX), expect)
    verify_checksums(directory)
    for name in REQUIRED_SIGNED:
        if not (directory / (name + BUNDLE_SUFFIX)).is_file():
            raise CheckFailed(f"{name}{BUNDLE_SUFFIX}: missing ({name} must be signed)")
    for bundle_file in sorted(directory.glob("*" + BUNDLE_SUFFIX)):
        if bundle_file.name == CHECKSUMS + BUNDLE_SUFFIX:
            continue
        verify_bundle(verifier, directory / bundle_file.name.removesuffix(BUNDLE_SUFFIX), bundle_file, expect)
    verify_consistency(directory, summary)
