"""Every value a run controls lands in the release body inert, rendered by GitHub's own parser.

cmarkgfm is GitHub's fork of cmark with its extensions (table, autolink, strikethrough,
tagfilter). What GitHub does after rendering (mentions, issue references, emoji) works on
the HTML's text outside code, so the rendered text outside ``<code>`` must hold none of
``@``, ``#``, ``:``.
"""

from __future__ import annotations

import html
import re
from dataclasses import fields, replace
from typing import Any

import cmarkgfm
import pytest
from cmarkgfm.cmark import Options
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.errors import escape_text
from pipeline.publish.body import END, START, SectionFacts, extract, markdown_cell, render_section, splice
from tests.publish.test_publish_body import SUMMARY, facts_from_summary

# What an attacker reaches for: markup, links, mentions, fences, markers, and characters that
# are invisible or reorder text. Mixed with arbitrary text (every code point, lone surrogates too).
_HOSTILE = [
    "<", ">", "&", "&lt;", "&#60;", "<!--", "-->", START, END, "<img src=x onerror=alert(1)>", "<script>",
    "![", "[", "](", "]", "(", ")", "[x]: http://e.vil", "<http://e.vil>", "http://e.vil", "https://e.vil/a_b",
    "www.e.vil", "mailto:a@b.c", "a@b.co", "@octocat", "@org/team", "#1", "GH-1", "owner/repo#2", ":smile:",
    "`", "``", "```", "~~~", "~~x~~", "*", "**", "_", "__", "\\", "\\|", "|", "||", "\n", "\r", "\r\n",
    "\u2028", "\u2029", "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068",
    "\u2069", "\u200e", "\u200f", "\u061c", "\u200b", "\u200c", "\u200d", "\ufeff", "\u2060", "\x00", "\x1b",
    "\t", "\x85", "\xa0", "\ud800", "\U0001f600", "\\u202e", "\\x0a", " ", "  ", "$x$", "^", "=", "-", ">>",
    "1. ", "- ", "# ", "---", "&amp;", "\\`", "`@`",
]
_values = st.lists(st.one_of(st.sampled_from(_HOSTILE), st.text(max_size=8),
                             st.characters(codec=None, categories=["Cc", "Cf", "Cs", "Zl", "Zp", "Zs", "P", "S"])),
                   max_size=10).map("".join)
# Never raw in a cell: markup openers, line breaks, and the invisible or reordering characters.
_NEVER_RAW = set("<>\n\r\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
                 "\u200b\u200c\u200d\ufeff\u2060")
_CODE_RE = re.compile(r"<code>(.*?)</code>", re.DOTALL)
_TAG_RE = re.compile(r"<[^>]*>")


def _render(markdown: str) -> str:
    # UNSAFE: raw HTML that got through would appear as HTML here (GitHub sanitises, but must not need to).
    return cmarkgfm.github_flavored_markdown_to_html(markdown, options=Options.CMARK_OPT_UNSAFE)


def _visible(value: str) -> str:
    """What a reader sees for ``value``: itself, invisible characters as escapes, ``\\`` doubled."""
    return escape_text(value.replace("\\", "\\\\"))


def _read_back(shown: str) -> str:
    """The inverse of ``_visible``: a reader gets the exact value back."""
    def one(match: re.Match[str]) -> str:
        token = match.group(0)
        return "\\" if token == "\\\\" else chr(int(token[2:], 16))
    return re.sub(r"\\\\|\\x[0-9a-f]{2}|\\u[0-9a-f]{4}|\\U[0-9a-f]{8}", one, shown)


def _cells(rendered: str) -> list[list[str]]:
    body = rendered.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.DOTALL)
    return [re.findall(r"<td>(.*?)</td>", row, re.DOTALL) for row in rows]


def _check_inert(cell_html: str, value: str) -> None:
    # Only code spans, no other element (no link, image, emphasis, strikethrough, raw HTML).
    tags = set(_TAG_RE.findall(cell_html))
    assert tags <= {"<code>", "</code>"}, (value, cell_html)
    outside = _CODE_RE.sub("", cell_html)
    assert not set(html.unescape(outside)) & set("@#:"), (value, cell_html)  # no mention, ref, URL, emoji
    text = html.unescape(_TAG_RE.sub("", cell_html))
    assert text == _visible(value), (value, cell_html)
    assert _read_back(text) == value


