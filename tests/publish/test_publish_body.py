"""The body splice keeps every byte it does not own, and never duplicates the section."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ValidationError
from pipeline.publish.body import END, START, extract, facts_from_summary, render_section, splice

# Text that looks like the markers without being them, plus ordinary markdown.
_pieces = st.sampled_from(["<!-- benchseal:", "-->", "<!--", "\n", "\r\n", "| a | b |", "benchseal:end", " ", "é", "`"])
_text = st.lists(st.one_of(st.text(max_size=20), _pieces), max_size=12).map("".join).filter(
    lambda s: START not in s and END not in s
)
_section = _text


@given(body=_text, section=_section)
def test_absent_markers_append_and_keep_body_as_prefix(body: str, section: str) -> None:
    out = splice(body, section)
    assert out.startswith(body)
    assert out.count(START) == 1 and out.count(END) == 1
    assert extract(out) == section


@given(before=_text, old=_text, after=_text, section=_section)
def test_both_markers_replace_only_between(before: str, old: str, after: str, section: str) -> None:
    body = before + START + old + END + after
    out = splice(body, section)
    assert out == before + START + "\n" + section + "\n" + END + after
    assert extract(out) == section


@given(before=_text, after=_text, section=_section, which=st.sampled_from([START, END]))
def test_one_marker_is_repaired_without_losing_bytes(before: str, after: str, section: str, which: str) -> None:
    body = before + which + after
    out = splice(body, section)
    assert out.count(START) == 1 and out.count(END) == 1
    assert extract(out) == section
    # Removing exactly the inserted text gives back the original body.
    inserted = ("\n" + section + "\n" + END) if which == START else (START + "\n" + section + "\n")
    at = len(before) + (len(START) if which == START else 0)
    assert out[:at] + out[at + len(inserted):] == body


@settings(max_examples=200)
@given(body=st.one_of(_text, st.builds(lambda a, b, c: a + START + b + END + c, _text, _text, _text),
                      st.builds(lambda a, b: a + END + b + START, _text, _text),
                      st.builds(lambda a, b: a + START + b, _text, _text)),
       first=_section, second=_section)
def test_fixed_point_and_last_write_wins(body: str, first: str, second: str) -> None:
    once = splice(body, first)
    assert splice(once, first) == once
    assert splice(once, second) == splice(body, second)
    assert extract(splice(once, second)) == second
    assert once.count(START) == body.count(START) + (0 if START in body else 1)


def test_section_with_marker_is_rejected() -> None:
    with pytest.raises(ValidationError):
        splice("body", f"x {END} y")


def test_append_separators() -> None:
    assert splice("", "S") == f"{START}\nS\n{END}\n"
    assert splice("notes", "S") == f"notes\n\n{START}\nS\n{END}\n"
    assert splice("notes\n", "S") == f"notes\n\n{START}\nS\n{END}\n"
    assert splice("notes\n\n", "S") == f"notes\n\n{START}\nS\n{END}\n"


SUMMARY = {
    "schema": "benchseal.summary/v1",
    "status": "SUCCEEDED",
    "suite": "smoke",
    "dataset": {"name": "benchseal-smoke", "revision": "abc123"},
    "evaluation": {"method": "harbor reward == 1 per task"},
    "counts": {"total": 3, "completed": 3, "resolved": 2, "unresolved": 1, "infra_errors": 0},
    "score": 2 / 3,
    "images": {"runner": {"ref": "127.0.0.1:5055/benchseal/runner@sha256:" + "a" * 64},
               "api": {"ref": "127.0.0.1:5055/benchseal/api@sha256:" + "b" * 64}},
    "harbor": {"version": "0.26.0"},
    "agent": {"name": "oracle", "version": "1.0"},
    "source": {"repository": "acme/widget", "commit": "c" * 40, "tag": "v1.2.3"},
    "run_id": "run-1",
    "correlation_id": "corr-12345678",
}


def test_render_succeeded_table() -> None:
    text = render_section(facts_from_summary(SUMMARY, "v1.2.3"), ["cosign verify-blob --bundle x.sigstore.json x"])
    assert "| Score | **0.667** (2/3 resolved) |" in text
    assert "| Dataset / revision | benchseal-smoke@abc123 |" in text
    assert "| Infrastructure errors | 0 |" in text
    assert "`127.0.0.1:5055/benchseal/runner@sha256:" + "a" * 64 + "`" in text
    assert "| Agent | oracle 1.0 |" in text
    assert "cosign verify-blob --bundle x.sigstore.json x" in text
    assert START not in text and END not in text


def test_render_failed_run_is_not_scored() -> None:
    failed = dict(SUMMARY, status="INFRA_ERROR", score=None, reason="runner image missing",
                  counts={"total": 3, "completed": 0, "resolved": 0, "unresolved": 0, "infra_errors": 3})
    text = render_section(facts_from_summary(failed, "v1.2.3"))
    assert "| Score | not scored (INFRA_ERROR: runner image missing) |" in text
    assert "| Infrastructure errors | 3 |" in text


def test_failed_run_with_score_is_rejected() -> None:
    with pytest.raises(ValidationError, match="score"):
        facts_from_summary(dict(SUMMARY, status="FAILED"), "v1")


def test_hostile_values_cannot_fake_markers() -> None:
    text = render_section(facts_from_summary(dict(SUMMARY, suite="x | <!-- benchseal:end --> y\nz"), "v1"))
    assert END not in text and "\\|" in text
    assert splice("a", text).count(END) == 1
