"""Issue 37.7: the score, its interval and per-task pass rates for the charting tools, as Bencher Metric
Format (``bencher.bmf.json``) and github-action-benchmark's custom JSON (``github-action-benchmark.json``).

Both are checked against the formats as their projects publish them (the JSON Schemas in
``tests/fixtures/formats/``, each with a note of where the format is documented), with the figures
compared to hand-computed ones, never to the exporter's own output. The unit tests start from a
summary model; the last test reads a real sealed release (``signed_release``: write_evidence signing
with the private Sigstore instance).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pipeline.core.contracts import GradeCounts
from pipeline.core.documents import ReleaseSummary, ScoreInterval, TaskCounts, load_document
from pipeline.core.layout import ACTION_BENCHMARK_EXPORT, BENCHER_EXPORT, CHECKSUMS, bundle_name, parse_checksums
from pipeline.evidence.artifacts import build_summary
from pipeline.evidence.exports import action_benchmark, bencher_metrics, write_exports
from tests.fixtures.sigstore import make_inputs

FORMATS = Path(__file__).resolve().parents[1] / "fixtures" / "formats"
RUNNER = "127.0.0.1:5055/acme/widget-runner@sha256:" + "a" * 64
API = "127.0.0.1:5055/acme/widget-api@sha256:" + "b" * 64


def _schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((FORMATS / name).read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return schema


BMF = _schema("bencher-bmf.schema.json")
ACTION = _schema("github-action-benchmark.schema.json")


def _valid(document: Any, schema: dict[str, Any]) -> None:
    jsonschema.Draft7Validator(schema).validate(document)


def _summary(**update: Any) -> ReleaseSummary:
    grading, payload = make_inputs({"runner": RUNNER, "api": API})
    summary = build_summary(grading, payload)
    return summary.model_copy(update=update) if update else summary


def _attempts_summary() -> ReleaseSummary:
    """Three tasks over six attempts: a 2/3, b none completed (two infrastructure errors), c 1/1."""
    return _summary(
        counts=GradeCounts(total=6, completed=4, resolved=3, unresolved=1, infra_errors=2), score=0.75,
        interval=ScoreInterval(low=0.300642, high=0.954413),
        tasks={"a": TaskCounts(attempts=3, completed=3, resolved=2), "b": TaskCounts(attempts=2, completed=0, resolved=0),
               "c": TaskCounts(attempts=1, completed=1, resolved=1)})


def _dump(document: Any) -> Any:
    return json.loads(json.dumps(document.model_dump(mode="json", exclude_none=True)))


# --- the documents, from a summary model --------------------------------------------------------

def test_bencher_metrics_carry_the_score_its_interval_and_each_task() -> None:
    summary = _attempts_summary()
    document = _dump(bencher_metrics(summary))
    _valid(document, BMF)
    # The score: the summary's own interval; each task: its pass rate with the same 95 % Wilson rule
    # (2/3 gives [0.20766, 0.938508], 1/1 gives [0.206549, 1.0]: docs/evidence.md, "The score's noise").
    assert document == {
        "oracle/smoke": {"score": {"value": 0.75, "lower_value": 0.300642, "upper_value": 0.954413}},
        "oracle/smoke/a": {"pass-rate": {"value": 0.666667, "lower_value": 0.20766, "upper_value": 0.938508}},
        "oracle/smoke/c": {"pass-rate": {"value": 1.0, "lower_value": 0.206549, "upper_value": 1.0}},
    }  # task b: no attempt completed, so no pass rate (and no 0 that would chart as a regression)


def test_action_benchmark_entries_are_the_same_figures() -> None:
    summary = _attempts_summary()
    document = _dump(action_benchmark(summary))
    _valid(document, ACTION)
    assert [(e["name"], e["unit"], e["value"], e["range"]) for e in document] == [
        ("oracle/smoke", "pass rate", 0.75, "95% Wilson interval [0.300642, 0.954413]"),
        ("oracle/smoke/a", "pass rate", 0.666667, "95% Wilson interval [0.20766, 0.938508]"),
        ("oracle/smoke/c", "pass rate", 1.0, "95% Wilson interval [0.206549, 1.0]"),
    ]
    first, task_a, _ = (e["extra"].split("\n") for e in document)
    assert first[0] == "3 of 4 completed trials resolved (6 trials)"
    assert task_a[0] == "2 of 3 completed attempts resolved (3 attempts)"
    # Every tooltip names the release the figure belongs to.
    assert all(e["extra"].endswith("release v9.9.9 (acme/widget 0123456789ab), run run-evidence-0001")
               for e in document)


def test_a_summary_without_an_interval_exports_no_bounds() -> None:
    """A summary written before the interval existed (``interval`` absent): the score has no bounds;
    the tasks' come from their counts."""
    summary = _summary(interval=None)
    bmf, action = _dump(bencher_metrics(summary)), _dump(action_benchmark(summary))
    _valid(bmf, BMF)
    _valid(action, ACTION)
    assert bmf["oracle/smoke"] == {"score": {"value": 0.5}}
    assert "range" not in action[0] and action[0]["value"] == 0.5
    assert bmf["oracle/smoke/hello"]["pass-rate"]["lower_value"] == 0.206549


