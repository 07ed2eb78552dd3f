"""Issue 9.4: consistency checks that signatures alone do not give.

Every case tampers a file and then RE-SIGNS it (and everything that depends on it: the
summary provenance's subject, SHA256SUMS) with the test's Sigstore signer, so every signature
is valid and only the consistency check can catch it. A control case re-signs without
tampering and must verify.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.errors import (
    BundleInvalid,
    BundleKindWrong,
    ClaimNotSupported,
    NotValidJson,
    ProvenanceMismatch,
    ReleaseRefused,
    SourceMismatch,
    SummaryInvalid,
)
from pipeline.verify.release import VerifiedRelease, check_summary

pytestmark = pytest.mark.slow
Mutate = Callable[[dict[str, Any]], None]
Verify = Callable[[Path], VerifiedRelease]
IMAGES_ST, SUMMARY_ST = "provenance-images.intoto.json", "provenance-summary.intoto.json"


def _refused(release: Path, verify: Verify, rule: type[ReleaseRefused], subject: str) -> ReleaseRefused:
    """Refused by exactly ``rule`` (its class, never its wording) on ``subject``."""
    with pytest.raises(ReleaseRefused) as caught:
        verify(release)
    assert type(caught.value) is rule and caught.value.subject == subject, repr(caught.value)
    return caught.value


def _resign(release: Path, signer: Any, *, summary: Mutate | None = None, summary_text: str | None = None,
            images_st: Mutate | None = None, summary_st: Mutate | None = None) -> None:
    """Apply the mutations, then sign every changed file again as the real pipeline would."""
    from pipeline.core.fsutil import canonical_json, sha256_file
    from pipeline.evidence.writer import reseal

    summary_path = release / "summary.json"
    if summary is not None:
        data = json.loads(summary_path.read_text())
        summary(data)
        summary_path.write_text(json.dumps(data))  # allow_nan: NaN/Infinity are written as Python does
    if summary_text is not None:
        summary_path.write_text(summary_text)
    signer.sign_file(summary_path)
    images_path = release / "provenance-images.intoto.json"
    statement = json.loads(images_path.read_text())
    if images_st is not None:
        images_st(statement)
    images_path.write_text(canonical_json(statement))
    signer.sign_statement(images_path)
    summary_st_path = release / "provenance-summary.intoto.json"
    statement = json.loads(summary_st_path.read_text())
    statement["subject"][0]["digest"]["sha256"] = sha256_file(summary_path)
    if summary_st is not None:
        summary_st(statement)
    summary_st_path.write_text(canonical_json(statement))
    signer.sign_statement(summary_st_path)
    _rewrite_result(release)
    signer.sign_statement(release / "test-result.intoto.json")
    reseal(release, signer=signer)


def _rewrite_result(release: Path) -> None:
    """test-result.intoto.json as the evidence stage writes it for the (re-written) summary.json; for a
    summary.json the model refuses, only its summary subject follows the file."""
    from pipeline.core.documents import ReleaseSummary, load_document
    from pipeline.core.errors import ValidationError
    from pipeline.core.fsutil import canonical_json, sha256_file
    from pipeline.evidence.testresult import write_test_result

    summary_path = release / "summary.json"
    try:
        write_test_result(release, load_document(ReleaseSummary, summary_path), summary_path)
    except (ValidationError, ValueError):
        path = release / "test-result.intoto.json"
        statement = json.loads(path.read_text())
        statement["subject"][1]["digest"]["sha256"] = sha256_file(summary_path)
        path.write_text(canonical_json(statement))


def test_control_resigned_untampered_release_verifies(release_copy: Path, signer_v1: object, verify: Verify) -> None:
    _resign(release_copy, signer_v1)
    verify(release_copy)


# --- source commit and tag: provenance vs summary.json ---------------------------------------

def _deps(statement: dict[str, Any]) -> list[dict[str, Any]]:
    return statement["predicate"]["buildDefinition"]["resolvedDependencies"]  # type: ignore[no-any-return]


def _git_dep(statement: dict[str, Any]) -> dict[str, Any]:
    return next(d for d in _deps(statement) if "gitCommit" in d["digest"])


def _set_commit(commit: str) -> Mutate:
    return lambda st: _git_dep(st)["digest"].update(gitCommit=commit)


def _set_ref(ref: str) -> Mutate:
    return lambda st: st["predicate"]["buildDefinition"]["externalParameters"]["source"].update(ref=ref)


def _set_repo(repository: str) -> Mutate:
    return lambda st: st["predicate"]["buildDefinition"]["externalParameters"]["source"].update(repository=repository)


def _add_second_commit(st: dict[str, Any]) -> None:
    _deps(st).append({"uri": "git+https://github.com/evil/fork@refs/tags/v9.9.9", "digest": {"gitCommit": "e" * 40}})


def _drop_commit(st: dict[str, Any]) -> None:
    st["predicate"]["buildDefinition"]["resolvedDependencies"] = [d for d in _deps(st) if "gitCommit" not in d["digest"]]


def _set_uri(uri: str) -> Mutate:
    return lambda st: _git_dep(st).update(uri=uri)


OTHER = "fedcba9876543210fedcba9876543210fedcba98"
# Each case: the mutation, and the rule and file that refuse it. A commit summary.json itself cannot hold
# is its model's refusal; one it holds but the statements do not name is the images statement's (checked first).
PROVENANCE_CASES: dict[str, tuple[dict[str, Any], type[ReleaseRefused], str]] = {
    "images-commit": ({"images_st": _set_commit(OTHER)}, ProvenanceMismatch, IMAGES_ST),
    "summary-st-commit": ({"summary_st": _set_commit(OTHER)}, ProvenanceMismatch, SUMMARY_ST),
    "images-tag": ({"images_st": _set_ref("refs/tags/v0.0.1")}, ProvenanceMismatch, IMAGES_ST),
    "summary-st-tag": ({"summary_st": _set_ref("refs/tags/v0.0.1")}, ProvenanceMismatch, SUMMARY_ST),
    "summary-st-branch": ({"summary_st": _set_ref("refs/heads/main")}, ProvenanceMismatch, SUMMARY_ST),
    "images-repo": ({"images_st": _set_repo("evil/fork")}, ProvenanceMismatch, IMAGES_ST),
    "images-uri": ({"images_st": _set_uri("git+https://github.com/evil/fork@refs/tags/v9.9.9")}, ProvenanceMismatch,
                   IMAGES_ST),
    "images-second-commit": ({"images_st": _add_second_commit}, ProvenanceMismatch, IMAGES_ST),
    "summary-st-no-commit": ({"summary_st": _drop_commit}, ProvenanceMismatch, SUMMARY_ST),
    "images-predicate-type": ({"images_st": lambda st: st.update(predicateType="https://example.com/other")},
                              ProvenanceMismatch, IMAGES_ST),
    "summary-st-run-id": ({"summary_st": lambda st: st["predicate"]["buildDefinition"]["internalParameters"].update(
        run_id="run-other")}, ProvenanceMismatch, SUMMARY_ST),
    "summary-commit": ({"summary": lambda s: s["source"].update(commit=OTHER)}, ProvenanceMismatch, IMAGES_ST),
    "summary-commit-uppercase": ({"summary": lambda s: s["source"].update(commit=s["source"]["commit"].upper())},
                                 SummaryInvalid, "summary.json"),
    "summary-commit-missing": ({"summary": lambda s: s["source"].pop("commit")}, SummaryInvalid, "summary.json"),
}


@pytest.mark.parametrize("case", sorted(PROVENANCE_CASES))
def test_provenance_source_must_equal_summary(case: str, release_copy: Path, signer_v1: object,
                                              verify: Verify) -> None:
    mutations, rule, subject = PROVENANCE_CASES[case]
    _resign(release_copy, signer_v1, **mutations)
    _refused(release_copy, verify, rule, subject)


# --- DSSE where an attestation is expected ------------------------------------------------------

@pytest.mark.parametrize("statement", ["provenance-images.intoto.json", "provenance-summary.intoto.json"])
def test_plain_signature_over_a_statement_is_refused(statement: str, release_copy: Path, signer_v1: object,
                                                     verify: Verify) -> None:
    """A message signature over the statement file is a valid signature, but not an attestation."""
    from pipeline.evidence.writer import reseal

    signer_v1.sign_file(release_copy / statement)  # type: ignore[attr-defined]
    reseal(release_copy, signer=signer_v1)  # type: ignore[arg-type]
    _refused(release_copy, verify, BundleKindWrong, f"{statement}.sigstore.json")


def test_dsse_bundle_for_a_non_statement_is_refused(release_copy: Path, signer_v1: object, verify: Verify) -> None:
    """The reverse: a file that is not an in-toto statement must not carry a DSSE bundle."""
    from pipeline.evidence.writer import reseal

    # summary.json replaced by (valid) in-toto statement bytes, signed as DSSE under its own name.
    statement = (release_copy / "provenance-images.intoto.json").read_bytes()
    (release_copy / "sbom-api.cdx.json").write_bytes(statement)
    signer_v1.sign_statement(release_copy / "sbom-api.cdx.json")  # type: ignore[attr-defined]
    reseal(release_copy, signer=signer_v1)  # type: ignore[arg-type]
    _refused(release_copy, verify, BundleKindWrong, "sbom-api.cdx.json.sigstore.json")


def test_bundle_with_both_kinds_is_refused(release_copy: Path, signer_v1: object, verify: Verify) -> None:
    from pipeline.evidence.writer import reseal

    plain = json.loads((release_copy / "summary.json.sigstore.json").read_text())
    dsse = json.loads((release_copy / "provenance-summary.intoto.json.sigstore.json").read_text())
    plain["dsseEnvelope"] = dsse["dsseEnvelope"]
    (release_copy / "summary.json.sigstore.json").write_text(json.dumps(plain))
    reseal(release_copy, signer=signer_v1)  # type: ignore[arg-type]
    _refused(release_copy, verify, BundleInvalid, "summary.json.sigstore.json")


# --- summary.json internally consistent ----------------------------------------------------------
# The fixture's run: SUCCEEDED, total 2, completed 2, resolved 1, unresolved 1, infra_errors 0, score 0.5.

def _counts(**values: Any) -> Mutate:
    return lambda s: s["counts"].update(values)


def _pop_count(key: str) -> Mutate:
    return lambda s: s["counts"].pop(key)


SUMMARY_CASES: dict[str, Mutate] = {
    "score-wrong": lambda s: s.update(score=0.75),
    "score-off-by-rounding": lambda s: s.update(score=0.5000001),
    "score-nan": lambda s: s.update(score=float("nan")),
    "score-inf": lambda s: s.update(score=float("inf")),
    "score-neg-inf": lambda s: s.update(score=float("-inf")),
    "score-string": lambda s: s.update(score="0.5"),
    "score-bool": lambda s: s.update(score=True),
    "score-huge-int": lambda s: s.update(score=10**400),
    "score-negative": lambda s: s.update(score=-0.5),
    "score-null-on-success": lambda s: s.update(score=None),
    "score-missing": lambda s: s.pop("score"),
    "score-on-failed": lambda s: s.update(status="FAILED"),
    "score-on-infra-error": lambda s: s.update(status="INFRA_ERROR"),
    "status-unknown": lambda s: s.update(status="PASSED"),
    "status-lowercase": lambda s: s.update(status="succeeded"),
    "count-negative": _counts(unresolved=-1, completed=1),
    "count-string": _counts(resolved="1"),
    "count-bool": _counts(resolved=True),
    "count-float": _counts(total=2.0),
    "count-null": _counts(infra_errors=None),
    "count-missing": _pop_count("unresolved"),
    "count-extra": _counts(skipped=0),
    "counts-not-object": lambda s: s.update(counts=[2, 2, 1, 1, 0]),
    "resolved-plus-unresolved-over-completed": _counts(unresolved=2),
    "completed-over-total": _counts(total=1),
    "completed-plus-infra-over-total": _counts(infra_errors=1),
    "succeeded-with-nothing-completed": lambda s: s.update(counts={"total": 2, "completed": 0, "resolved": 0,
                                                                   "unresolved": 0, "infra_errors": 2}, score=0.0),
}


@pytest.mark.parametrize("case", sorted(SUMMARY_CASES))
def test_inconsistent_summary_is_refused(case: str, release_copy: Path, signer_v1: object, verify: Verify) -> None:
    _resign(release_copy, signer_v1, summary=SUMMARY_CASES[case])
    # NaN and the infinities are not JSON at all (strict JSON refuses them before the model sees them).
    rule = NotValidJson if case in ("score-nan", "score-inf", "score-neg-inf") else SummaryInvalid
    _refused(release_copy, verify, rule, "summary.json")


@pytest.mark.parametrize(("name", "text"), [
    ("duplicate-score", '"score": 0.5, "score": 1.0'),
    ("huge-int", '"score": 0.5, "x": ' + "9" * 5000),
])
def test_ambiguous_or_unparsable_summary_json_is_refused(name: str, text: str, release_copy: Path,
                                                         signer_v1: object, verify: Verify) -> None:
    raw = (release_copy / "summary.json").read_text()
    _resign(release_copy, signer_v1, summary_text=raw.replace('"score": 0.5', text, 1))
    assert text.split(",")[0] in (release_copy / "summary.json").read_text()
    _refused(release_copy, verify, NotValidJson, "summary.json")


@pytest.mark.parametrize(("counts", "score"), [
    ({"total": 3, "completed": 3, "resolved": 1, "unresolved": 2, "infra_errors": 0}, 0.333333),
    ({"total": 2, "completed": 1, "resolved": 1, "unresolved": 0, "infra_errors": 1}, 1.0),
    ({"total": 2, "completed": 2, "resolved": 2, "unresolved": 0, "infra_errors": 0}, 1),
])
def test_consistent_counts_the_trials_do_not_support_are_refused(counts: dict[str, int], score: float,
                                                                 release_copy: Path, signer_v1: object,
                                                                 verify: Verify) -> None:
    """Before: counts and a score that agree with each other verified, whatever the trials said. Now
    the release's trial evidence is graded again and the summary, re-signed, must say the same."""
    _resign(release_copy, signer_v1, summary=lambda s: s.update(counts=counts, score=score))
    check_summary(json.loads((release_copy / "summary.json").read_text()))  # the model itself accepts it
    _refused(release_copy, verify, ClaimNotSupported, "summary.json")


