"""The body splice keeps every byte it does not own, and never duplicates the section."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.errors import ValidationError
from pipeline.publish.body import (
    DUPLICATE_REMOVED,
    END,
    MAX_BODY_CHARS,
    START,
    UNPAIRED_END,
    UNPAIRED_START,
    extract,
    facts_from_summary,
    render_section,
    splice,
)

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
    assert once.count(START) == 1 and once.count(END) == 1


def test_section_with_marker_is_rejected() -> None:
    with pytest.raises(ValidationError):
        splice("body", f"x {END} y")


def test_append_separators() -> None:
    assert splice("", "S") == f"{START}\nS\n{END}\n"
    assert splice("notes", "S") == f"notes\n\n{START}\nS\n{END}\n"
    assert splice("notes\n", "S") == f"notes\n\n{START}\nS\n{END}\n"
    assert splice("notes\n\n", "S") == f"notes\n\n{START}\nS\n{END}\n"


SUMMARY: dict[str, Any] = {
    "schema": "benchseal.summary/v1",
    "status": "SUCCEEDED",
    "reason": None,
    "suite": "smoke",
    "dataset": {"name": "benchseal-smoke", "revision": "abc123"},
    "evaluation_method": "harbor reward == 1 per task",
    "counts": {"total": 3, "completed": 3, "resolved": 2, "unresolved": 1, "infra_errors": 0},
    "score": round(2 / 3, 6),
    "images": {"runner": {"name": "127.0.0.1:5055/benchseal/runner", "digest": "sha256:" + "a" * 64,
                          "ref": "127.0.0.1:5055/benchseal/runner@sha256:" + "a" * 64},
               "api": {"name": "127.0.0.1:5055/benchseal/api", "digest": "sha256:" + "b" * 64,
                       "ref": "127.0.0.1:5055/benchseal/api@sha256:" + "b" * 64}},
    "harbor_version": "0.26.0",
    "agent": {"name": "oracle", "version": "1.0"},
    "source": {"repository": "acme/widget", "commit": "c" * 40, "tag": "v1.2.3"},
    "run_id": "run-1",
    "correlation_id": "corr-12345678",
    "timings": {"started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:01:00Z", "trials": []},
}


@pytest.mark.parametrize(("change", "field"), [
    ({"run": {"status": "SUCCEEDED"}}, "run"),  # spellings the writer never produces are refused, not guessed
    ({"infra": {"run_id": "run-1"}}, "infra"),
    ({"harbor": {"version": "0.26.0"}}, "harbor"),
    ({"images": {"runner": "127.0.0.1:5055/benchseal/runner@sha256:" + "a" * 64}}, "images"),
])
def test_summary_is_read_through_its_model(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        facts_from_summary({**SUMMARY, **change}, "v1")


def test_render_succeeded_table() -> None:
    text = render_section(facts_from_summary(SUMMARY, "v1.2.3"), ["cosign verify-blob --bundle x.sigstore.json x"])
    assert "| Score | **0.667** (2/3 resolved) |" in text
    assert "| Dataset / content digest | benchseal\\-smoke`@`abc123 |" in text  # inert: no mention, no link
    assert "| Infrastructure errors | 0 |" in text
    assert "`127.0.0.1:5055/benchseal/runner@sha256:" + "a" * 64 + "`" in text
    assert "| Agent | oracle 1\\.0 |" in text
    assert "cosign verify-blob --bundle x.sigstore.json x" in text
    assert START not in text and END not in text


def test_render_failed_run_is_not_scored() -> None:
    failed = dict(SUMMARY, status="INFRA_ERROR", score=None, reason="runner image missing",
                  counts={"total": 3, "completed": 0, "resolved": 0, "unresolved": 0, "infra_errors": 3})
    text = render_section(facts_from_summary(failed, "v1.2.3"))
    assert "| Score | not scored (INFRA\\_ERROR: runner image missing) |" in text
    assert "| Infrastructure errors | 3 |" in text


def test_failed_run_with_score_is_rejected() -> None:
    with pytest.raises(ValidationError, match="score"):
        facts_from_summary(dict(SUMMARY, status="FAILED"), "v1")


def test_hostile_values_cannot_fake_markers() -> None:
    text = render_section(facts_from_summary(dict(SUMMARY, suite="x | <!-- benchseal:end --> y\nz"), "v1"))
    assert END not in text and "\\|" in text
    assert splice("a", text).count(END) == 1


# --- several, nested and unbalanced sections ---------------------------------------------------

def test_two_sections_end_as_one_and_text_between_is_kept() -> None:
    body = f"notes\n{START}\nold 1\n{END}\nmiddle\n{START}\nold 2\n{END}\ntail"
    out = splice(body, "NEW")
    assert out == f"notes\n{START}\nNEW\n{END}\nmiddle\n{DUPLICATE_REMOVED}\ntail"
    assert out.count(START) == 1 and out.count(END) == 1 and "old" not in out
    assert splice(out, "NEW") == out


def test_three_sections_and_stray_ends() -> None:
    body = f"{END}a{START}1{END}b{START}2{END}c{START}3{END}d{END}e"
    out = splice(body, "S")
    assert out == f"{UNPAIRED_END}a{START}\nS\n{END}b{DUPLICATE_REMOVED}c{DUPLICATE_REMOVED}d{UNPAIRED_END}e"


def test_nested_start_goes_with_the_section_text_after_is_kept() -> None:
    body = f"a{START}x{START}y{END}z{END}w"
    out = splice(body, "S")
    assert out == f"a{START}\nS\n{END}z{UNPAIRED_END}w"


@pytest.mark.parametrize(("body", "expected"), [
    # start without end: the section goes right after it, everything after it is kept
    (f"a{START}maintainer text", f"a{START}\nS\n{END}maintainer text"),
    # two starts, no end: the first is the anchor, the second is neutralised, text kept
    (f"a{START}b{START}c", f"a{START}\nS\n{END}b{UNPAIRED_START}c"),
    # end before start (and no end after it): the start anchors, the end is neutralised
    (f"a{END}b{START}c", f"a{UNPAIRED_END}b{START}\nS\n{END}c"),
    # only ends: a start and the section go before the first end
    (f"a{END}b{END}c", f"a{START}\nS\n{END}b{UNPAIRED_END}c"),
    # a complete section followed by an unclosed start: kept text, neutralised marker
    (f"a{START}old{END}b{START}c", f"a{START}\nS\n{END}b{UNPAIRED_START}c"),
])
def test_unbalanced_markers_have_a_defined_result(body: str, expected: str) -> None:
    out = splice(body, "S")
    assert out == expected
    assert splice(out, "S") == out and splice(out, "T") == splice(body, "T")


def test_neutralising_a_marker_never_forms_a_new_one() -> None:
    """Removing a stray marker outright would join "<!-- bench" and "seal:start -->" into a start."""
    body = f"<!-- bench{END}seal:start -->{START}x{END}<!-- benchseal:{START}end -->"
    out = splice(body, "S")
    assert out.count(START) == 1 and out.count(END) == 1
    assert splice(out, "S") == out


# Bodies of unique text pieces and markers: text inside a closed section is benchseal's; all
# other text is the maintainers' and must survive, in order.
_piece = st.one_of(st.just(START), st.just(END), st.just("<!-- benchseal:"), st.just("-->"), st.just("\n"))


@settings(max_examples=300)
@given(parts=st.lists(st.one_of(_piece, st.just("TEXT")), max_size=14), section=_section.filter(lambda s: "[t" not in s))
def test_any_marker_sequence_ends_with_one_section_and_keeps_maintainer_text(parts: list[str], section: str) -> None:
    labelled = [f"[t{i}]" if p == "TEXT" else p for i, p in enumerate(parts)]
    body = "".join(labelled)
    # Which labels are inside a closed section: a START opens (once), the first END closes.
    owned: set[str] = set()
    pending: list[str] = []
    open_ = False
    for part in labelled:
        if part == START:
            open_ = True
        elif part == END and open_:
            owned.update(pending)
            pending, open_ = [], False
        elif part.startswith("[t") and open_:
            pending.append(part)
    out = splice(body, section)
    assert out.count(START) == 1 and out.count(END) == 1
    assert extract(out) == section
    kept = [p for p in labelled if p.startswith("[t") and p not in owned]
    positions = [out.find(label) for label in kept]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), (body, out)
    assert not any(label in out for label in owned)
    assert splice(out, section) == out
    assert splice(out, "other") == splice(body, "other")


# --- GitHub's body limit ---------------------------------------------------------------------------

def test_body_over_the_limit_is_refused() -> None:
    section = "s"
    envelope = len(f"{START}\n{section}\n{END}\n")
    fits = "x" * (MAX_BODY_CHARS - envelope - 2) + "\n\n"
    assert len(splice(fits, section)) == MAX_BODY_CHARS
    with pytest.raises(ValidationError, match=r"release body: would be 125001 characters .* limit of 125000"):
        splice("x" + fits, section)
    # Characters outside the BMP count twice (UTF-16), so a body of 62,600 emoji is over the limit.
    with pytest.raises(ValidationError, match="125000"):
        splice("\U0001F600" * 62_600, section)
    with pytest.raises(ValidationError, match="125000"):
        splice("notes", "y" * MAX_BODY_CHARS)


def _requests(emu: Any) -> int:
    return len(emu.requests)  # every request the emulator served, any method, any status


@pytest.mark.parametrize("field", ["reason", "suite"])
def test_oversized_section_is_refused_before_any_request(field: str, emulator: Any, make_artifacts: Any,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A summary value that makes the section alone exceed the limit: the publisher refuses it
    while preparing the publication, at once (not retried), and GitHub never sees a request."""
    from pipeline.core.contracts import DispatchPayload, GradeCounts, Grading, PublicationRequest
    from pipeline.infra.queue.sql import SqliteQueue
    from pipeline.publish.outbox import OutboxConfig, deliver_pending

    emulator.add_repo("acme/widget")
    monkeypatch.setenv("GITHUB_TOKEN", emulator.token)
    runner, api = "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64, "127.0.0.1:5055/benchseal/api@sha256:" + "2" * 64
    sealed: list[Path] = []
    with SqliteQueue(tmp_path / "queue.sqlite3") as queue:
        payload = DispatchPayload.model_validate({
            "schema": "benchseal.dispatch/v1", "correlation_id": "corr-huge-0001",
            "source": {"repository": "acme/widget", "commit": "c" * 40, "tag": "v1.0.0"}, "runner": runner, "api": api})
        run_id, _ = queue.enqueue(payload, max_attempts=2)
        record = queue.claim("test-worker", 60)
        assert record is not None and record.lease_token
        overrides: dict[str, Any] = {field: "z " * 70_000, "run_id": run_id}
        if field == "reason":
            overrides.update(status="FAILED", score=None)
        art = make_artifacts(run_id, **overrides)
        grading = Grading(run_id=run_id, status="SUCCEEDED", suite="smoke", agent="oracle",
                          counts=GradeCounts(total=3, completed=3, resolved=3, unresolved=0, infra_errors=0),
                          score=1.0, runner_ref=runner, api_ref=api, started_at="2026-01-01T00:00:00Z",
                          finished_at="2026-01-01T00:01:00Z")
        request = PublicationRequest(run_id=run_id, artifacts_dir=str(art), target="github", tag="v1.0.0",
                                     options={"repository": "acme/widget", "api_url": emulator.base_url})
        queue.complete(run_id, record.lease_token, grading, [request])
        before = len(emulator.requests)
        report = deliver_pending(queue, config=OutboxConfig(max_attempts=5, base_delay=0.0, later_delay=3600.0),
                                 reseal=sealed.append)
        assert emulator.requests[before:] == []  # not even the repository was read
        (failed,) = report.failed
        assert failed["attempts"] == 1 and not report.published
        assert re.search(r"would be \d+ characters \(UTF-16 code units\), more than GitHub's limit of 125000",
                         failed["error"]), failed["error"]
        assert sealed == [art]  # exhausted at once: publisher-error.json written and resealed