@pytest.mark.parametrize("status", ["FAILED", "INFRA_ERROR"])
def test_a_run_without_a_score_has_nothing_to_chart(status: str, tmp_path: Path) -> None:
    summary = _summary(status=status, score=None, interval=None)
    assert bencher_metrics(summary) is None and action_benchmark(summary) is None
    # A retry of write_evidence leaves no stale export behind.
    for name in (BENCHER_EXPORT, ACTION_BENCHMARK_EXPORT):
        (tmp_path / name).write_text("{}")
    assert write_exports(tmp_path, summary) == ()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_written_files_are_the_published_formats(tmp_path: Path) -> None:
    summary = _attempts_summary()
    written = write_exports(tmp_path, summary)
    assert [p.name for p in written] == [BENCHER_EXPORT, ACTION_BENCHMARK_EXPORT]
    bmf = json.loads((tmp_path / BENCHER_EXPORT).read_text())
    action = json.loads((tmp_path / ACTION_BENCHMARK_EXPORT).read_text())
    _valid(bmf, BMF)
    _valid(action, ACTION)
    assert set(bmf) == {"oracle/smoke", "oracle/smoke/a", "oracle/smoke/c"}
    # The order of a list is the order charted: the score first, then the tasks by name.
    assert [e["name"] for e in action] == ["oracle/smoke", "oracle/smoke/a", "oracle/smoke/c"]


def test_the_format_schemas_are_not_vacuous() -> None:
    """The fixtures refuse what the tools refuse: a metric without a value, a bound that is not a
    number, an entry without a unit, an empty list; and (stricter than the action) a key it would drop."""
    bad_bmf = [{}, {"b": {}}, {"b": {"m": {"lower_value": 0.1}}}, {"b": {"m": {"value": "0.5"}}},
               {"b": {"m" * 65: {"value": 1}}}]
    for document in bad_bmf:
        with pytest.raises(jsonschema.ValidationError):
            _valid(document, BMF)
    entry = {"name": "n", "unit": "u", "value": 1}
    bad_action = [[], {"name": "n"}, [{"name": "n", "value": 1}], [{**entry, "range": 3}], [{**entry, "os": "x"}]]
    for document in bad_action:
        with pytest.raises(jsonschema.ValidationError):
            _valid(document, ACTION)
    _valid([entry], ACTION)
    _valid({"b": {"m": {"value": 1}}}, BMF)


# --- a sealed release ------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_sealed_release_carries_both_exports_signed_through_sha256sums(signed_release: Path) -> None:
    bmf = json.loads((signed_release / BENCHER_EXPORT).read_text())
    action = json.loads((signed_release / ACTION_BENCHMARK_EXPORT).read_text())
    _valid(bmf, BMF)
    _valid(action, ACTION)
    summary = load_document(ReleaseSummary, signed_release / "summary.json")
    assert summary.interval is not None and summary.score is not None
    score = {"value": summary.score, "lower_value": summary.interval.low, "upper_value": summary.interval.high}
    assert bmf["oracle/smoke"] == {"score": score}
    assert action[0]["value"] == summary.score
    assert {e["name"] for e in action} == set(bmf) == {"oracle/smoke", "oracle/smoke/fail", "oracle/smoke/hello"}
    # Listed (and so signed) by SHA256SUMS, with no bundle of their own: no new signing path.
    sums = parse_checksums((signed_release / CHECKSUMS).read_bytes())
    assert {BENCHER_EXPORT, ACTION_BENCHMARK_EXPORT} <= set(sums)
    assert not (signed_release / bundle_name(BENCHER_EXPORT)).exists()
    assert not (signed_release / bundle_name(ACTION_BENCHMARK_EXPORT)).exists()
