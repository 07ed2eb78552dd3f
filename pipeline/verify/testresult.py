"""``benchseal verify``'s check of the test-result attestation (``test-result.intoto.json``).

Run after every bundle verified (its DSSE bundle is held to the same signer as the rest: the file is
an in-toto statement, ``pipeline.core.layout.is_statement``) and after summary.json passed its own
checks. The statement must be a valid in-toto v1 Statement of predicate type
``https://in-toto.io/attestation/test-result/v0.1`` (``ResultStatement``, in-toto's field names), its
subjects exactly the runner image summary.json names (name and manifest sha256) and summary.json
itself (its sha256), and everything else what ``ResultStatement.for_summary`` derives from that
summary.json: ``result`` (PASSED only for a SUCCEEDED run the regression gate did not hold back),
``passedTests`` / ``warnedTests`` / ``failedTests`` (the tasks' counts), the configuration (suite,
dataset digest, agent and its integrity) and benchseal's extension (status, gate, score, interval,
counts, per-task counts, run id, source). ``url``, the one field summary.json cannot give, must be an
Actions run of the infra repository when the consumer pinned one.

The first disagreement raises ``TestResultMismatch`` in one line naming the field and both values
(``EvidenceMissing`` / ``NotValidJson`` when the file is absent or not JSON).
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from pipeline.core import strictjson
from pipeline.core.documents import (
    SCORE_EXTENSION,
    ReleaseSummary,
    ResultPredicate,
    ResultScore,
    ResultStatement,
    parse_document,
)
from pipeline.core.errors import EvidenceMissing, NotValidJson, TestResultMismatch, ValidationError
from pipeline.core.fsutil import sha256_file
from pipeline.core.layout import SUMMARY, TEST_RESULT

__all__ = ["check_test_result", "load_test_result"]

_TESTS = ("passedTests", "warnedTests", "failedTests")


def load_test_result(directory: Path) -> ResultStatement:
    """``test-result.intoto.json`` through its model (strict JSON first); TestResultMismatch names the field."""
    try:
        data = strictjson.loads((directory / TEST_RESULT).read_bytes())
    except FileNotFoundError:
        raise EvidenceMissing(f"{TEST_RESULT}: missing (a release carries its result as an in-toto test-result "
                              "attestation)", subject=TEST_RESULT) from None
    except (ValueError, RecursionError) as exc:
        raise NotValidJson(f"{TEST_RESULT}: not valid JSON ({exc})", subject=TEST_RESULT) from None
    try:
        return parse_document(ResultStatement, data, TEST_RESULT)
    except ValidationError as exc:
        raise TestResultMismatch(f"{exc.field}: {exc.rule} (got {repr(exc.value)[:200]}); not an in-toto "
                                 "test-result v0.1 statement as benchseal writes it", subject=TEST_RESULT) from None


def _check_url(url: str | None, infra_repository: str | None) -> None:
    if url is None or infra_repository is None:
        return  # an unpinned infra cannot be told from another
    # Any GitHub server (github.com, an Enterprise host) over https; plain http only on loopback (a
    # server on this machine, e.g. the tests' emulator). The repository is the consumer's pin.
    server = r"(?:https://[A-Za-z0-9.-]+(?::[0-9]+)?|http://(?:127\.0\.0\.1|localhost)(?::[0-9]+)?)"
    pattern = rf"{server}/{re.escape(infra_repository)}/actions/runs/[0-9]+(?:/attempts/[0-9]+)?"
    if not re.fullmatch(pattern, url):
        raise TestResultMismatch(f"{TEST_RESULT}: predicate.url {url!r} is not an Actions run of the infra "
                                 f"repository {infra_repository}", subject=TEST_RESULT)


def _shown(value: object) -> object:
    return value.model_dump(mode="json", by_alias=True) if isinstance(value, BaseModel) else value


def _first_difference(got: ResultPredicate, want: ResultPredicate, summary: ReleaseSummary) -> str:
    where = f"{TEST_RESULT}: predicate"
    if got.result != want.result:
        gated = summary.comparison is not None and summary.comparison.gated
        return (f"{where}.result is {got.result!r}, but summary.json gives {want.result!r} (status {summary.status}, "
                f"gated {str(gated).lower()})")
    for field in _TESTS:
        if getattr(got, field) != getattr(want, field):
            return (f"{where}.{field} is {list(getattr(got, field))!r}, but summary.json's tasks give "
                    f"{list(getattr(want, field))!r}")
    for name in ResultScore.model_fields:
        have, expected = getattr(got.score, name), getattr(want.score, name)
        if have != expected:
            return (f"{where}[{SCORE_EXTENSION!r}].{name} is {_shown(have)!r}, but summary.json says "
                    f"{_shown(expected)!r}")
    if got.configuration != want.configuration:
        return (f"{where}.configuration is not summary.json's suite, dataset and agent (expected "
                f"{[d.to_json_dict() for d in want.configuration]!r})")
    return f"{where} is not what summary.json gives"


def check_test_result(directory: Path, summary: ReleaseSummary, *, infra_repository: str | None = None
                      ) -> ResultStatement:
    """The release's test-result statement, checked against its (verified) summary.json; TestResultMismatch
    (one line) on the first disagreement."""
    statement = load_test_result(directory)
    runner = summary.images.runner
    summary_digest = sha256_file(directory / SUMMARY)
    subjects = [(s.name, s.digest.sha256) for s in statement.subject]
    if (runner.name, runner.digest.removeprefix("sha256:")) not in subjects:
        raise TestResultMismatch(f"{TEST_RESULT}: subject does not name the runner image of summary.json "
                                 f"({runner.ref})", subject=TEST_RESULT)
    if (SUMMARY, summary_digest) not in subjects:
        raise TestResultMismatch(f"{TEST_RESULT}: subject is not this summary.json (sha256 {summary_digest})",
                                 subject=TEST_RESULT)
    if len(subjects) != 2:
        raise TestResultMismatch(f"{TEST_RESULT}: subject must be exactly the runner image and summary.json "
                                 f"(got {len(subjects)} subjects)", subject=TEST_RESULT)
    _check_url(statement.predicate.url, infra_repository)
    expected = ResultStatement.for_summary(summary, summary_digest, url=statement.predicate.url)
    if statement.predicate != expected.predicate:
        raise TestResultMismatch(_first_difference(statement.predicate, expected.predicate, summary),
                                 subject=TEST_RESULT)
    return statement