def test_maintainer_body_plus_section_over_the_limit_is_never_patched(emulator: Any, make_artifacts: Any) -> None:
    """The maintainers' notes are only known once the release is read: the spliced body is refused
    with the limit named, and the release body is never PATCHed (the notes stay as they were)."""
    from pipeline.dispatch.client import make_client
    from pipeline.publish.bundle import load_bundle
    from pipeline.publish.targets import GitHubTarget, PublishError
    from tests.fixtures.github import tag_release_commit

    emulator.add_repo("acme/widget")
    tag_release_commit(emulator, "acme/widget", "v1.0.0")  # the commit the artifacts' run benchmarked
    repo = make_client(base_url=emulator.base_url, token=emulator.token).get_repo("acme/widget")
    notes = "n" * (MAX_BODY_CHARS - 100)
    repo.create_git_release(tag="v1.0.0", name="v1.0.0", message=notes)
    bundle = load_bundle(make_artifacts(), "v1.0.0")
    with pytest.raises(PublishError, match=r"release body: would be \d+ characters .* limit of 125000"):
        GitHubTarget(repo).publish(bundle)
    assert emulator.release("acme/widget", "v1.0.0").body == notes
    assert emulator.count(method="PATCH") == 0


def _with_comparison(previous: dict[str, Any] | None, tasks: dict[str, Any], gate: dict[str, bool] | None
                     ) -> dict[str, Any]:
    from pipeline.core.documents import GateRules, PreviousRelease, ScoreInterval, TaskCounts
    from pipeline.core.history import compare

    counts = {task: TaskCounts.model_validate(c) for task, c in tasks.items()}
    comparison = compare(score=SUMMARY["score"], interval=ScoreInterval(low=0.2, high=0.9), tasks=counts,
                         previous=PreviousRelease.model_validate(previous) if previous else None,
                         gate=GateRules.model_validate(gate) if gate is not None else None)
    return dict(SUMMARY, comparison=comparison.to_json_dict())