def test_consistent_score_with_the_trials_verifies_as_1_or_1_0(release_copy: Path, signer_v1: object,
                                                               verify: Verify) -> None:
    _resign(release_copy, signer_v1, summary=lambda s: s.update(score=0.5))
    verify(release_copy)


def test_failed_run_without_score_verifies(release_copy: Path, signer_v1: object, verify: Verify) -> None:
    _resign(release_copy, signer_v1, summary=lambda s: s.update(status="FAILED", score=None, reason="timed out"))
    verify(release_copy)


def test_failed_run_may_count_a_trial_as_an_infra_error_but_never_the_reverse(release_copy: Path, signer_v1: object,
                                                                              verify: Verify) -> None:
    """The grader may know of a failure the evidence cannot show (a timeout, attempts used up): a run
    that did not succeed (no score) may count a trial as an infrastructure error. Not on SUCCEEDED."""
    def downgrade(status: str) -> Mutate:
        def change(s: dict[str, Any]) -> None:
            s["timings"]["trials"][1].update(outcome="infra_error", reward=None)
            s.update(status=status, score=None if status != "SUCCEEDED" else 1.0, reason="lease expired",
                     counts={"total": 2, "completed": 1, "resolved": 1, "unresolved": 0, "infra_errors": 1})
        return change
    _resign(release_copy, signer_v1, summary=downgrade("INFRA_ERROR"))
    verify(release_copy)
    _resign(release_copy, signer_v1, summary=downgrade("SUCCEEDED"))
    _refused(release_copy, verify, ClaimNotSupported, "summary.json")


