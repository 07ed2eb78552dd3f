"""The benchmark section of a release body, and splicing it into a body someone else owns.

The release body belongs to the maintainers; benchseal owns only the text between
``<!-- benchseal:start -->`` and ``<!-- benchseal:end -->``. ``splice`` keeps every
other byte, so a re-run, a hand-edited body, a body with two sections or a body
missing one marker ends with exactly one section and never loses maintainer text.
A body over GitHub's 125,000-character limit is refused before anything is sent.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.core.documents import Comparison, ReleaseSummary, TaskCounts, parse_document
from pipeline.core.errors import ValidationError, escape_text

START = "<!-- benchseal:start -->"
END = "<!-- benchseal:end -->"
# What a marker that pairs with nothing, or a second section, is rewritten to. Each begins with
# "<" and ends with ">", so it can never join neighbouring text into a marker.
UNPAIRED_START = "<!-- benchseal:unpaired-start -->"
UNPAIRED_END = "<!-- benchseal:unpaired-end -->"
DUPLICATE_REMOVED = "<!-- benchseal:duplicate-section-removed -->"
# GitHub refuses a release body longer than this (422).
MAX_BODY_CHARS = 125_000
_MARKER_RE = re.compile(f"{re.escape(START)}|{re.escape(END)}")
# The section's last line: the release assets benchseal wrote, by name and sha256. It is what
# proves an asset is benchseal's to replace or remove (the target checks the asset's bytes still
# hash to the recorded digest); nothing a cell renders can form it (no "<" survives escaping).
ASSET_RECORD = "<!-- benchseal:assets"
_RECORD_ITEM_RE = re.compile(r"\A[A-Za-z0-9._+-]+=[0-9a-f]{64}\Z")
_RECORD_RE = re.compile(r"\A<!-- benchseal:assets((?: [A-Za-z0-9._+-]+=[0-9a-f]{64})*) -->\Z")


@dataclass(frozen=True)
class SectionFacts:
    """What the section shows, read from summary.json (see ``facts_from_summary``)."""

    tag: str
    status: str
    suite: str
    dataset: str
    evaluation: str
    total: int
    completed: int
    resolved: int
    unresolved: int
    infra_errors: int
    score: float | None
    reason: str | None
    runner_ref: str
    api_ref: str
    harbor_version: str
    agent: str
    agent_release: str | None  # the release's own agent: package, version, integrity, source commit
    source_repository: str
    source_commit: str
    run_id: str
    correlation_id: str
    source_tag: str  # the tag the run benchmarked (summary.json source.tag); a target checks it is ``tag``
    # The score's 95 % Wilson interval (low, high), when summary.json states one (a scored run).
    interval: tuple[float, float] | None = None
    # Each worker that ran trials (how many) and the one that graded the run (summary.json), one line.
    workers: str | None = None
    # Per task (task, resolved, attempts), shown when some task ran more than once.
    task_passes: tuple[tuple[str, int, int], ...] = ()
    # The comparison with the repository's previous scored release and the regression gate.
    comparison: Comparison | None = None
    # Each trial not resolved: (task, what, the grading rule's one-line reason); a canary's "what" says so.
    failed_trials: tuple[tuple[str, str, str], ...] = ()
    # The sha256 of the infra policy file the run was run and graded under (summary.json policy_digest).
    policy_digest: str | None = None


def facts_from_summary(summary: ReleaseSummary | Mapping[str, Any], tag: str) -> SectionFacts:
    """The section's facts from summary.json (``ReleaseSummary``; parsed JSON goes through the model)."""
    if not isinstance(summary, ReleaseSummary):
        summary = parse_document(ReleaseSummary, summary, "summary.json")
    version = summary.agent.version
    agent_version = ", ".join(version) if isinstance(version, tuple) else version
    agent = f"{summary.agent.name} {agent_version}" if agent_version else summary.agent.name
    if summary.agent.model:
        usage = summary.model_usage
        calls = f"; {usage.model_calls} model calls, {usage.input_tokens} input / {usage.output_tokens} output tokens" \
            if usage is not None else ""
        agent += f" (model {summary.agent.model}{calls})"
    release = summary.agent.release
    agent_release = (f"{release.kind} {release.package}@{release.version}, {release.integrity}, "
                     f"built from {release.source_commit}") if release is not None else None
    revision = summary.dataset.pinned  # the content digest (an old summary: its directory revision)
    return SectionFacts(
        tag=tag,
        status=summary.status,
        # A subset run says so where the suite is named: its score is not the whole suite's.
        suite=summary.suite + (f" (subset of {len(summary.dataset.subset)} tasks)" if summary.dataset.subset else ""),
        dataset=f"{summary.dataset.name}@{revision}" if revision else summary.dataset.name,
        evaluation=summary.evaluation_method,
        total=summary.counts.total,
        completed=summary.counts.completed,
        resolved=summary.counts.resolved,
        unresolved=summary.counts.unresolved,
        infra_errors=summary.counts.infra_errors,
        score=summary.score,
        reason=summary.reason,
        runner_ref=summary.images.runner.ref,
        api_ref=summary.images.api.ref,
        harbor_version=summary.harbor_version or "unknown",
        agent=agent,
        agent_release=agent_release,
        source_repository=summary.source.repository,
        source_commit=summary.source.commit,
        run_id=summary.run_id,
        correlation_id=summary.correlation_id,
        source_tag=summary.source.tag,
        interval=(summary.interval.low, summary.interval.high) if summary.interval is not None else None,
        workers=_workers(summary),
        task_passes=tuple((task, c.resolved, c.attempts) for task, c in sorted((summary.tasks or {}).items())),
        comparison=summary.comparison,
        failed_trials=tuple((t.task, "canary, not scored" if t.canary else t.outcome, t.reason or "no reason recorded")
                            for t in summary.timings.trials if t.outcome != "resolved"),
        policy_digest=summary.policy_digest,
    )


