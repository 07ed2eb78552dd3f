"""Exports for the charting tools: the score, its interval and each task's pass rate, as
Bencher Metric Format (``bencher.bmf.json``) and github-action-benchmark's custom JSON
(``github-action-benchmark.json``, its ``customBiggerIsBetter`` tool).

Both are derived from the typed summary (``ReleaseSummary``) by this module alone and written
beside summary.json, so SHA256SUMS lists them and its bundle signs them (no signing path of their
own). Only a scored run has them: a run without a score has nothing to chart (a 0 would read as a
regression), and a task none of whose attempts completed has no pass rate.

Names are stable across releases, which is what makes a series: the benchmark is
``<agent>/<suite>`` (the score) and ``<agent>/<suite>/<task>`` (each task's pass rate). Every
interval is the 95 % Wilson score interval (``pipeline.core.scoring``): the summary's own for the
score, the same rule over each task's completed attempts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictFloat, StringConstraints

from pipeline.core.contracts import SCORE_DIGITS, load_model
from pipeline.core.documents import ReleaseSummary
from pipeline.core.fsutil import atomic_write_text, canonical_json
from pipeline.core.layout import ACTION_BENCHMARK_EXPORT, BENCHER_EXPORT
from pipeline.core.scoring import wilson_interval

__all__ = ["ActionBenchmark", "ActionBenchmarkEntry", "BencherMetric", "BencherMetrics", "action_benchmark",
           "bencher_metrics", "write_exports"]

# Bencher's measures (its docs: a measure's slug or name is at most 64 characters).
SCORE_MEASURE = "score"
RATE_MEASURE = "pass-rate"
UNIT = "pass rate"  # github-action-benchmark's unit: a fraction in [0, 1], bigger is better
# Bencher: a benchmark's name is at most 1024 characters.
BenchmarkName = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
MeasureName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
Rate = Annotated[StrictFloat, Field(ge=0, le=1, allow_inf_nan=False)]


class _Export(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BencherMetric(_Export):
    """One BMF metric: a measure's value with its optional bounds."""

    value: Rate = Field(description="the pass rate: resolved / completed trials, rounded like the score")
    lower_value: Rate | None = Field(default=None, description="lower end of the 95 % Wilson score interval")
    upper_value: Rate | None = Field(default=None, description="upper end of the 95 % Wilson score interval")


class BencherMetrics(RootModel[dict[BenchmarkName, dict[MeasureName, BencherMetric]]]):
    """Bencher Metric Format: benchmark name -> measure -> metric (``bencher run --adapter json``)."""

    model_config = ConfigDict(frozen=True)


class ActionBenchmarkEntry(_Export):
    """One entry of github-action-benchmark's custom JSON (its ``BenchmarkResult``)."""

    name: Annotated[str, StringConstraints(min_length=1)] = Field(
        description="the series: <agent>/<suite> for the score, <agent>/<suite>/<task> for a task")
    unit: str = Field(default=UNIT, description="what value counts: a pass rate in [0, 1], bigger is better")
    value: Rate = Field(description="the pass rate: resolved / completed trials, rounded like the score")
    range: str | None = Field(default=None, description="the 95 % Wilson score interval, as text (it is not "
                                                        "symmetric, so not the tool's usual '± x')")
    extra: str | None = Field(default=None, description="tooltip lines: the counts behind the rate, and the release")


class ActionBenchmark(RootModel[tuple[ActionBenchmarkEntry, ...]]):
    """The file github-action-benchmark reads with ``tool: customBiggerIsBetter``: a list of entries."""

    model_config = ConfigDict(frozen=True)


def _rates(summary: ReleaseSummary) -> list[tuple[str, float, tuple[float, float] | None, str]]:
    """(series name, rate, interval, counts line) for the score and each task with a completed attempt;
    empty when the summary has no score."""
    if summary.score is None:
        return []
    series = f"{summary.agent.name}/{summary.suite}"
    counts = summary.counts
    interval = (summary.interval.low, summary.interval.high) if summary.interval is not None else None
    rates = [(series, summary.score, interval,
              f"{counts.resolved} of {counts.completed} completed trials resolved ({_plural(counts.total, 'trial')})")]
    for task, tally in sorted((summary.tasks or {}).items()):
        if tally.completed == 0:
            continue  # no attempt completed: no pass rate to chart
        rate = round(tally.resolved / tally.completed, SCORE_DIGITS)  # rounded like the score
        rates.append((f"{series}/{task}", rate, wilson_interval(tally.resolved, tally.completed),
                      f"{tally.resolved} of {tally.completed} completed attempts resolved "
                      f"({_plural(tally.attempts, 'attempt')})"))
    # Distinct by construction: every task's series is the score's plus '/<task>', and task names are keys.
    return rates


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def bencher_metrics(summary: ReleaseSummary) -> BencherMetrics | None:
    """The BMF document for ``summary`` (None when it has no score)."""
    rates = _rates(summary)
    if not rates:
        return None
    document: dict[str, dict[str, dict[str, float]]] = {}
    for index, (name, rate, bounds, _) in enumerate(rates):
        metric = {"value": rate} if bounds is None else {"value": rate, "lower_value": bounds[0],
                                                          "upper_value": bounds[1]}
        document[name] = {SCORE_MEASURE if index == 0 else RATE_MEASURE: metric}
    return load_model(BencherMetrics, document, BENCHER_EXPORT)


def action_benchmark(summary: ReleaseSummary) -> ActionBenchmark | None:
    """The github-action-benchmark document for ``summary`` (None when it has no score)."""
    rates = _rates(summary)
    if not rates:
        return None
    source = summary.source
    release = f"release {source.tag} ({source.repository} {source.commit[:12]}), run {summary.run_id}"
    entries = [{"name": name, "unit": UNIT, "value": rate, "extra": f"{line}\n{release}",
                **({} if bounds is None else {"range": f"95% Wilson interval [{bounds[0]}, {bounds[1]}]"})}
               for name, rate, bounds, line in rates]
    return load_model(ActionBenchmark, entries, ACTION_BENCHMARK_EXPORT)


def write_exports(directory: Path, summary: ReleaseSummary) -> tuple[Path, ...]:
    """Write both exports into ``directory`` (or remove stale ones when ``summary`` has no score)."""
    written = []
    for name, document in ((BENCHER_EXPORT, bencher_metrics(summary)),
                           (ACTION_BENCHMARK_EXPORT, action_benchmark(summary))):
        path = directory / name
        if document is None:
            path.unlink(missing_ok=True)
            continue
        # exclude_none: an absent bound or range is left out (both formats have them optional, never null).
        atomic_write_text(path, canonical_json(document.model_dump(mode="json", exclude_none=True)))
        written.append(path)
    return tuple(written)