def _valid_summary() -> dict[str, Any]:
    from pipeline.evidence.artifacts import build_summary
    from tests.fixtures.sigstore import make_inputs

    grading, payload = make_inputs({"runner": "127.0.0.1:5055/x/runner@sha256:" + "1" * 64,
                                    "api": "127.0.0.1:5055/x/api@sha256:" + "2" * 64})
    return build_summary(grading, payload).to_json_dict()


def test_score_tolerance_is_rounding_to_six_decimals() -> None:
    base = {**_valid_summary(), "status": "SUCCEEDED",
            "counts": {"total": 3, "completed": 3, "resolved": 1, "unresolved": 2, "infra_errors": 0}}
    check_summary({**base, "score": 0.333333})
    for score in (1 / 3, 0.3333333, 0.333334, 0.33333):
        with pytest.raises(SummaryInvalid):
            check_summary({**base, "score": score})


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_count = st.one_of(st.integers(min_value=-3, max_value=10**30), st.booleans(), st.floats(), st.text(max_size=3), st.none())


_VALID = _valid_summary()


@settings(max_examples=400, deadline=None)
@given(status=st.one_of(st.sampled_from(["SUCCEEDED", "FAILED", "INFRA_ERROR"]), _json),
       counts=st.one_of(st.fixed_dictionaries({k: _count for k in ("total", "completed", "resolved", "unresolved",
                                                                     "infra_errors")}), _json),
       score=st.one_of(st.floats(), st.integers(), _json), source=_json)