PREVIOUS = {"tag": "v1.2.2", "run_id": "run-0", "commit": "d" * 40, "summary_digest": "sha256:" + "e" * 64,
            "score": 1.0, "tasks": {"a": {"attempts": 1, "completed": 1, "resolved": 1},
                                    "b": {"attempts": 1, "completed": 1, "resolved": 1}}}
NOW = {"a": {"attempts": 1, "completed": 1, "resolved": 1}, "b": {"attempts": 1, "completed": 1, "resolved": 0},
       "c": {"attempts": 1, "completed": 1, "resolved": 1}}


def test_the_body_shows_the_comparison_and_the_gate() -> None:
    gated = render_section(facts_from_summary(_with_comparison(PREVIOUS, NOW, {}), "v1.2.3"))
    assert ("| Compared with | v1\\.2\\.2 (score 1.000; infra run `run-0`; summary.json `sha256:" + "e" * 64 + "`) |"
            in gated)
    assert "| Score change | -0.333 |" in gated
    assert "| Tasks changed | b regressed (1/1 → 0/1), c added (not run → 1/1) |" in gated
    assert ("| Regression gate | **GATED** (published, not promoted): the score\\'s 95 \\% interval \\[0\\.2\\, "
            "0\\.9\\] lies below v1\\.2\\.2\\'s score 1; resolved in v1\\.2\\.2\\, failing now`:` b |") in gated
    # The previous score inside this release's interval and no task failing that passed: the gate passes.
    passed = render_section(facts_from_summary(_with_comparison(dict(PREVIOUS, score=0.5), PREVIOUS["tasks"], {}),
                                               "v1.2.3"))
    assert "| Tasks changed | none |" in passed and "| Regression gate | passed |" in passed
    ungated = render_section(facts_from_summary(_with_comparison(PREVIOUS, NOW, None), "v1.2.3"))
    assert "| Regression gate | none set for this suite |" in ungated
    first = render_section(facts_from_summary(_with_comparison(None, NOW, {}), "v1.2.3"))
    assert "| Compared with | nothing: the repository's first scored release of this suite |" in first
    assert "| Regression gate | not applied (no previous release) |" in first
    failed = render_section(facts_from_summary(dict(_with_comparison(PREVIOUS, NOW, {}), status="FAILED", score=None,
                                                    reason="x"), "v1.2.3"))
    assert "Compared with" not in failed  # a run without a score is not compared
