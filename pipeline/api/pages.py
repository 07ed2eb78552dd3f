"""The API's HTML pages: the repositories with a run, per repository its results page, and per run its
drill-down page.

Plain server-rendered HTML: one inline stylesheet, inline SVG, no script, no external asset (the
Content-Security-Policy in ``CSP`` forbids every fetch; a form may only go back to this server).
Every value that comes from the queue (repository, suite, tag, task and trial names, reasons, run
ids, digests) goes through ``_e`` (``html.escape``) and every URL is built from quoted parts, so
nothing a release, a task or an agent's failure message carries is ever markup.

The results page shows, per suite: the score history as an SVG chart (one point per scored
release, oldest left, its 95 % interval as a vertical bar, a gated release drawn as a diamond), then
every run of the repository, newest first, whatever its end: passed, gated (with the gate's
reasons), FAILED (a tamper canary that passed, ...), INFRA_ERROR, or still queued or running, each
with its one-line reason, its run id, attempts and time; runs of one tag are told apart as
``TAG #n``. Each links to its drill-down page (``/repos/OWNER/NAME/runs/RUN``: per task and per trial
outcome, reward, durations, tokens and the reason of every trial that was not resolved; tamper
canaries marked and not counted). Any two runs are compared side by side through ``?a=RUN&b=RUN``
(a form on the page picks them), else the newest scored release against the one it was compared
with. The verify hint is a command that works when pasted only when the server knows who sealed
the releases (``--infra-repo`` and ``--builder`` of ``api serve``); without them it says so. A
history row the queue cannot decode is listed under "Unreadable rows" with its run and why; the page
shows every other release.
"""

from __future__ import annotations

import html
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

from pipeline import __version__
from pipeline.core.contracts import TrialRecord, builder_problem, validate_repository
from pipeline.core.documents import Comparison, HistoryEntry, TaskCounts
from pipeline.core.errors import ValidationError
from pipeline.core.history import task_change
from pipeline.core.scoring import task_counts
from pipeline.infra.queue.reader import Unreadable
from pipeline.infra.queue.records import RunRecord

# form-action 'self': the comparison form goes back to this server (a GET of the page it is on), nowhere else.
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
GITHUB = "https://github.com"
# A release link's base: scheme and host (and port and path), no query, fragment or trailing slash.
_URL_BASE_RE = re.compile(r"\Ahttps?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~-]+)*\Z")
URL_BASE_RULE = "must be an http(s) URL of a host and an optional path, without query, fragment or trailing slash"

_CSS = """
:root { color-scheme: light; --ink: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #f6f8fa;
        --ok: #1a7f37; --bad: #cf222e; --accent: #0969da; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); background: #fff; }
header, main, footer { max-width: 1100px; margin: 0 auto; padding: 0 24px; }
header { padding-top: 20px; }
h1 { font-size: 26px; margin: 4px 0; word-break: break-all; }
h2 { font-size: 20px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 16px; margin: 20px 0 6px; }
a { color: var(--accent); }
.crumbs, .lead, figcaption, footer, .muted { color: var(--muted); }
.crumbs { margin: 0; font-size: 13px; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 13px; }
table { border-collapse: collapse; width: 100%; margin: 6px 0 12px; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--bg); font-weight: 600; font-size: 13px; }
td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
.badge { display: inline-block; padding: 0 8px; border-radius: 10px; font-size: 12px; font-weight: 600; border: 1px solid; }
.badge.gated { color: var(--bad); border-color: var(--bad); }
.badge.passed { color: var(--ok); border-color: var(--ok); }
.change.regressed { color: var(--bad); } .change.improved { color: var(--ok); }
td.gate { min-width: 220px; } .nowrap { white-space: nowrap; }
.scroll { overflow-x: auto; }
.badge.first { color: var(--muted); border-color: var(--line); }
.change { font-weight: 600; }
.change.same { color: var(--muted); font-weight: 400; }
ul.reasons { margin: 4px 0 0; padding-left: 18px; font-size: 13px; }
.delta.up { color: var(--ok); } .delta.down { color: var(--bad); }
figure { margin: 8px 0; }
svg.chart { width: 100%; max-width: 1000px; height: auto; background: #fff; border: 1px solid var(--line); border-radius: 6px; }
svg .grid { stroke: #eaeef2; stroke-width: 1; }
svg .axis { fill: var(--muted); font-size: 11px; }
svg .trend { fill: none; stroke: #8c959f; stroke-width: 1.5; stroke-dasharray: 4 3; }
svg .interval { stroke: var(--accent); stroke-width: 2; }
svg .point { fill: var(--accent); stroke: #fff; stroke-width: 1.5; }
svg .release.gated .interval { stroke: var(--bad); }
svg .point.gated { fill: var(--bad); }
svg .tag { fill: var(--ink); font-size: 11px; }
ul.repos { padding-left: 20px; }
.badge.failed, .badge.infra-error { color: #fff; background: var(--bad); border-color: var(--bad); }
.badge.queued, .badge.running, .badge.succeeded { color: var(--muted); border-color: var(--line); }
.badge.canary { color: #9a6700; border-color: #9a6700; }
tr.canary td { background: #fff8c5; }
td.reason { font-size: 13px; max-width: 420px; overflow-wrap: anywhere; }
.outcome.resolved { color: var(--ok); font-weight: 600; } .outcome.unresolved, .outcome.infra_error { color: var(--bad); font-weight: 600; }
pre.verify { background: var(--bg); border: 1px solid var(--line); border-radius: 6px; padding: 8px 10px; white-space: pre-wrap; overflow-wrap: anywhere; }
form.compare { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; margin: 8px 0; }
form.compare select { max-width: 360px; font: inherit; font-size: 13px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 8px 0; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; overflow-wrap: anywhere; }
"""