def test_hostile_summary_values_fail_closed_by_name(status: Any, counts: Any, score: Any, source: Any) -> None:
    """Whatever the values, the checks raise SummaryInvalid or SourceMismatch on summary.json (never another
    exception), and pass only when every rule holds."""
    from pipeline.verify.policy import Expectation
    from pipeline.verify.release import check_source

    summary = {**_VALID, "status": status, "counts": counts, "score": score, "source": source}
    expect = Expectation("local", "id", "iss", "acme/widget", "v9.9.9")
    try:
        check_source(check_summary(summary), expect)
    except (SummaryInvalid, SourceMismatch) as exc:
        assert exc.subject == "summary.json"
    try:
        check_summary(summary)
    except SummaryInvalid:
        return
    total, completed, resolved, unresolved, infra = (counts[k] for k in ("total", "completed", "resolved",
                                                                          "unresolved", "infra_errors"))
    assert all(type(v) is int and v >= 0 for v in (total, completed, resolved, unresolved, infra))
    assert resolved + unresolved <= completed <= total and completed + infra <= total
    assert (score is None) == (status != "SUCCEEDED")
    if status == "SUCCEEDED":
        assert score == round(resolved / completed, 6)


@pytest.mark.parametrize("subject", [None, "x", [], [{"name": "summary.json", "digest": ["a"]}], [5],
                                     [{"name": "summary.json", "digest": {"sha256": 5}}], [{"name": "a"}],
                                     [{"name": "a", "digest": {"sha256": "A" * 64}}], [{"name": "a", "digest": {}}]])
def test_malformed_statement_subjects_fail_by_name(subject: Any) -> None:
    """sigstore-python will not sign such statements; another signer might: fail closed, by name."""
    from pipeline.evidence.provenance import images_statement
    from pipeline.verify.release import load_statement
    from tests.fixtures.sigstore import make_inputs

    _, payload = make_inputs({"runner": "127.0.0.1:5055/x/runner@sha256:" + "1" * 64,
                              "api": "127.0.0.1:5055/x/api@sha256:" + "2" * 64})
    statement = images_statement(payload).to_json_dict()
    assert load_statement(statement, "provenance-images.intoto.json").subject
    with pytest.raises(ProvenanceMismatch) as caught:
        load_statement({**statement, "subject": subject}, IMAGES_ST)
    assert caught.value.subject == IMAGES_ST
