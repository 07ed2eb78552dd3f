"""The API's HTML pages: the repositories with a scored release, and per repository its results page.

Plain server-rendered HTML: one inline stylesheet, inline SVG, no script, no external asset (the
Content-Security-Policy in ``CSP`` forbids every fetch). Every value that comes from the queue
(repository, suite, tag, task names, gate reasons, run ids, digests) goes through ``_e``
(``html.escape``) and every URL is built from quoted parts, so nothing a release or a task carries
is ever markup.

The results page shows, per suite: the score history as an SVG chart (one point per release, oldest
left, its 95 % interval as a vertical bar, a gated release drawn as a diamond), the releases (newest
first: tag, commit, score and its change, interval, the gate's verdict and reasons, run, sealed
summary digest, a link to the release's evidence) and the per-task matrix of the newest release
against the release it was compared with. A history row the queue cannot decode is listed under
"Unreadable rows" with its run and why; the page shows every other release.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from pipeline import __version__
from pipeline.core.documents import Comparison, HistoryEntry, TaskCounts
from pipeline.core.errors import ValidationError
from pipeline.infra.queue.reader import Unreadable

CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; "
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


def index_page(repositories: Sequence[RepositorySummary]) -> str:
    if repositories:
        items = "".join(
            f"<li><a href=\"{_e(repo_path(r.repository))}\">{_e(r.repository)}</a> <span class=\"muted\">"
            f"{r.releases} scored release{'s' if r.releases != 1 else ''}"
            + (f"; newest {_e(r.newest.tag)}, score {r.newest.score:.3f}{' (gated)' if r.newest.gated else ''}"
               if r.newest is not None else "")
            + (f"; {r.unreadable} unreadable row{'s' if r.unreadable != 1 else ''}" if r.unreadable else "")
            + "</span></li>"
            for r in repositories)
        listing = f"<ul class=\"repos\">{items}</ul>"
    else:
        listing = "<p>No scored release is recorded yet.</p>"
    body = ("<header><h1>benchseal results</h1><p class=\"lead\">Source repositories with scored releases. "
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


def chart(repository: str, suite: str, releases: Sequence[Release]) -> str:
    """The score history as inline SVG: one ``point`` per release (oldest left), its interval as a bar."""
    n = len(releases)
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
    for x, release in zip(xs, releases, strict=True):
        entry = release.entry
        y = _y(entry.score, bottom)
        gated = " gated" if entry.gated else ""
        tip = f"{entry.tag}: score {entry.score:.3f}"
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
                     f"{_e(entry.tag)}</text></g>")
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


def releases_table(repository: str, releases: Sequence[Release], release_base: str) -> str:
    rows = []
    for release in reversed(releases):
        entry = release.entry
        interval = (f"[{entry.interval.low:.3f}, {entry.interval.high:.3f}]" if entry.interval is not None
                    else "<span class=\"muted\">none</span>")
        sealed = (f"<span class=\"mono nowrap\" title=\"{_e(entry.summary_digest)}\">{_e(entry.summary_digest[:17])}…</span>"
                  if entry.summary_digest else "<span class=\"muted\">not sealed yet</span>")
        rows.append(
            f"<tr class=\"release{' gated' if entry.gated else ''}\" data-tag=\"{_e(entry.tag)}\">"
            f"<td><strong>{_e(entry.tag)}</strong><br><span class=\"mono muted\" title=\"{_e(entry.commit)}\">"
            f"{_e(entry.commit[:12])}</span></td>"
            f"<td class=\"num\">{entry.score:.3f}{_delta(release.comparison)}</td>"
            f"<td class=\"num\">{interval}</td>"
            f"<td class=\"gate\">{_verdict(release)}</td>"
            f"<td><span class=\"mono nowrap\">{_e(entry.run_id)}</span><br>{sealed}</td>"
            f"<td class=\"nowrap\"><a href=\"{_e(release_url(release_base, repository, entry.tag))}\">evidence</a></td></tr>")
    return ("<div class=\"scroll\"><table class=\"releases\"><thead><tr><th>Release</th><th>Score</th><th>95 % interval</th>"
            "<th>Gate</th><th>Infra run, sealed summary</th><th>Evidence</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def task_matrix(release: Release) -> str:
    """Every task of the newest release and of the release it was compared with, and what changed."""
    entry, comparison = release.entry, release.comparison
    previous = comparison.previous if comparison is not None else None
    if previous is None:
        head = (f"<h3>Tasks of {_e(entry.tag)}</h3><p class=\"muted\">The first scored release of this suite: "
                "nothing to compare with.</p>")
        before: Mapping[str, TaskCounts] = {}
        previous_tag = "previous"
    else:
        head = f"<h3>{_e(entry.tag)} against {_e(previous.tag)}</h3>"
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
    return (f"{head}<table class=\"matrix\"><thead><tr><th>Task</th><th>{_e(previous_tag)}</th><th>{_e(entry.tag)}</th>"
            f"<th>Change</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def unreadable_list(rows: Sequence[Unreadable]) -> str:
    """The history rows that cannot be decoded: each run id and the one-line reason (both escaped)."""
    if not rows:
        return ""
    items = "".join(f"<li><code>{_e(row.run_id)}</code>: unreadable: {_e(row.reason)}</li>" for row in rows)
    return (f"<section class=\"unreadable\"><h2>Unreadable rows</h2><p class=\"muted\">These releases are "
            f"recorded in the queue but their rows cannot be read; the rest of the page does not use them.</p>"
            f"<ul class=\"reasons\">{items}</ul></section>")


def results_page(repository: str, releases: Sequence[Release], release_base: str,
                 unreadable: Sequence[Unreadable] = ()) -> str:
    """The results page of ``repository`` (``releases`` oldest first, all suites; ``unreadable``: its
    history rows that cannot be decoded, listed apart)."""
    suites: dict[str, list[Release]] = {}
    for release in releases:
        suites.setdefault(release.entry.suite, []).append(release)
    sections = []
    for suite, ordered in suites.items():
        newest = ordered[-1]
        sections.append(
            f"<section class=\"suite\" data-suite=\"{_e(suite)}\"><h2>Suite <code>{_e(suite)}</code></h2>"
            f"<h3>Score history</h3><figure>{chart(repository, suite, ordered)}<figcaption>Score of each release "
            "(oldest left) with its 95 % Wilson interval; a red diamond is a release the regression gate held back."
            "</figcaption></figure>"
            f"<h3>Releases</h3>{releases_table(repository, ordered, release_base)}"
            f"{task_matrix(newest)}</section>")
    count = len(releases)
    body = (f"<header><p class=\"crumbs\"><a href=\"/\">benchseal results</a></p><h1>{_e(repository)}</h1>"
            f"<p class=\"lead\">{count} scored release{'s' if count != 1 else ''} in {len(suites)} "
            f"suite{'s' if len(suites) != 1 else ''}. Each links to its signed evidence; "
            f"<code>benchseal verify {_e(repository)}@TAG</code> checks it.</p></header>\n"
            f"<main>{''.join(sections)}{unreadable_list(unreadable)}</main>")
    return _page(f"{repository} · benchseal results", body)
