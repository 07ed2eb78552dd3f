"""The benchmark section of a release body, and splicing it into a body someone else owns.

The release body belongs to the maintainers; benchseal owns only the text between
``<!-- benchseal:start -->`` and ``<!-- benchseal:end -->``. ``splice`` keeps every
other byte, so a re-run, a hand-edited body or a body missing one marker never loses
or duplicates text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.errors import ValidationError

START = "<!-- benchseal:start -->"
END = "<!-- benchseal:end -->"


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
    source_repository: str
    source_commit: str
    run_id: str
    correlation_id: str


def _get(data: Mapping[str, Any], *paths: str, default: Any = None) -> Any:
    """First present value among dotted ``paths`` (summary.json nests some facts)."""
    for path in paths:
        node: Any = data
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            if node is not None:
                return node
    return default


def _int(data: Mapping[str, Any], *paths: str) -> int:
    value = _get(data, *paths, default=0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(f"summary.json: {paths[0]}", "must be a non-negative integer", value)
    return value


def facts_from_summary(summary: Mapping[str, Any], tag: str) -> SectionFacts:
    """Read the section's facts from a parsed summary.json (benchseal.summary/v1)."""
    status = _get(summary, "status", "run.status", default=None)
    if not isinstance(status, str):
        raise ValidationError("summary.json: status", "must be a string", status)
    score = _get(summary, "score", "grading.score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
        raise ValidationError("summary.json: score", "must be a number or null", score)
    if status != "SUCCEEDED" and score is not None:
        raise ValidationError("summary.json: score", f"must be null for a {status} run", score)
    agent_name = _get(summary, "agent.name", "agent", default="unknown")
    agent_version = _get(summary, "agent.version", "agent_version")
    if isinstance(agent_name, Mapping):
        agent_name = "unknown"
    if isinstance(agent_version, list):
        agent_version = ", ".join(str(v) for v in agent_version)
    agent = f"{agent_name} {agent_version}" if agent_version else str(agent_name)
    return SectionFacts(
        tag=tag,
        status=status,
        suite=str(_get(summary, "suite.name", "suite", default="unknown")),
        dataset=str(_dataset(summary)),
        evaluation=str(_get(summary, "evaluation.method", "evaluation_method", "evaluation", default="unknown")),
        total=_int(summary, "counts.total"),
        completed=_int(summary, "counts.completed"),
        resolved=_int(summary, "counts.resolved"),
        unresolved=_int(summary, "counts.unresolved"),
        infra_errors=_int(summary, "counts.infra_errors"),
        score=None if score is None else float(score),
        reason=_get(summary, "reason", "run.reason"),
        runner_ref=str(_get(summary, "images.runner.ref", "images.runner", "runner_ref", "runner", default="unknown")),
        api_ref=str(_get(summary, "images.api.ref", "images.api", "api_ref", "api", default="unknown")),
        harbor_version=str(_get(summary, "harbor.version", "harbor_version", default="unknown")),
        agent=agent,
        source_repository=str(_get(summary, "source.repository", default="unknown")),
        source_commit=str(_get(summary, "source.commit", default="unknown")),
        run_id=str(_get(summary, "infra_run_id", "run_id", "infra.run_id", default="unknown")),
        correlation_id=str(_get(summary, "correlation_id", "infra.correlation_id", default="unknown")),
    )


def _dataset(summary: Mapping[str, Any]) -> str:
    name = _get(summary, "dataset.name", "dataset", default=None)
    revision = _get(summary, "dataset.revision", "dataset_revision", "revision", default=None)
    if isinstance(name, Mapping):
        name = None
    if name and revision:
        return f"{name}@{revision}"
    return str(name or revision or "unknown")


def _cell(value: object) -> str:
    """A table cell: no line breaks, pipes escaped, no HTML comment that could fake a marker."""
    text = " ".join(str(value).split())
    return text.replace("|", "\\|").replace("<!--", "&lt;!--").replace("-->", "--&gt;")


def _code(value: object) -> str:
    text = _cell(value)
    return f"`{text}`" if "`" not in text else text


def render_section(facts: SectionFacts, verify_commands: Sequence[str] = ()) -> str:
    """Markdown for the section (without markers): a facts table and how to verify."""
    if facts.status == "SUCCEEDED" and facts.score is not None:
        score = f"**{facts.score:.3f}** ({facts.resolved}/{facts.completed} resolved)"
    else:
        why = f": {facts.reason}" if facts.reason else ""
        score = f"not scored ({facts.status}{why})"
    rows: list[tuple[str, str]] = [
        ("Status", _cell(facts.status)),
        ("Score", _cell(score)),
        ("Suite", _cell(facts.suite)),
        ("Dataset / revision", _cell(facts.dataset)),
        ("Evaluation method", _cell(facts.evaluation)),
        ("Completed / total", f"{facts.completed} / {facts.total}"),
        ("Resolved", str(facts.resolved)),
        ("Unresolved", str(facts.unresolved)),
        ("Infrastructure errors", str(facts.infra_errors)),
        ("Runner image", _code(facts.runner_ref)),
        ("API image", _code(facts.api_ref)),
        ("Harbor version", _cell(facts.harbor_version)),
        ("Agent", _cell(facts.agent)),
        ("Source", f"{_cell(facts.source_repository)} @ {_code(facts.source_commit)}"),
        ("Infra run id", _code(facts.run_id)),
        ("Correlation id", _code(facts.correlation_id)),
    ]
    lines = [f"### Benchmark ({_cell(facts.tag)})", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += ["", "How to verify (download the release assets into one directory, then):", "", "```sh"]
    commands = [" ".join(c.split("\n")) for c in verify_commands] or ["sha256sum -c SHA256SUMS"]
    lines += [c.replace("<!--", "&lt;!--").replace("```", "'''") for c in commands]
    lines += ["```"]
    return "\n".join(lines)


def _check_section(section: str) -> None:
    if START in section or END in section:
        raise ValidationError("section", "must not contain the benchseal markers")


def splice(body: str, section: str) -> str:
    """Return ``body`` with the benchseal section set to ``section``.

    - both markers (first start, first end after it): replace only the text between them;
    - no marker: append the section, with markers, after the body;
    - only a start marker: insert the section and an end marker right after it;
    - only an end marker (or an end before any start): insert a start marker and the section
      right before that end marker.
    Every byte outside the inserted/replaced region is kept, and the result is a fixed point:
    ``splice(splice(b, s), s) == splice(b, s)``.
    """
    _check_section(section)
    inner = f"\n{section}\n"
    start = body.find(START)
    if start >= 0:
        after = start + len(START)
        end = body.find(END, after)
        if end >= 0:
            return body[:after] + inner + body[end:]
        return body[:after] + inner + END + body[after:]
    end = body.find(END)
    if end >= 0:
        return body[:end] + START + inner + body[end:]
    if body == "" or body.endswith("\n\n"):
        sep = ""
    elif body.endswith("\n"):
        sep = "\n"
    else:
        sep = "\n\n"
    return f"{body}{sep}{START}{inner}{END}\n"


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