def _e(value: object) -> str:
    """``value`` as HTML text or attribute content: nothing in it is markup."""
    return html.escape(str(value), quote=True)


def validate_url_base(value: str, field: str = "--release-url-base") -> str:
    if not isinstance(value, str) or not _URL_BASE_RE.match(value):
        raise ValidationError(field, URL_BASE_RULE, value)
    return value


def release_url(base: str, repository: str, tag: str) -> str:
    """The release's evidence: ``BASE/OWNER/NAME/releases/tag/TAG``, every part quoted."""
    owner, _, name = repository.partition("/")
    return f"{base}/{quote(owner, safe='')}/{quote(name, safe='')}/releases/tag/{quote(tag, safe='')}"


def repo_path(repository: str) -> str:
    owner, _, name = repository.partition("/")
    return f"/repos/{quote(owner, safe='')}/{quote(name, safe='')}"


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<link rel=\"icon\" href=\"data:,\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n"
            f"<footer><p>benchseal {_e(__version__)} · served read-only from the infra's queue database</p></footer>\n"
            "</body></html>\n")


@dataclass(frozen=True)
class Release:
    """One history entry and the comparison recorded with it (None: none was recorded)."""

    entry: HistoryEntry
    comparison: Comparison | None


@dataclass(frozen=True)
class RepositorySummary:
    repository: str
    releases: int
    newest: HistoryEntry | None
    unreadable: int = 0  # history rows that cannot be decoded
    runs: int = 0  # every run of the repository, whatever its end


def index_page(repositories: Sequence[RepositorySummary]) -> str:
    if repositories:
        items = "".join(
            f"<li><a href=\"{_e(repo_path(r.repository))}\">{_e(r.repository)}</a> <span class=\"muted\">"
            f"{r.releases} scored release{'s' if r.releases != 1 else ''}"
            + (f"; newest {_e(r.newest.tag)}, score {r.newest.score:.3f}{' (gated)' if r.newest.gated else ''}"
               if r.newest is not None else "")
            + (f"; {r.unreadable} unreadable row{'s' if r.unreadable != 1 else ''}" if r.unreadable else "")
            + (f"; {r.runs} run{'s' if r.runs != 1 else ''} in all" if r.runs else "")
            + "</span></li>"
            for r in repositories)
        listing = f"<ul class=\"repos\">{items}</ul>"
    else:
        listing = "<p>No run is recorded yet.</p>"
    body = ("<header><h1>benchseal results</h1><p class=\"lead\">Source repositories with runs. "
            "Run status as JSON: <a href=\"/runs\">/runs</a>.</p></header>\n"
            f"<main>{listing}</main>")
    return _page("benchseal results", body)


def message_page(title: str, message: str) -> str:
    """A small page for an error (404, 400, 503): ``message`` is escaped like everything else."""
    body = (f"<header><p class=\"crumbs\"><a href=\"/\">benchseal results</a></p><h1>{_e(title)}</h1></header>\n"
            f"<main><p>{_e(message)}</p></main>")
    return _page(title, body)


# --- the results page ---------------------------------------------------------------------------

_W, _H = 760, 300
_LEFT, _RIGHT, _TOP = 52, 20, 18
_MANY = 10  # more releases than this: their tags are written slanted


def _y(value: float, bottom: int) -> float:
    return _TOP + (1.0 - value) * (_H - _TOP - bottom)