def _workers(summary: ReleaseSummary) -> str | None:
    """``<worker>: N trials, ...; graded by <worker>`` from summary.json (None before workers were recorded)."""
    ran: dict[str, int] = {}
    for trial in summary.timings.trials:
        if trial.worker:
            ran[trial.worker] = ran.get(trial.worker, 0) + 1
    if not ran and summary.graded_by is None:
        return None
    items = [f"{worker}: {n} trial{'' if n == 1 else 's'}" for worker, n in sorted(ran.items())]
    # A run refused at planning or ended as INFRA_ERROR before any trial ran still names the worker that decided it.
    line = (_first(items, "summary.json timings.trials") if items else
            "no trial names its worker" if summary.timings.trials else "no trial ran")
    return line + (f"; graded by {summary.graded_by}" if summary.graded_by else "")


# GitHub links these after rendering (mentions and emails, issue refs, URL schemes, emoji
# shortcodes), on the HTML's text, so a backslash escape does not stop it; its filters skip
# code, so a run of them is written as one code span.
_LINKED_AFTER_RENDER = frozenset("@#:")
_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}
# A value shown as code as it is: nothing in it is Markdown or ends the span or the cell.
_PLAIN_CODE_RE = re.compile(r"\A[A-Za-z0-9._:/@+=-]+\Z")


def markdown_cell(value: object) -> str:
    """``value`` as inert Markdown for a table cell or heading: the one escaper of the body.

    Every character shows as itself and nothing becomes markup, a link or a mention: what
    ``str.isprintable`` rejects (newline, CR, U+2028/U+2029, bidi controls, zero-width
    characters) is written as a visible ``\\uNNNN`` escape (``pipeline.core.errors.escape_text``;
    a backslash of the value shows doubled, so the escapes read back unambiguously); ``<``,
    ``>``, ``&`` become entities (no HTML, no comment that could fake a marker); ``@``, ``#``
    and ``:`` become code (no mention, issue reference, autolink or emoji); every other ASCII
    punctuation character is backslash-escaped (no link, image, emphasis, code span, fence or
    table pipe). Spaces at either end are entities, so the cell keeps them.
    """
    text = escape_text(str(value).replace("\\", "\\\\"))
    out: list[str] = []
    linked = ""
    for char in text:
        if char in _LINKED_AFTER_RENDER:
            linked += char
            continue
        if linked:
            out.append(f"`{linked}`")
            linked = ""
        if char in _ENTITIES:
            out.append(_ENTITIES[char])
        elif char.isascii() and not char.isalnum() and char != " ":
            out.append("\\" + char)
        else:
            out.append(char)
    if linked:
        out.append(f"`{linked}`")
    cell = "".join(out)
    stripped = cell.strip(" ")
    if stripped != cell:
        lead = len(cell) - len(cell.lstrip(" "))
        trail = len(cell) - len(cell.rstrip(" "))
        cell = "&#32;" * lead + stripped + "&#32;" * trail if stripped else "&#32;" * len(cell)
    return cell