@settings(max_examples=400, deadline=None)
@given(value=_values)
def test_any_value_is_an_inert_cell_that_reads_back(value: str) -> None:
    cell = markdown_cell(value)
    assert not set(cell) & _NEVER_RAW, repr(cell)
    assert cell.isprintable() and "<!--" not in cell and "-->" not in cell
    rendered = _render(f"| | |\n|---|---|\n| k | {cell} |\n| last | row |\n")
    rows = _cells(rendered)
    assert [len(r) for r in rows] == [2, 2] and rows[0][0] == "k" and rows[1] == ["last", "row"], rendered
    _check_inert(rows[0][1], value)


@settings(max_examples=150, deadline=None)
@given(value=_values)
def test_every_field_of_the_section_stays_in_its_cell_and_section(value: str) -> None:
    facts = facts_from_summary(SUMMARY, "v1.2.3")
    hostile = replace(facts, **{f.name: value for f in fields(SectionFacts) if f.type in ("str", "str | None")})
    section = render_section(hostile, ["cosign verify-blob " + value])
    body = splice("Maintainer notes.\n", section)
    assert body.count(START) == 1 and body.count(END) == 1 and extract(body) == section
    assert body.startswith("Maintainer notes.\n\n")
    rendered = _render(section)
    rows = _cells(rendered)
    # The release's own agent gets its own row ("Agent package") whenever the summary names one.
    package = ["Agent package"] if value else []
    workers = ["Workers (trials run; grader)"] if value else []  # shown when the summary names them
    policy = ["Infra policy (sha256 of policies/infra.yaml)"] if value else []  # shown when the summary records it
    assert [len(r) for r in rows] == [2] * (16 + len(package) + len(workers) + len(policy)), rendered
    labels = ["Status", "Score", "Suite", "Dataset / content digest", "Evaluation method", "Completed / total", "Resolved",
              "Unresolved", "Infrastructure errors", "Runner image", "API image", "Harbor version", "Agent", *package,
              "Source", "Infra run id", *policy, "Correlation id", *workers]
    assert [r[0] for r in rows] == labels
    # Every cell of a plain value (the Source row joins two with " @ "; the agent package is one value).
    for label in ("Status", "Suite", "Dataset / content digest", "Evaluation method", "Runner image", "API image",
                  "Harbor version", "Agent", *package, "Infra run id", *policy, "Correlation id", *workers):
        _check_inert(rows[labels.index(label)][1], value)
    # The heading holds the tag and nothing else; the commands stay in their one fenced block.
    heading = re.search(r"<h3>(.*?)</h3>", rendered, re.DOTALL)
    assert heading is not None
    assert html.unescape(_TAG_RE.sub("", heading.group(1))) == f"Benchmark ({_visible(value)})"
    blocks = re.findall(r"<pre.*?</pre>", rendered, re.DOTALL)
    assert len(blocks) == 1 and rendered.rstrip().endswith("</details>"), rendered
    assert rendered.index("</pre>") > rendered.index("<details>"), rendered  # folded below the short form
    assert html.unescape(_TAG_RE.sub("", blocks[0])).count("\n") == 1  # one command line


@pytest.mark.parametrize(("value", "shown"), [
    ("agent error", "agent error"),
    ("a|b", "a\\|b"),
    ("<!-- benchseal:end -->", "&lt;\\!\\-\\- benchseal`:`end \\-\\-&gt;"),
    ("@octocat #12", "`@`octocat `#`12"),
    ("![x](https://e.vil)", "\\!\\[x\\]\\(https`:`\\/\\/e\\.vil\\)"),
    ("\u202eevil\u200b\r\n", "\\\\u202eevil\\\\u200b\\\\x0d\\\\x0a"),
    (" padded ", "&#32;padded&#32;"),
    ("\\u202e", "\\\\\\\\u202e"),  # a literal backslash shows doubled: not the escape of U+202E
])
def test_cell_examples(value: str, shown: str) -> None:
    assert markdown_cell(value) == shown


def test_the_section_of_a_hostile_summary_renders_as_text() -> None:
    hostile: dict[str, Any] = dict(
        SUMMARY, suite="<img src=x onerror=alert(1)> @octocat", status="FAILED", score=None,
        reason="see #1 and https://e.vil/\u202e\n| forged | row |", dataset={"name": "[x](javascript:alert(1))",
                                                                               "revision": "`code`"},
        agent={"name": "![i](http://e.vil/p.png)", "version": "1\u2028\u2029"})
    section = render_section(facts_from_summary(hostile, "v1.2.3"))
    rendered = _render(section)
    assert "<img" not in rendered and "<a " not in rendered and "<em>" not in rendered
    rows = _cells(rendered)
    assert len(rows) == 16 and all(len(r) == 2 for r in rows)
    assert "not scored (FAILED: see " in html.unescape(_TAG_RE.sub("", rows[1][1]))
