"""``test-result.intoto.json``: the run's result as in-toto's standard test-result attestation.

An in-toto v1 Statement with predicate type ``https://in-toto.io/attestation/test-result/v0.1``
(``pipeline.core.documents.ResultStatement``): ``result`` PASSED for a run that SUCCEEDED and that
the regression gate did not hold back, else FAILED; ``configuration`` the suite, the dataset (its
sha256) and the agent (the release's own by package URL and integrity); ``passedTests`` /
``warnedTests`` / ``failedTests`` the task ids (every attempt resolved / some / none); ``url`` the
infra's Actions run when sealed in Actions; benchseal's extension (a URI-named field) the score, its
interval, the counts and the per-task counts. Subjects: the runner image and summary.json.

Everything but the URL is derived from summary.json by ``ResultStatement.for_summary``, the rule
``benchseal verify`` checks it by. The writer signs it as DSSE like the provenance statements; the
bundle is then attached, unchanged, to the runner image (``pipeline.attest.testresult``).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.documents import ReleaseSummary, ResultStatement
from pipeline.core.fsutil import atomic_write_text, canonical_json, sha256_file
from pipeline.core.layout import TEST_RESULT
from pipeline.evidence.provenance import run_url

__all__ = ["result_statement", "write_test_result"]


def result_statement(summary: ReleaseSummary, summary_path: Path, *, url: str | None = None) -> ResultStatement:
    """The statement for ``summary`` as written at ``summary_path``; ``url`` defaults to the Actions run
    sealing it (none outside Actions)."""
    return ResultStatement.for_summary(summary, sha256_file(summary_path), url=url if url is not None else run_url())


def write_test_result(directory: Path, summary: ReleaseSummary, summary_path: Path, *, url: str | None = None) -> Path:
    """Write ``test-result.intoto.json`` into ``directory`` (the exact bytes its DSSE bundle signs)."""
    path = directory / TEST_RESULT
    statement = result_statement(summary, summary_path, url=url)
    # exclude_none: no ``url`` outside Actions (absent, not null); in-toto's field names (by alias).
    atomic_write_text(path, canonical_json(statement.model_dump(mode="json", by_alias=True, exclude_none=True)))
    return path