def chart(repository: str, suite: str, releases: Sequence[Release], labels: Sequence[str] | None = None) -> str:
    """The score history as inline SVG: one ``point`` per release (oldest left), its interval as a bar;
    ``labels`` name them under the axis (default: their tags; re-runs of one tag as ``TAG #n``)."""
    n = len(releases)
    names = list(labels) if labels is not None else [r.entry.tag for r in releases]
    rotate = n > _MANY
    bottom = 80 if rotate else 40
    step = (_W - _LEFT - _RIGHT) / max(n, 1)
    parts = [f"<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {_W} {_H}\" role=\"img\" "
             f"aria-label=\"{_e(f'Score history of {repository}, suite {suite}')}\">"]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = _y(tick, bottom)
        parts.append(f"<line class=\"grid\" x1=\"{_LEFT}\" x2=\"{_W - _RIGHT}\" y1=\"{y:.1f}\" y2=\"{y:.1f}\"/>"
                     f"<text class=\"axis\" x=\"{_LEFT - 8}\" y=\"{y + 4:.1f}\" text-anchor=\"end\">{tick:g}</text>")
    xs = [_LEFT + (i + 0.5) * step for i in range(n)]
    if n > 1:
        points = " ".join(f"{x:.1f},{_y(r.entry.score, bottom):.1f}" for x, r in zip(xs, releases, strict=True))
        parts.append(f"<polyline class=\"trend\" points=\"{points}\"/>")
    for x, release, name in zip(xs, releases, names, strict=True):
        entry = release.entry
        y = _y(entry.score, bottom)
        gated = " gated" if entry.gated else ""
        tip = f"{name} ({entry.run_id}): score {entry.score:.3f}"
        bar = ""
        if entry.interval is not None:
            low, high = _y(entry.interval.low, bottom), _y(entry.interval.high, bottom)
            tip += f", 95 % interval [{entry.interval.low:.3f}, {entry.interval.high:.3f}]"
            bar = (f"<line class=\"interval\" x1=\"{x:.1f}\" x2=\"{x:.1f}\" y1=\"{high:.1f}\" y2=\"{low:.1f}\"/>"
                   f"<line class=\"interval\" x1=\"{x - 5:.1f}\" x2=\"{x + 5:.1f}\" y1=\"{high:.1f}\" y2=\"{high:.1f}\"/>"
                   f"<line class=\"interval\" x1=\"{x - 5:.1f}\" x2=\"{x + 5:.1f}\" y1=\"{low:.1f}\" y2=\"{low:.1f}\"/>")
        if entry.gated:
            tip += ", gated"
            mark = (f"<path class=\"point gated\" d=\"M{x:.1f} {y - 7:.1f} L{x + 7:.1f} {y:.1f} L{x:.1f} {y + 7:.1f} "
                    f"L{x - 7:.1f} {y:.1f} Z\"/>")
        else:
            mark = f"<circle class=\"point\" cx=\"{x:.1f}\" cy=\"{y:.1f}\" r=\"5\"/>"
        label_y = _H - bottom + 18
        transform = f" transform=\"rotate(-35 {x:.1f} {label_y})\"" if rotate else ""
        anchor = "end" if rotate else "middle"
        parts.append(f"<g class=\"release{gated}\" data-tag=\"{_e(entry.tag)}\" data-run=\"{_e(entry.run_id)}\">"
                     f"<title>{_e(tip)}</title>{bar}{mark}"
                     f"<text class=\"tag\" x=\"{x:.1f}\" y=\"{label_y}\" text-anchor=\"{anchor}\"{transform}>"
                     f"{_e(name)}</text></g>")
    parts.append("</svg>")
    return "".join(parts)


def _counts(counts: TaskCounts | None) -> str:
    if counts is None:
        return "<span class=\"muted\">not run</span>"
    extra = f" <span class=\"muted\">({counts.attempts} attempts)</span>" if counts.attempts != counts.completed else ""
    return f"{counts.resolved} / {counts.completed} resolved{extra}"


def _verdict(release: Release) -> str:
    comparison = release.comparison
    if release.entry.gated:
        reasons = comparison.reasons if comparison is not None else ()
        items = "".join(f"<li>{_e(reason)}</li>" for reason in reasons)
        return "<span class=\"badge gated\">gated</span>" + (f"<ul class=\"reasons\">{items}</ul>" if items else "")
    if comparison is None or comparison.previous is None:
        return "<span class=\"badge first\">first release</span>"
    return f"<span class=\"badge passed\">passed</span> <span class=\"muted\">vs {_e(comparison.previous.tag)}</span>"


def _delta(comparison: Comparison | None) -> str:
    if comparison is None or comparison.score_delta is None:
        return ""
    delta = comparison.score_delta
    kind = "up" if delta > 0 else "down" if delta < 0 else "same"
    return f" <span class=\"delta {kind}\">({delta:+.3f})</span>"