def _code(value: object) -> str:
    text = str(value)
    return f"`{text}`" if _PLAIN_CODE_RE.match(text) else markdown_cell(text)


def _code_line(command: str) -> str:
    """One line of the fenced commands block: no line break, no fence, no marker."""
    return escape_text(command).replace("<!--", "&lt;!--").replace("```", "'''")


def _interval(bounds: tuple[float, float]) -> str:
    # Brackets escaped: the cell shows [low, high], never a link.
    return f"\\[{bounds[0]:.3f}, {bounds[1]:.3f}\\]"


# A release body has a length limit: the folded per-task table lists a suite's first tasks (summary.json has all).
MAX_TASKS_SHOWN = 250
# The facts table is the body's first screen: a cell names at most this many tasks (a 164-task suite's every
# failure or change is in the folded per-task table below it, summary.json and trial-results.json).
INLINE_TASKS = 10
# A reason in the folded per-task table is cut to this many characters (trial-results.json has it whole).
REASON_CHARS = 100


def _first(items: Sequence[str], where: str, sep: str = ", ") -> str:
    """``items`` joined by ``sep``, at most INLINE_TASKS of them; how many more and ``where`` they are."""
    more = len(items) - INLINE_TASKS
    return sep.join(items[:INLINE_TASKS]) + (f"{sep}and {more} more ({where})" if more > 0 else "")


def _task_passes(passes: Sequence[tuple[str, int, int]]) -> str:
    return _first([f"{markdown_cell(task)} {resolved}/{attempts}" for task, resolved, attempts in passes],
                  "per-task results below, summary.json tasks")


def _natural(passes: tuple[str, int, int]) -> list[tuple[int, int | str]]:
    """Task names in natural order (humaneval-2 before humaneval-10)."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", passes[0])]


def _per_task_table(facts: SectionFacts) -> list[str]:
    """The folded per-task results of a suite too large for the facts table (empty for a small one)."""
    if len(facts.task_passes) <= INLINE_TASKS and len(facts.failed_trials) <= INLINE_TASKS:
        return []
    why: dict[str, str] = {}
    for task, what, reason in facts.failed_trials:
        why.setdefault(task, f"{what}: {reason}")
    passed = sum(1 for _, resolved, attempts in facts.task_passes if resolved == attempts)
    lines = ["", f"<details><summary>Per-task results: {len(facts.task_passes)} tasks, {passed} resolved in every "
             "attempt (all of them in summary.json, every trial in trial-results.json)</summary>", "",
             "| Task | Resolved / attempts | First trial not resolved |", "|---|---|---|"]
    for task, resolved, attempts in sorted(facts.task_passes, key=_natural)[:MAX_TASKS_SHOWN]:
        reason = why.get(task, "")
        cut = reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 1] + "…"
        lines.append(f"| {markdown_cell(task)} | {resolved}/{attempts} | {markdown_cell(cut) if cut else ''} |")
    more = len(facts.task_passes) - MAX_TASKS_SHOWN
    if more > 0:
        lines.append(f"| and {more} more | | summary.json tasks |")
    return [*lines, "", "</details>"]


def _counts(counts: TaskCounts | None) -> str:
    return "not run" if counts is None else f"{counts.resolved}/{counts.completed}"


def _comparison_rows(comparison: Comparison) -> list[tuple[str, str]]:
    """Compared with, score change, changed tasks, gate: what summary.json's ``comparison`` says."""
    previous = comparison.previous
    if previous is None:
        return [("Compared with", "nothing: the repository's first scored release of this suite"),
                ("Regression gate", "not applied (no previous release)")]
    delta = comparison.score_delta if comparison.score_delta is not None else 0.0
    changes = [f"{markdown_cell(c.task)} {markdown_cell(c.change)} ({_counts(c.previous)} → {_counts(c.current)})"
               for c in comparison.changed]
    if comparison.gate is None:
        gate = "none set for this suite"
    elif comparison.gated:
        gate = "**GATED** (published, not promoted): " + "; ".join(markdown_cell(r) for r in comparison.reasons)
    else:
        gate = "passed"
    return [
        ("Compared with", f"{markdown_cell(previous.tag)} (score {previous.score:.3f}; infra run {_code(previous.run_id)}; "
                          f"summary.json {_code(previous.summary_digest)})"),
        ("Score change", f"{delta:+.3f}"),
        ("Tasks changed", _first(changes, "summary.json comparison") if changes else "none"),
        ("Regression gate", gate),
    ]


