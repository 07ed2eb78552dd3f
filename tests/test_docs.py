"""The docs a newcomer reads hold together: every relative link and #anchor in README.md and docs/*.md
resolves (GitHub's heading slugs), and every ``benchseal`` command they show names a verb and options
the CLI has (checked against the installed command's own parser, in-process: no Docker)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from pipeline.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target "title"), ![alt](target), and reference definitions [label]: target
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _split(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str, list[str]]]]:
    """(prose lines, fenced blocks as (first line, info string, lines)), line numbers 1-based."""
    prose: list[tuple[int, str]] = []
    blocks: list[tuple[int, str, list[str]]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            blocks.append((number, match.group(2).strip(), []))
        elif fence is not None and line.strip().startswith(fence[0] * len(fence)) and not line.strip(fence[0]).strip():
            fence = None
        elif fence is not None:
            blocks[-1][2].append(line)
        else:
            prose.append((number, line))
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, punctuation dropped, spaces -> '-'."""
    text = _INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML renders as nothing
    text = re.sub(r"(\*{1,2})(.+?)\1", r"\2", text)  # emphasis markers
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives a Markdown file: heading slugs (repeats get -1, -2, ...) and <a name/id>."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    prose, _blocks = _split(path.read_text())
    for _number, line in prose:
        found.update(_HTML_ANCHOR.findall(line))
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> Iterator[tuple[int, str]]:
    """(line, target) of every link outside code: inline links, images and reference definitions."""
    prose, _blocks = _split(path.read_text())
    for number, line in prose:
        bare = _INLINE_CODE.sub("", line)
        for match in _LINK.finditer(bare):
            yield number, match.group(1)
        ref = _REFDEF.match(bare)
        if ref:
            yield number, ref.group(1)