def task_matrix(release: Release, label: str | None = None) -> str:
    """Every task of the newest release and of the release it was compared with, and what changed
    (``label``: how the page names the release, ``TAG #n`` for a re-run; default its tag)."""
    entry, comparison = release.entry, release.comparison
    name = label or entry.tag
    previous = comparison.previous if comparison is not None else None
    if previous is None:
        head = (f"<h3>Tasks of {_e(name)}</h3><p class=\"muted\">The first scored release of this suite: "
                "nothing to compare with.</p>")
        before: Mapping[str, TaskCounts] = {}
        previous_tag = "previous"
    else:
        head = f"<h3>{_e(name)} against {_e(previous.tag)}</h3>"
        before = previous.tasks
        previous_tag = previous.tag
    changes = {change.task: change.change for change in comparison.changed} if comparison is not None else {}
    rows = []
    for task in sorted(set(before) | set(entry.tasks)):
        change = changes.get(task)
        label = change if change is not None else ("unchanged" if previous is not None else "")
        css = change if change is not None else "same"
        rows.append(f"<tr data-task=\"{_e(task)}\"><td><code>{_e(task)}</code></td>"
                    f"<td class=\"num\">{_counts(before.get(task)) if previous is not None else ''}</td>"
                    f"<td class=\"num\">{_counts(entry.tasks.get(task))}</td>"
                    f"<td class=\"change {_e(css)}\">{_e(label)}</td></tr>")
    return (f"{head}<table class=\"matrix\"><thead><tr><th>Task</th><th>{_e(previous_tag)}</th><th>{_e(name)}</th>"
            f"<th>Change</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def unreadable_list(rows: Sequence[Unreadable]) -> str:
    """The history rows that cannot be decoded: each run id and the one-line reason (both escaped)."""
    if not rows:
        return ""
    items = "".join(f"<li><code>{_e(row.run_id)}</code>: unreadable: {_e(row.reason)}</li>" for row in rows)
    return (f"<section class=\"unreadable\"><h2>Unreadable rows</h2><p class=\"muted\">These releases are "
            f"recorded in the queue but their rows cannot be read; the rest of the page does not use them.</p>"
            f"<ul class=\"reasons\">{items}</ul></section>")




# --- every run of a repository, its drill-down and any two side by side ---------------------------

BUILDER_PIN_RULE = ("must be the builder as OWNER/REPO@REF (benchseal's repository and the exact ref its callers "
                    "pin: a 40-hex commit, refs/tags/NAME or refs/heads/NAME)")


@dataclass(frozen=True)
class VerifyPins:
    """Who sealed this infra's releases, as ``benchseal verify`` must be told: ``--infra-repo`` and ``--builder``."""

    infra_repository: str
    builder: str


def verify_pins(infra_repository: str | None, builder: str | None) -> VerifyPins | None:
    """Both pins checked (ValidationError naming the option), or None when neither is given. The builder
    is held to the rule the infra policy's signer is (``builder_problem`` of its benchmark.yml): the API
    image ships no YAML, so ``pipeline.verify.policy.parse_builder`` is not importable here."""
    if not infra_repository and not builder:
        return None
    if not infra_repository or not builder:
        missing = "--infra-repo" if not infra_repository else "--builder"
        raise ValidationError(missing, "must be given with the other (--infra-repo and --builder name who sealed "
                              "the releases, and a verify command needs both)", "")
    validate_repository(infra_repository, "--infra-repo")
    repository, at, ref = builder.partition("@")
    if not at or "@" in ref:
        raise ValidationError("--builder", BUILDER_PIN_RULE, builder)
    validate_repository(repository, "--builder")
    if builder_problem(f"{repository}/.github/workflows/benchmark.yml@{ref}") is not None:
        raise ValidationError("--builder", BUILDER_PIN_RULE, builder)
    return VerifyPins(infra_repository, builder)


def verify_command(repository: str, tag: str, pins: VerifyPins, release_base: str = GITHUB) -> str:
    """The ``benchseal verify`` line for ``repository``'s release at ``tag``, shell-quoted: it fetches the
    release through the GitHub API (on GitHub Enterprise, ``GITHUB_API_URL`` is BASE/api/v3)."""
    argv = ["benchseal", "verify", f"{repository}@{tag}", "--infra-repo", pins.infra_repository,
            "--builder", pins.builder]
    line = shlex.join(argv)
    return line if release_base == GITHUB else f"GITHUB_API_URL={shlex.quote(release_base + '/api/v3')} {line}"


def run_path(repository: str, run_id: str) -> str:
    return f"{repo_path(repository)}/runs/{quote(run_id, safe='')}"


def compare_path(repository: str, a: str, b: str) -> str:
    return f"{repo_path(repository)}?a={quote(a, safe='')}&b={quote(b, safe='')}#compare"


@dataclass(frozen=True)
class RunView:
    """One run of a repository as the pages show it: its queue row (None when only its history entry is
    readable) and its scored release (None: not scored, e.g. FAILED, INFRA_ERROR, still running)."""

    run_id: str
    tag: str
    commit: str
    suite: str
    created: str  # when the run was accepted (the queue's created_at; the release's finish without a row)
    record: RunRecord | None
    release: Release | None
    rerun: int = 1  # this run's place among the runs of its tag, oldest first
    reruns: int = 1

    @property
    def label(self) -> str:
        """The tag, and for a tag run more than once which run: ``v1.0.0 #2``."""
        return self.tag if self.reruns == 1 else f"{self.tag} #{self.rerun}"

    @property
    def state(self) -> str:
        return self.record.state if self.record is not None else "SUCCEEDED"

    @property
    def finished(self) -> bool:
        return self.state in ("SUCCEEDED", "FAILED", "INFRA_ERROR")

    @property
    def verdict(self) -> str:
        """One word for the run's end: passed, first, gated, succeeded (scored, not in the history),
        failed, infra-error, queued or running."""
        if self.release is not None:
            if self.release.entry.gated:
                return "gated"
            comparison = self.release.comparison
            return "first" if comparison is None or comparison.previous is None else "passed"
        return {"SUCCEEDED": "succeeded", "FAILED": "failed", "INFRA_ERROR": "infra-error", "QUEUED": "queued"}.get(
            self.state, "running")

    @property
    def reason(self) -> str | None:
        """Why the run did not pass, in one line: the gate's reasons, the grading's or the queue's reason."""
        if self.release is not None and self.release.entry.gated:
            reasons = self.release.comparison.reasons if self.release.comparison is not None else ()
            return "; ".join(reasons) or "held back by the regression gate"
        if self.record is None or self.state == "SUCCEEDED":
            return None
        grading = self.record.grading
        found = (grading.reason if grading is not None else None) or self.record.reason
        return " ".join(found.split()) if found else None

    @property
    def score(self) -> float | None:
        if self.release is not None:
            return self.release.entry.score
        grading = self.record.grading if self.record is not None else None
        return grading.score if grading is not None else None

    @property
    def trials(self) -> tuple[TrialRecord, ...]:
        grading = self.record.grading if self.record is not None else None
        return grading.trials if grading is not None else ()

    def tasks(self) -> dict[str, TaskCounts]:
        """Per task counts of the scored trials (tamper canaries left out, as the score leaves them), from
        the grading's trial records, else from the history entry."""
        scored = [(t.task, t.outcome) for t in self.trials if not t.canary]
        if scored:
            return task_counts(scored)
        return dict(self.release.entry.tasks) if self.release is not None else {}


def _when(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def run_views(records: Sequence[RunRecord], releases: Sequence[Release]) -> list[RunView]:
    """Every run of one repository, oldest first: its queue rows (``records``) joined with its history
    (``releases``) by run id; a release whose row is missing or unreadable is still a run."""
    by_run = {release.entry.run_id: release for release in releases}
    found: list[RunView] = []
    for record in records:
        source = record.payload.source
        found.append(RunView(record.run_id, source.tag, source.commit, record.payload.suite, record.created_at,
                             record, by_run.pop(record.run_id, None)))
    for release in by_run.values():
        entry = release.entry
        found.append(RunView(entry.run_id, entry.tag, entry.commit, entry.suite, entry.finished_at.isoformat(),
                             None, release))
    epoch = datetime.fromisoformat("1970-01-01T00:00:00+00:00")
    found.sort(key=lambda v: (_when(v.created) or epoch, v.run_id))
    counts: dict[str, int] = {}
    for view in found:
        counts[view.tag] = counts.get(view.tag, 0) + 1
    seen: dict[str, int] = {}
    numbered = []
    for view in found:
        seen[view.tag] = seen.get(view.tag, 0) + 1
        numbered.append(RunView(view.run_id, view.tag, view.commit, view.suite, view.created, view.record,
                                view.release, rerun=seen[view.tag], reruns=counts[view.tag]))
    return numbered


def _time(value: str) -> str:
    when = _when(value)
    if when is None:
        return _e(value)
    offset = when.utcoffset()
    return _e(when.strftime("%Y-%m-%d %H:%M:%S") + (" UTC" if offset is not None and not offset else when.strftime(" %z")))


def _badge(view: RunView) -> str:
    text = {"first": "first release", "infra-error": "infra error"}.get(view.verdict, view.verdict)
    return f"<span class=\"badge {view.verdict}\">{_e(text)}</span>"


def _interval(view: RunView) -> str:
    entry = view.release.entry if view.release is not None else None
    if entry is None or entry.interval is None:
        return "<span class=\"muted\">none</span>"
    return f"[{entry.interval.low:.3f}, {entry.interval.high:.3f}]"


def _score(view: RunView) -> str:
    score = view.score
    if score is None:
        return "<span class=\"muted\">unscored</span>"
    return f"{score:.3f}{_delta(view.release.comparison if view.release is not None else None)}"


def _attempts(view: RunView) -> str:
    record = view.record
    return "" if record is None else f"attempt {record.attempts} of {record.max_attempts}"


def _run_cell(repository: str, view: RunView) -> str:
    rerun = (f" <span class=\"muted\">(run {view.rerun} of {view.reruns} of this tag)</span>"
             if view.reruns > 1 else "")
    return (f"<a class=\"drill\" href=\"{_e(run_path(repository, view.run_id))}\"><strong>{_e(view.label)}</strong></a>"
            f"{rerun}<br><span class=\"mono muted\" title=\"{_e(view.commit)}\">{_e(view.commit[:12])}</span>"
            f" <span class=\"mono muted nowrap\">{_e(view.run_id)}</span><br>"
            f"<span class=\"muted nowrap\">{_time(view.created)}</span> <span class=\"muted nowrap\">"
            f"{_e(_attempts(view))}</span>")


def _verdict_cell(view: RunView) -> str:
    if view.release is not None:
        return _verdict(view.release)  # the badge and, when gated, each reason on its line
    reason = view.reason
    return _badge(view) + (f"<div class=\"reason\">{_e(reason)}</div>" if reason else "")


def runs_table(repository: str, views: Sequence[RunView], release_base: str) -> str:
    """Every run, newest first: release (linked to its drill-down), verdict and reason, score, interval,
    sealed summary, evidence."""
    rows = []
    for view in reversed(views):
        entry = view.release.entry if view.release is not None else None
        sealed = (f"<span class=\"mono nowrap\" title=\"{_e(entry.summary_digest)}\">{_e(entry.summary_digest[:17])}…</span>"
                  if entry is not None and entry.summary_digest else "<span class=\"muted\">not sealed yet</span>"
                  if entry is not None else "")
        reason = view.reason
        rows.append(
            f"<tr class=\"release {_e(view.verdict)}{' gated' if view.verdict == 'gated' else ''}\" "
            f"data-tag=\"{_e(view.tag)}\" data-run=\"{_e(view.run_id)}\" data-verdict=\"{_e(view.verdict)}\""
            + (f" data-reason=\"{_e(reason)}\"" if reason else "") + ">"
            f"<td>{_run_cell(repository, view)}</td>"
            f"<td class=\"gate\">{_verdict_cell(view)}</td>"
            f"<td class=\"num\">{_score(view)}</td>"
            f"<td class=\"num\">{_interval(view)}</td>"
            f"<td>{sealed}</td>"
            f"<td class=\"nowrap\"><a class=\"evidence\" href=\"{_e(release_url(release_base, repository, view.tag))}\">"
            "evidence</a></td></tr>")
    return ("<div class=\"scroll\"><table class=\"releases\"><thead><tr><th>Release (run)</th><th>Verdict and reason</th>"
            "<th>Score</th><th>95 % interval</th><th>Sealed summary</th><th>Evidence</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def _option(view: RunView, selected: str | None) -> str:
    chosen = " selected" if view.run_id == selected else ""
    score = f"{view.score:.3f}" if view.score is not None else view.verdict
    return f"<option value=\"{_e(view.run_id)}\"{chosen}>{_e(f'{view.label} · {score} · {view.run_id}')}</option>"


def compare_form(views: Sequence[RunView], a: str | None, b: str | None) -> str:
    """Two runs to set side by side: a GET of this page with ``a`` and ``b`` (no script, no action URL)."""
    newest_first = list(reversed(views))
    pick_b = b or (newest_first[0].run_id if newest_first else None)
    pick_a = a or (newest_first[1].run_id if len(newest_first) > 1 else pick_b)
    options_a = "".join(_option(v, pick_a) for v in newest_first)
    options_b = "".join(_option(v, pick_b) for v in newest_first)
    return ("<form class=\"compare\" method=\"get\"><label>Compare <select name=\"a\">" + options_a + "</select></label>"
            "<label>with <select name=\"b\">" + options_b + "</select></label><button type=\"submit\">Compare</button>"
            "</form>")


def _counts_cell(counts: TaskCounts | None) -> str:
    return f"<td class=\"num\">{_counts(counts)}</td>"


def comparison_section(repository: str, a: RunView, b: RunView) -> str:
    """Two runs side by side: their facts, then every task of either with what changed from ``a`` to ``b``."""
    facts: list[tuple[str, Callable[[RunView], str]]] = [
             ("Run", lambda v: f"<a href=\"{_e(run_path(repository, v.run_id))}\">{_e(v.label)}</a> "
                               f"<span class=\"mono muted\">{_e(v.run_id)}</span>"),
             ("Commit", lambda v: f"<span class=\"mono\">{_e(v.commit[:12])}</span>"),
             ("Accepted", lambda v: _time(v.created)),
             ("Verdict", _verdict_cell),
             ("Score", _score),
             ("95 % interval", _interval)]
    rows = "".join(f"<tr><th>{_e(name)}</th><td>{show(a)}</td><td>{show(b)}</td></tr>" for name, show in facts)
    before, after = a.tasks(), b.tasks()
    task_rows = []
    for task in sorted(set(before) | set(after)):
        change = task_change(before.get(task), after.get(task))
        task_rows.append(f"<tr data-task=\"{_e(task)}\"><td><code>{_e(task)}</code></td>{_counts_cell(before.get(task))}"
                         f"{_counts_cell(after.get(task))}<td class=\"change {_e(change or 'same')}\">"
                         f"{_e(change or 'unchanged')}</td></tr>")
    return (f"<section id=\"compare\" class=\"compare\" data-a=\"{_e(a.run_id)}\" data-b=\"{_e(b.run_id)}\">"
            f"<h2>{_e(a.label)} against {_e(b.label)}</h2>"
            f"<table class=\"side\"><thead><tr><th></th><th>{_e(a.label)}</th><th>{_e(b.label)}</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
            f"<table class=\"matrix compared\"><thead><tr><th>Task</th><th>{_e(a.label)}</th><th>{_e(b.label)}</th>"
            f"<th>Change</th></tr></thead><tbody>{''.join(task_rows)}</tbody></table></section>")


def verify_hint(repository: str, pins: VerifyPins | None, release_base: str, tag: str = "TAG") -> str:
    if pins is None:
        return ("<p class=\"verify muted\">To check a release: <code>benchseal verify "
                f"{_e(repository)}@TAG --infra-repo INFRA_OWNER/NAME --builder OWNER/REPO@REF</code> with the "
                "infra repository and builder that sealed it; this server was started without "
                "<code>--infra-repo</code> and <code>--builder</code>, so it cannot print them.</p>")
    return (f"<p class=\"muted\">Check the signed evidence published for {_e(tag)} (paste as is):</p>"
            f"<pre class=\"verify\"><code>{_e(verify_command(repository, tag, pins, release_base))}</code></pre>")


def results_page(repository: str, views: Sequence[RunView], release_base: str, *,
                 unreadable: Sequence[Unreadable] = (), pins: VerifyPins | None = None,
                 compared: tuple[RunView, RunView] | None = None) -> str:
    """The results page of ``repository``: ``views`` (every run, oldest first, all suites), ``unreadable``
    (history rows that cannot be decoded, listed apart), ``compared`` (the two runs asked for by ``?a=&b=``)."""
    suites: dict[str, list[RunView]] = {}
    for view in views:
        suites.setdefault(view.suite, []).append(view)
    sections = []
    for suite, ordered in suites.items():
        scored = [v for v in ordered if v.release is not None]
        releases = [v.release for v in scored if v.release is not None]
        history = (f"<h3>Score history</h3><figure>{chart(repository, suite, releases, [v.label for v in scored])}"
                   "<figcaption>Score of each scored release (oldest left) with its 95 % Wilson interval; a red "
                   "diamond is a release the regression gate held back; re-runs of a tag are numbered (#2).</figcaption>"
                   "</figure>" if releases else "<p class=\"muted\">No scored release in this suite yet.</p>")
        newest = scored[-1] if scored else None
        sections.append(
            f"<section class=\"suite\" data-suite=\"{_e(suite)}\"><h2>Suite <code>{_e(suite)}</code></h2>{history}"
            f"<h3>Runs</h3>{runs_table(repository, ordered, release_base)}"
            f"{task_matrix(newest.release, newest.label) if newest is not None and newest.release is not None else ''}"
            "</section>")
    count = sum(1 for v in views if v.release is not None)
    compare = (f"<section class=\"pick\"><h2>Compare two runs</h2>"
               f"{compare_form(views, compared[0].run_id if compared else None, compared[1].run_id if compared else None)}"
               "</section>" if len(views) > 1 else "")
    # The newest run that ended: a queued or running one has published nothing yet.
    newest_tag = next((v.tag for v in reversed(views) if v.finished), "TAG")
    body = (f"<header><p class=\"crumbs\"><a href=\"/\">benchseal results</a></p><h1>{_e(repository)}</h1>"
            f"<p class=\"lead\">{len(views)} run{'s' if len(views) != 1 else ''}, {count} scored "
            f"release{'s' if count != 1 else ''} in {len(suites)} suite{'s' if len(suites) != 1 else ''}. "
            "Each run opens on its tasks and trials; each links to its tag's signed evidence.</p>"
            f"{verify_hint(repository, pins, release_base, newest_tag)}</header>\n"
            f"<main>{comparison_section(repository, *compared) if compared else ''}{''.join(sections)}{compare}"
            f"{unreadable_list(unreadable)}</main>")
    return _page(f"{repository} · benchseal results", body)


# --- one run ----------------------------------------------------------------------------------------

_OUTCOME = {"resolved": "resolved", "unresolved": "unresolved", "infra_error": "infra error"}


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} s"


def _tokens(trial: TrialRecord) -> str:
    if trial.input_tokens is None and trial.output_tokens is None and trial.model_calls is None:
        return "<span class=\"muted\">n/a</span>"
    parts = [f"{trial.input_tokens if trial.input_tokens is not None else '?'} in / "
             f"{trial.output_tokens if trial.output_tokens is not None else '?'} out"]
    if trial.model_calls is not None:
        parts.append(f"{trial.model_calls} call{'s' if trial.model_calls != 1 else ''}")
    return _e(", ".join(parts))


def trial_reason(trial: TrialRecord) -> str | None:
    """The one line a trial that was not resolved is shown with (None for a resolved one)."""
    if trial.outcome == "resolved" and not trial.canary:
        return None
    if trial.outcome == "resolved":
        return "a tamper canary passed: its tests cannot be passed honestly"
    return trial.reason or (f"{trial.exception_type}" if trial.exception_type else "no reason was recorded")


def trials_table(trials: Sequence[TrialRecord]) -> str:
    rows = []
    for trial in trials:
        reason = trial_reason(trial)
        canary = " <span class=\"badge canary\">canary · not counted</span>" if trial.canary else ""
        reward = "" if trial.reward is None else f"{trial.reward:g}"
        rows.append(
            f"<tr class=\"trial {_e(trial.outcome)}{' canary' if trial.canary else ''}\" data-task=\"{_e(trial.task)}\" "
            f"data-trial=\"{_e(trial.trial_name)}\" data-outcome=\"{_e(trial.outcome)}\">"
            f"<td><code>{_e(trial.task)}</code>{canary}<br><span class=\"mono muted\">{_e(trial.trial_name)}</span></td>"
            f"<td class=\"outcome {_e(trial.outcome)}\">{_e(_OUTCOME.get(trial.outcome, trial.outcome))}</td>"
            f"<td class=\"num\">{_e(reward)}</td>"
            f"<td class=\"num\">{_e(_seconds(trial.total_seconds))}<br><span class=\"muted\">agent "
            f"{_e(_seconds(trial.agent_seconds) or '–')}, verifier {_e(_seconds(trial.verifier_seconds) or '–')}</span></td>"
            f"<td class=\"num\">{_tokens(trial)}</td>"
            f"<td class=\"reason\">{_e(reason) if reason else ''}</td></tr>")
    return ("<div class=\"scroll\"><table class=\"trials\"><thead><tr><th>Task, trial</th><th>Outcome</th><th>Reward</th>"
            "<th>Duration</th><th>Tokens</th><th>Why not resolved</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def tasks_table(view: RunView) -> str:
    counted = view.tasks()
    canaries = sorted({t.task for t in view.trials if t.canary} - set(counted))
    rows = []
    for task in sorted(counted):
        counts = counted[task]
        seconds = [t.total_seconds for t in view.trials if t.task == task and t.total_seconds is not None]
        mean = f"{sum(seconds) / len(seconds):.1f} s" if seconds else ""
        rows.append(f"<tr data-task=\"{_e(task)}\"><td><code>{_e(task)}</code></td><td class=\"num\">{_counts(counts)}</td>"
                    f"<td class=\"num\">{counts.attempts - counts.completed}</td><td class=\"num\">{_e(mean)}</td></tr>")
    for task in canaries:
        trials = [t for t in view.trials if t.task == task]
        passed = sum(t.outcome == "resolved" for t in trials)
        rows.append(f"<tr class=\"canary\" data-task=\"{_e(task)}\"><td><code>{_e(task)}</code> <span class=\"badge "
                    f"canary\">canary · not counted</span></td><td class=\"num\">{passed} / {len(trials)} passed "
                    "(must be 0)</td><td class=\"num\"></td><td class=\"num\"></td></tr>")
    return ("<table class=\"tasks\"><thead><tr><th>Task</th><th>Resolved</th><th>Infra errors</th><th>Mean duration</th>"
            f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def run_page(repository: str, view: RunView, release_base: str, *, pins: VerifyPins | None = None,
             previous: RunView | None = None) -> str:
    """One run: its facts and reason, per task and per trial (``previous``: the run before it, to compare)."""
    record = view.record
    grading = record.grading if record is not None else None
    facts = [("Tag", _e(view.tag) + (f" <span class=\"muted\">(run {view.rerun} of {view.reruns} of this tag)</span>"
                                     if view.reruns > 1 else "")),
             ("Commit", f"<span class=\"mono\">{_e(view.commit)}</span>"),
             ("Run", f"<span class=\"mono\">{_e(view.run_id)}</span>"),
             ("Suite", f"<code>{_e(view.suite)}</code>"),
             ("State", f"{_e(view.state)} {_badge(view)}"),
             ("Accepted", _time(view.created))]
    if record is not None:
        facts += [("Attempts", _e(_attempts(view))), ("Agent", _e(record.payload.agent)), ("Last change", _time(record.updated_at))]
    facts += [("Score", _score(view)), ("95 % interval", _interval(view))]
    if grading is not None:
        c = grading.counts
        facts.append(("Trials", f"{c.total} scored: {c.resolved} resolved, {c.unresolved} unresolved, "
                                f"{c.infra_errors} infra errors"))
    reason = view.reason
    if view.release is not None and view.release.entry.gated:
        facts.append(("Gate", _verdict(view.release)))
    elif reason:
        facts.append(("Reason", f"<span class=\"reason\">{_e(reason)}</span>"))
    listing = "".join(f"<dt>{_e(name)}</dt><dd>{value}</dd>" for name, value in facts)
    trials = (trials_table(view.trials) if view.trials else
              "<p class=\"muted\">No per-trial record is kept for this run (only its per-task counts).</p>")
    links = [f"<a href=\"{_e(release_url(release_base, repository, view.tag))}\">signed evidence of {_e(view.tag)}</a>"]
    if previous is not None:
        links.append(f"<a class=\"compare-previous\" href=\"{_e(compare_path(repository, previous.run_id, view.run_id))}\">"
                     f"compare with {_e(previous.label)}</a>")
    body = (f"<header><p class=\"crumbs\"><a href=\"/\">benchseal results</a> / <a href=\"{_e(repo_path(repository))}\">"
            f"{_e(repository)}</a></p><h1>{_e(view.label)} <span class=\"muted\">{_e(view.run_id)}</span></h1>"
            f"<p class=\"lead\">{' · '.join(links)}</p></header>\n"
            f"<main><dl class=\"facts\">{listing}</dl>"
            + (verify_hint(repository, pins, release_base, view.tag) if view.finished else
               "<p class=\"verify muted\">This run has not ended: nothing of it is published yet.</p>")
            + f"<h2>Tasks</h2>{tasks_table(view)}<h2>Trials</h2>{trials}</main>")
    return _page(f"{view.label} · {repository} · benchseal results", body)