def render_section(facts: SectionFacts, verify_commands: Sequence[str] = (), image_commands: Sequence[str] = ()) -> str:
    """Markdown for the section (without markers): a facts table and how to verify."""
    if facts.status == "SUCCEEDED" and facts.score is not None:
        score = f"**{facts.score:.3f}** ({facts.resolved}/{facts.completed} resolved)"
    else:
        why = f": {markdown_cell(facts.reason)}" if facts.reason else ""
        score = f"not scored ({markdown_cell(facts.status)}{why})"
    rows: list[tuple[str, str]] = [
        ("Status", markdown_cell(facts.status)),
        ("Score", score),
        *([("Score 95 % interval (Wilson)", _interval(facts.interval))]
          if facts.status == "SUCCEEDED" and facts.interval is not None else []),
        *([("Per-task passes (resolved / attempts)", _task_passes(facts.task_passes))]
          if facts.status == "SUCCEEDED" and any(attempts > 1 for _, _, attempts in facts.task_passes) else []),
        *(_comparison_rows(facts.comparison) if facts.status == "SUCCEEDED" and facts.comparison is not None else []),
        ("Suite", markdown_cell(facts.suite)),
        ("Dataset / content digest", markdown_cell(facts.dataset)),
        ("Evaluation method", markdown_cell(facts.evaluation)),
        ("Completed / total", f"{facts.completed} / {facts.total}"),
        ("Resolved", str(facts.resolved)),
        ("Unresolved", str(facts.unresolved)),
        ("Infrastructure errors", str(facts.infra_errors)),
        *([("Trials not resolved", _first([f"{markdown_cell(task)} ({markdown_cell(what)}): {markdown_cell(why)}"
                                             for task, what, why in facts.failed_trials],
                                            "per-task results below, trial-results.json", "; "))]
          if facts.failed_trials else []),
        ("Runner image", _code(facts.runner_ref)),
        ("API image", _code(facts.api_ref)),
        ("Harbor version", markdown_cell(facts.harbor_version)),
        ("Agent", markdown_cell(facts.agent)),
        *([("Agent package", markdown_cell(facts.agent_release))] if facts.agent_release else []),
        ("Source", f"{markdown_cell(facts.source_repository)} @ {_code(facts.source_commit)}"),
        ("Infra run id", _code(facts.run_id)),
        *([("Infra policy (sha256 of policies/infra.yaml)", _code(facts.policy_digest))] if facts.policy_digest else []),
        ("Correlation id", _code(facts.correlation_id)),
        *([("Workers (trials run; grader)", markdown_cell(facts.workers))] if facts.workers else []),
    ]
    lines = [f"### Benchmark ({markdown_cell(facts.tag)})", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += _per_task_table(facts)
    commands = [" ".join(c.split("\n")) for c in verify_commands] or ["sha256sum -c SHA256SUMS"]
    # The short form first (one benchseal line, one gh line, who signed), every check folded below it.
    lines += ["", *_short_form(commands)]
    lines += ["", "<details><summary>Every check: sha256sum, cosign, sigstore-python, sigstore-js, benchseal and gh "
              "(download the release assets into one directory, then)</summary>", "", "```sh"]
    lines += [_code_line(c) for c in commands]
    lines += ["```", "", "</details>"]
    if image_commands:
        # Online, against the images' registry: the identity, issuer and the workflow repository, ref
        # and commit pins benchseal verify-image checks (pipeline.verify.external.image_check_args); then gh's
        # --bundle-from-oci lines with the same pins (pipeline.verify.gh.gh_image_lines).
        lines += ["", "<details><summary>The runner and API images (cosign and gh, from their registry)</summary>", "",
                  "```sh"]
        lines += [_code_line(" ".join(c.split("\n"))) for c in image_commands]
        lines += ["```", "", "</details>"]
    return "\n".join(lines)


def _flag(argv: Sequence[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def _inline(command: str) -> str:
    """A command as inline code on one line (callers pass only commands without a backtick)."""
    return f"`{_code_line(command)}`"


def _short_form(commands: Sequence[str]) -> list[str]:
    """How to verify in brief: the ``benchseal verify`` line and the first ``gh attestation verify`` line
    of ``commands`` (the body's own), and the signer they pin, read from those lines."""
    plain = [c for c in commands if "`" not in c and c.split()]
    found = {"benchseal": next((c for c in plain if c.split()[0].endswith("benchseal") and c.split()[1:2] == ["verify"]),
                               None),
             "gh": next((c for c in plain if c.split()[1:3] == ["attestation", "verify"]), None)}
    lines = ["How to verify (download the release assets into one directory):", ""]
    if found["benchseal"]:
        lines.append(f"- {_inline(found['benchseal'])}")
    if found["gh"]:
        lines.append(f"- with the GitHub CLI: {_inline(found['gh'])}")
        argv = shlex.split(found["gh"])
        identity, repo, ref = _flag(argv, "--cert-identity"), _flag(argv, "--repo"), _flag(argv, "--source-ref")
        if identity and repo and ref:
            lines.append(f"- signed by {_inline(identity)} running for {_inline(repo)} at {_inline(ref)} "
                         f"(issuer {_inline(_flag(argv, '--cert-oidc-issuer') or '')})")
    if len(lines) == 2:
        lines.append("- every check is below")
    return lines


def asset_record(assets: Iterable[tuple[str, str]]) -> str:
    """The record line for ``(name, sha256 hex)`` pairs (sorted; a name may have two digests while
    one of benchseal's assets is being replaced)."""
    pairs = sorted(set(assets))
    for name, digest in pairs:
        if not _RECORD_ITEM_RE.match(f"{name}={digest}"):
            raise ValidationError("release asset name", "must match [A-Za-z0-9._+-]+ (with a sha256 hex digest) to be "
                                  "recorded", name)
    return ASSET_RECORD + "".join(f" {name}={digest}" for name, digest in pairs) + " -->"


def with_asset_record(section: str, assets: Iterable[tuple[str, str]]) -> str:
    """``section`` with its record line set to ``assets`` (added after a blank line when it has none)."""
    lines = [line for line in section.split("\n") if not line.startswith(ASSET_RECORD)]
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join([*lines, "", asset_record(assets)] if lines else [asset_record(assets)])


def recorded_assets(body: str) -> frozenset[tuple[str, str]]:
    """The ``(name, sha256 hex)`` pairs the body's benchseal section records; empty when it has no
    section, no record, or more than one (then nothing is proven benchseal's)."""
    section = extract(body)
    if section is None:
        return frozenset()
    found = [match for line in section.split("\n") if (match := _RECORD_RE.match(line))]
    if len(found) != 1:
        return frozenset()
    pairs = (item.split("=") for item in found[0].group(1).split())
    return frozenset((name, digest) for name, digest in pairs)


def _check_section(section: str) -> None:
    if START in section or END in section:
        raise ValidationError("section", "must not contain the benchseal markers")


def body_length(body: str) -> int:
    """Length as GitHub's limit counts it, measured strictly: UTF-16 code units (a character
    outside the BMP counts twice), never fewer than the number of code points."""
    return len(body.encode("utf-16-le")) // 2


def check_body_length(body: str, what: str = "release body") -> str:
    """Refuse a body over GitHub's 125,000-character limit (ValidationError, before any request)."""
    length = body_length(body)
    if length > MAX_BODY_CHARS:
        raise ValidationError(what, f"would be {length} characters (UTF-16 code units), more than GitHub's limit "
                                    f"of {MAX_BODY_CHARS}; nothing was sent")
    return body


def _markers(body: str) -> list[tuple[int, str]]:
    return [(m.start(), m.group(0)) for m in _MARKER_RE.finditer(body)]


def _plan(body: str) -> tuple[tuple[int, int] | None, list[tuple[int, int, str]]]:
    """Where the one section goes, and what else to rewrite.

    Returns ``(section, edits)``: ``section`` is the (start, end) of the first complete
    section's inner text (between its START and END), or None; ``edits`` are non-overlapping
    (start, end, replacement) rewrites of every other benchseal marker and of every later
    complete section.
    """
    tokens = _markers(body)
    edits: list[tuple[int, int, str]] = []
    first_start = next((i for i, (_, kind) in enumerate(tokens) if kind == START), None)
    first_end = None if first_start is None else next(
        (i for i in range(first_start + 1, len(tokens)) if tokens[i][1] == END), None)
    if first_start is None or first_end is None:
        return None, edits
    # Ends before the section are strays; starts inside it are replaced with its content.
    for pos, kind in tokens[:first_start]:
        edits.append((pos, pos + len(kind), UNPAIRED_END))
    section = (tokens[first_start][0] + len(START), tokens[first_end][0])
    open_at: int | None = None  # token index of an open later section
    for i in range(first_end + 1, len(tokens)):
        pos, kind = tokens[i]
        if kind == START and open_at is None:
            open_at = i
        elif kind == END and open_at is not None:
            # A complete later section: benchseal's own (stale) text, removed as a whole.
            edits.append((tokens[open_at][0], pos + len(END), DUPLICATE_REMOVED))
            open_at = None
        elif kind == END:
            edits.append((pos, pos + len(END), UNPAIRED_END))
    if open_at is not None:
        # An unclosed start after the section: its text is kept; it and any start after it are neutralised.
        for pos, kind in tokens[open_at:]:
            edits.append((pos, pos + len(kind), UNPAIRED_START))
    return section, edits


def _apply(body: str, edits: list[tuple[int, int, str]]) -> str:
    out: list[str] = []
    at = 0
    for start, end, text in sorted(edits):
        out += [body[at:start], text]
        at = end
    out.append(body[at:])
    return "".join(out)


def splice(body: str, section: str) -> str:
    """Return ``body`` with exactly one benchseal section, set to ``section``.

    - one or more complete sections (a START followed by an END): the first one's inner text is
      replaced; every later complete section (START..END, benchseal's own text) is replaced by
      ``<!-- benchseal:duplicate-section-removed -->``; starts nested inside a section go with
      its content;
    - any other marker (an END before the first START, an END or an unclosed START after the
      section) is rewritten to ``<!-- benchseal:unpaired-end -->`` /
      ``<!-- benchseal:unpaired-start -->``: the text around it is kept;
    - no complete section but a START: the section and an END are inserted right after the
      first START (the text after it is kept); other markers are neutralised as above;
    - only END markers: a START and the section are inserted right before the first END;
    - no marker: the section, with markers, is appended after the body.
    Maintainer text (anything outside benchseal's sections) is never dropped; neutralised
    markers stay as HTML comments so a reader can see what was repaired. The result is a
    fixed point, ``splice(splice(b, s), s) == splice(b, s)``, and the last write wins,
    ``splice(splice(b, s1), s2) == splice(b, s2)``. A result over GitHub's body limit raises
    ValidationError (see ``check_body_length``).
    """
    _check_section(section)
    inner = f"\n{section}\n"
    where, edits = _plan(body)
    if where is not None:
        return check_body_length(_apply(body, [*edits, (where[0], where[1], inner)]))
    tokens = _markers(body)
    starts = [pos for pos, kind in tokens if kind == START]
    if starts:
        anchor = starts[0]
        after = anchor + len(START)
        rest = [(p, p + len(k), UNPAIRED_START if k == START else UNPAIRED_END) for p, k in tokens if p != anchor]
        return check_body_length(_apply(body, [*rest, (after, after, inner + END)]))
    if tokens:
        anchor = tokens[0][0]
        rest = [(p, p + len(END), UNPAIRED_END) for p, _ in tokens[1:]]
        return check_body_length(_apply(body, [*rest, (anchor, anchor, START + inner)]))
    if body == "" or body.endswith("\n\n"):
        sep = ""
    elif body.endswith("\n"):
        sep = "\n"
    else:
        sep = "\n\n"
    return check_body_length(f"{body}{sep}{START}{inner}{END}\n")


def extract(body: str) -> str | None:
    """The section text between the markers (None when the body has no complete section)."""
    start = body.find(START)
    if start < 0:
        return None
    after = start + len(START)
    end = body.find(END, after)
    if end < 0:
        return None
    return body[after:end].removeprefix("\n").removesuffix("\n")