def link_problem(source: Path, target: str) -> str | None:
    """Why ``target`` (as written in ``source``) does not resolve, or None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
        return None  # an absolute URL: not this repository's to check
    if not target:
        return "empty link target"
    path_part, _, anchor = target.partition("#")
    if path_part:
        resolved = (ROOT / path_part.lstrip("/")) if path_part.startswith("/") else (source.parent / path_part)
        resolved = resolved.resolve()
        if not resolved.is_relative_to(ROOT):
            return f"{path_part} points outside the repository"
        if not resolved.exists():
            return f"{path_part} does not exist"
    else:
        resolved = source
    if not anchor:
        return None
    if resolved.suffix == ".md":
        return None if anchor in anchors(resolved) else f"#{anchor} is not a heading of {resolved.relative_to(ROOT)}"
    if resolved.is_file() and re.fullmatch(r"L\d+(-L\d+)?", anchor):
        return None  # GitHub's line anchors in a source file
    return f"#{anchor} cannot be checked in {resolved.relative_to(ROOT)}"


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = [f"{doc.relative_to(ROOT)}:{number}: ({target}) {problem}"
              for doc in DOCS for number, target in links(doc)
              if (problem := link_problem(doc, target)) is not None]
    assert not broken, "\n".join(broken)


# ---- commands ----------------------------------------------------------------------------------------

_CLI: Any = typer.main.get_command(app)
_END = {"&&", "||", ";", "|&", ">", ">>", "2>", "<"}


def _commands(doc: Path) -> Iterator[tuple[int, list[str]]]:
    """(line, tokens after ``benchseal``) for each command in a fenced block or an inline code span that
    starts with ``benchseal`` (diagrams, comments and quoted messages aside)."""
    prose, blocks = _split(doc.read_text())
    for first, info, lines in blocks:
        if info.startswith("mermaid"):
            continue
        joined: list[tuple[int, str]] = []
        for offset, line in enumerate(lines, first + 1):
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line)
            else:
                joined.append((offset, line))
        for number, line in joined:
            code = line.strip().removeprefix("$ ").removeprefix("run: ").removeprefix("- run: ")
            if code.startswith("#"):
                continue
            code = re.split(r"\s#\s", code)[0]
            yield from ((number, tokens) for tokens in _after_benchseal(code.split()))
    for number, line in prose:
        for match in _INLINE_CODE.finditer(line):
            span = match.group(2).strip()
            # A span like `benchseal engine proxy: ...` quotes a message, not a command.
            if span.startswith("benchseal ") and ": " not in span:
                yield from ((number, tokens) for tokens in _after_benchseal(span.split()))


def _after_benchseal(words: list[str]) -> Iterator[list[str]]:
    for index, word in enumerate(words):
        if word == "benchseal" or word.endswith("/bin/benchseal"):
            yield words[index + 1:]


def _options(command: Any) -> dict[str, bool]:
    """Option name -> whether it takes a value."""
    names = {"--help": False}
    for param in command.params:
        for opt in [*param.opts, *param.secondary_opts]:
            if opt.startswith("-"):
                names[opt] = not getattr(param, "is_flag", False) and not getattr(param, "count", False)
    return names


def command_problem(tokens: list[str], command: Any = _CLI, path: str = "benchseal") -> str | None:
    """Why ``benchseal TOKENS`` names no verb or an option its verb lacks, or None. Usage notation is
    understood: [optional] parts, a|b alternatives, UPPER placeholders, '...'."""
    options = _options(command)
    depth = 0  # inside [...]: a '|' there is an alternative, not a pipe
    skip_value = False
    for position, raw in enumerate(tokens):
        if depth == 0 and raw in _END | {"|"}:
            return None
        depth += raw.count("[") - raw.count("]")
        word = raw.strip("[](),'\"`")
        if skip_value:
            skip_value = False
            continue
        if not word or word in {"...", "…", "|"}:
            continue
        if word.startswith("-"):
            for alternative in word.split("|"):
                name = alternative.split("=")[0].rstrip(".,:;")
                if not re.fullmatch(r"--?[A-Za-z][\w-]*", name):
                    continue
                if name not in options:
                    return f"{path}: no option {name}"
                skip_value = options[name] and "=" not in alternative
            continue
        if not hasattr(command, "commands"):
            continue  # an argument of the verb
        if word.isupper() or word.startswith("<"):
            return None  # a placeholder verb (VERB ...)
        for alternative in word.split("|"):
            sub = command.commands.get(alternative)
            if sub is None:
                return f"{path}: no verb {alternative!r}"
            problem = command_problem(tokens[position + 1:], sub, f"{path} {alternative}")
            if problem is not None:
                return problem
        return None
    return None


def test_every_command_the_docs_show_exists() -> None:
    shown = [(doc, number, tokens) for doc in DOCS for number, tokens in _commands(doc)]
    assert len(shown) > 50  # the extraction itself still finds the docs' commands
    wrong = [f"{doc.relative_to(ROOT)}:{number}: benchseal {' '.join(tokens)}\n    {problem}"
             for doc, number, tokens in shown if (problem := command_problem(tokens)) is not None]
    assert not wrong, "\n".join(wrong)


# ---- the checkers themselves catch what they are for --------------------------------------------------

@pytest.mark.parametrize(("heading", "expected"), [
    ("The sandbox engine (`pipeline/host/sandbox.py`, `benchseal sandbox start|stop|status`)",
     "the-sandbox-engine-pipelinehostsandboxpy-benchseal-sandbox-startstopstatus"),
    ("The API: benchseal-api.service", "the-api-benchseal-apiservice"),
    ("Where a reward comes from ([grader](x.md))", "where-a-reward-comes-from-grader"),
    ("Step 3 — tokens", "step-3--tokens"),
    ("snake_case **bold**", "snake_case-bold"),
])
def test_slug_follows_github(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    docs = ROOT / "docs"
    assert link_problem(docs / "host.md", "architecture.md") is None
    assert link_problem(docs / "host.md", "no-such-page.md") == "no-such-page.md does not exist"
    first = sorted(anchors(docs / "architecture.md"))[0]
    assert link_problem(docs / "host.md", f"architecture.md#{first}") is None
    assert "is not a heading" in (link_problem(docs / "host.md", "architecture.md#no-such-heading") or "")
    assert "is not a heading" in (link_problem(ROOT / "README.md", "#no-such-heading") or "")
    assert link_problem(docs / "host.md", "../../outside.md") == "../../outside.md points outside the repository"
    page = tmp_path / "page.md"
    page.write_text("# Same\n## Same\n```sh\n# not a heading\n[x](missing.md)\n```\n[ok](#same-1) `[x](gone.md)` [bad](#same-2)\n")
    assert [target for _n, target in links(page)] == ["#same-1", "#same-2"]
    assert anchors(page) == {"same", "same-1"}


@pytest.mark.parametrize(("command", "problem"), [
    ("verify . --repo O/N --tag v1 --infra-repo O/I --builder O/B@R", None),
    ("--project-dir builder attest --digests d.json", None),
    ("local registry|sigstore start", None),
    ("infra status [--db DB | --queue-url-file F] [--summary]", None),
    ("verify . --no-such-flag", "benchseal verify: no option --no-such-flag"),
    ("frobnicate --x", "benchseal: no verb 'frobnicate'"),
    ("local registry|nothing", "benchseal local: no verb 'nothing'"),
    ("infra accept --payload - --json | jq .", None),
])
def test_a_command_that_does_not_exist_is_found(command: str, problem: str | None) -> None:
    assert command_problem(command.split()) == problem
