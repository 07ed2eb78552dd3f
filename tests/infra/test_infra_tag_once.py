"""A tag is released once (issue 35 point 6).

A tag whose release was accepted (then sealed: scored, gated or failed) is never released again from
another commit: refused at intake (``Queue.enqueue``, ``benchseal infra accept``) and again where the
history entry is recorded (``Queue.complete``), on SQLite and a real PostgreSQL. A re-run of the same
commit is compared with the baseline the tag's first scoring had, never with the tag itself; a gated
or superseded release is never a baseline (``pipeline.core.history.baseline``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import DispatchPayload, GradeCounts, Grading, TrialRecord
from pipeline.core.documents import GateRules, HistoryEntry, TaskCounts
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.history import baseline, tag_key, tag_refusal
from pipeline.infra.intake.policy import InfraPolicy
from pipeline.infra.queue.records import ScoredRelease
from pipeline.infra.worker.history import scored_release

A = "a" * 40
B = "b" * 40
DIGEST = "sha256:" + "ab" * 32
RIGHT = {"a": "resolved", "b": "resolved"}
WRONG = {"a": "resolved", "b": "unresolved"}


# --- the rule on its own ------------------------------------------------------------------------------

def _entry(n: int, tag: str, *, gated: bool = False, sealed: bool = True) -> HistoryEntry:
    return HistoryEntry(repository="acme/widget", suite="smoke", tag=tag, run_id=f"run-{n:020x}", commit=A, score=1.0,
                        interval=None, tasks={"a": TaskCounts(attempts=1, completed=1, resolved=1)}, gated=gated,
                        finished_at=datetime(2026, 1, 1, tzinfo=UTC), summary_digest=DIGEST if sealed else None)


def test_tag_key_drops_one_refs_tags_prefix_and_case() -> None:
    assert tag_key("v1.0") == tag_key("V1.0") == tag_key("refs/tags/v1.0") == tag_key("REFS/TAGS/V1.0") == "v1.0"
    assert tag_key("refs/tags/refs/tags/v1.0") == "refs/tags/v1.0"
    assert tag_key("release/v1") == "release/v1"


def test_tag_refusal_names_the_tag_and_both_commits() -> None:
    assert tag_refusal(repository="acme/widget", tag="v1", commit=A, released_tag="v1", released_commit=A) is None
    other = tag_refusal(repository="acme/widget", tag="v1", commit=B, released_tag="v1", released_commit=A)
    assert other is not None and "\n" not in other
    assert other.startswith(f"tag v1 of acme/widget was released from commit {A}; ") and f"refusing commit {B}" in other
    spelled = tag_refusal(repository="acme/widget", tag="V1", commit=A, released_tag="v1", released_commit=A)
    assert spelled is not None and "already released as v1" in spelled


def test_the_baseline_is_never_gated_never_superseded_never_the_tag_itself() -> None:
    s, t_good, t_gated = _entry(1, "v1"), _entry(2, "v2"), _entry(3, "v2", gated=True)
    # A gated standing release is skipped: the one before it stands.
    assert baseline([s, _entry(2, "v2", gated=True)], "v3") == s
    # v2's re-run (gated) supersedes its earlier good run: v2 is no baseline.
    assert baseline([s, t_good, t_gated], "v3") == s
    # ...and the other way round: a good re-run of a gated tag stands.
    assert baseline([s, _entry(2, "v2", gated=True), _entry(3, "v2")], "v3") == _entry(3, "v2")
    # A re-run of v2 gets what v2's first scoring got (v1), whatever came after, never v2 or v3.
    history = [s, t_good, _entry(4, "v3")]
    assert baseline(history, "v2") == s and baseline(history, "V2") == s and baseline(history, "refs/tags/v2") == s
    assert baseline(history, "v4") == _entry(4, "v3")
    # An unsealed standing release is no baseline (the seal records it); an earlier tag's is.
    assert baseline([s, _entry(2, "v2", sealed=False)], "v3") == s
    assert baseline([_entry(1, "v1", gated=True)], "v2") is None and baseline([], "v1") is None
    # Tags are ordered by their first release: a late re-run of v1 does not make v1 newer than v2.
    assert baseline([s, t_good, _entry(5, "v1")], "v3") == t_good


# --- the queue, both backends ---------------------------------------------------------------------

def _gated_policy(policy: InfraPolicy) -> InfraPolicy:
    return policy.model_copy(update={"suites": {
        name: suite.model_copy(update={"gate": GateRules()}) for name, suite in policy.suites.items()}})


def _payload(make_payload: Any, n: int, tag: str, commit: str) -> DispatchPayload:
    return DispatchPayload.model_validate(make_payload(
        correlation_id=f"tag-once-{n:06d}", source={"repository": "acme/widget", "commit": commit, "tag": tag}))


def _grading(run_id: str, payload: DispatchPayload, outcomes: dict[str, str] | None) -> Grading:
    if outcomes is None:  # the run failed: no score, no history entry
        counts = GradeCounts(total=0, completed=0, resolved=0, unresolved=0, infra_errors=0)
        return Grading(run_id=run_id, status="FAILED", suite="smoke", agent="oracle", counts=counts, score=None,
                       reason="agent crashed", runner_ref=payload.runner, api_ref=payload.api,
                       started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:00:10Z")
    trials = tuple(TrialRecord(task=task, trial_name=f"{task}__{run_id[-7:]}", outcome=outcome,  # type: ignore[arg-type]
                               reward=1.0 if outcome == "resolved" else 0.0, agent_name="oracle")
                   for task, outcome in sorted(outcomes.items()))
    resolved = sum(o == "resolved" for o in outcomes.values())
    counts = GradeCounts(total=len(outcomes), completed=len(outcomes), resolved=resolved,
                         unresolved=len(outcomes) - resolved, infra_errors=0)
    return Grading(run_id=run_id, status="SUCCEEDED", suite="smoke", agent="oracle", counts=counts,
                   score=round(resolved / len(outcomes), 6), trials=trials, runner_ref=payload.runner,
                   api_ref=payload.api, started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:00:10Z")


def _release(q: Any, make_payload: Any, policy: InfraPolicy, n: int, tag: str, commit: str,
             outcomes: dict[str, str] | None) -> tuple[str, ScoredRelease | None]:
    """Accept, grade, complete and seal one run (the worker's and the seal job's calls)."""
    payload = _payload(make_payload, n, tag, commit)
    run_id, created = q.enqueue(payload, max_attempts=3)
    assert created
    record = q.claim("w1", 60)
    assert record is not None and record.run_id == run_id and record.lease_token
    grading = _grading(run_id, payload, outcomes)
    release = scored_release(q, record, grading, policy)
    q.complete(run_id, record.lease_token, grading, [], release=release)
    if release is not None:
        q.record_summary(run_id, "sha256:" + f"{n:02x}" * 32)
    return run_id, release


@pytest.mark.parametrize("first", ["gated", "failed", "scored", "queued"])
def test_a_tag_is_never_accepted_again_from_another_commit(make_payload, queue_spec, infra_policy, first: str) -> None:
    policy = _gated_policy(infra_policy)
    with queue_spec.open() as q:
        _release(q, make_payload, policy, 1, "v1.0.0", A, RIGHT)
        if first == "queued":  # accepted, not even run yet: the tag is taken all the same
            q.enqueue(_payload(make_payload, 2, "v1.1.0", A), max_attempts=3)
        else:
            _, release = _release(q, make_payload, policy, 2, "v1.1.0", A,
                                  {"gated": WRONG, "failed": None, "scored": RIGHT}[first])
            assert (release is not None and release.entry.gated) == (first == "gated")
        before = q.list_runs()
        # (A ref spelling, refs/tags/v1.1.0, never reaches the queue: the payload model refuses it, TagIsARef.)
        for n, tag in ((3, "v1.1.0"), (4, "V1.1.0")):
            with pytest.raises(ValidationError) as info:
                q.enqueue(_payload(make_payload, n, tag, B), max_attempts=3)
            assert info.value.field == "payload.source.tag"
            assert f"was released from commit {A}" in info.value.rule and f"refusing commit {B}" in info.value.rule
            assert len(info.value.diagnostics().splitlines()) == 1
        # Nothing of the refused dispatches was written, and the tag's history is the first commit's.
        assert q.list_runs() == before
        assert {e.commit for e in q.history("acme/widget")} <= {A}


def test_the_same_tag_spelled_differently_is_refused_even_from_the_same_commit(make_payload, queue_spec) -> None:
    with queue_spec.open() as q:
        q.enqueue(_payload(make_payload, 1, "v2.0.0", A), max_attempts=3)
        for n, tag in ((2, "V2.0.0"),):
            with pytest.raises(ValidationError, match=r"already released as v2\.0\.0"):
                q.enqueue(_payload(make_payload, n, tag, A), max_attempts=3)
        # Another repository's tag of the same name is its own; a redelivery is still the same run.
        other = DispatchPayload.model_validate(make_payload(correlation_id="tag-once-000009", source={
            "repository": "acme/other", "commit": B, "tag": "v2.0.0"}))
        assert q.enqueue(other, max_attempts=3)[1] is True
        assert q.enqueue(_payload(make_payload, 1, "v2.0.0", A), max_attempts=3)[1] is False


def test_a_rerun_of_the_same_commit_is_compared_with_the_first_runs_baseline(make_payload, queue_spec,
                                                                             infra_policy) -> None:
    policy = _gated_policy(infra_policy)
    with queue_spec.open() as q:
        first, _ = _release(q, make_payload, policy, 1, "v1.0.0", A, RIGHT)
        gated_run, gated = _release(q, make_payload, policy, 2, "v1.1.0", B, WRONG)
        assert gated is not None and gated.comparison.gated and gated.comparison.previous is not None
        assert gated.comparison.previous.run_id == first
        # The gated tag re-run from its own commit: allowed, compared with v1.0.0 again (not with itself).
        rerun, again = _release(q, make_payload, policy, 3, "v1.1.0", B, RIGHT)
        assert again is not None and again.comparison.previous is not None
        assert again.comparison.previous.run_id == first and not again.comparison.gated
        # ...and its ungated re-run now stands for v1.1.0: the next tag is compared with it.
        _, nxt = _release(q, make_payload, policy, 4, "v1.2.0", A, RIGHT)
        assert nxt is not None and nxt.comparison.previous is not None and nxt.comparison.previous.run_id == rerun
        # A good tag's re-run is compared with what its first run had (v1.1.0's re-run), never with itself.
        _, third = _release(q, make_payload, policy, 5, "v1.2.0", A, WRONG)
        assert third is not None and third.comparison.previous is not None
        assert third.comparison.previous.run_id == rerun and third.comparison.gated
        assert gated_run != rerun


def test_a_gated_or_superseded_release_is_never_the_next_baseline(make_payload, queue_spec, infra_policy) -> None:
    policy = _gated_policy(infra_policy)
    with queue_spec.open() as q:
        first, _ = _release(q, make_payload, policy, 1, "v1.0.0", A, RIGHT)
        good, _ = _release(q, make_payload, policy, 2, "v1.1.0", B, RIGHT)
        # v1.1.0 re-run from its commit, now gated (against v1.0.0): it supersedes the good run.
        _, rerun = _release(q, make_payload, policy, 3, "v1.1.0", B, WRONG)
        assert rerun is not None and rerun.comparison.gated and rerun.comparison.previous is not None
        assert rerun.comparison.previous.run_id == first
        _, nxt = _release(q, make_payload, policy, 4, "v1.2.0", B, WRONG)
        assert nxt is not None and nxt.comparison.previous is not None
        assert nxt.comparison.previous.run_id == first != good and nxt.comparison.gated
        assert q.previous_release("acme/widget", "smoke", "v9.9.9") is not None
        assert q.previous_release("acme/widget", "smoke", "v9.9.9").run_id == first  # type: ignore[union-attr]


def test_complete_refuses_a_history_entry_of_another_commit_than_the_tags(make_payload, queue_spec,
                                                                         infra_policy) -> None:
    """Where the history entry is written, the tag's binding is checked again: a run whose tag was bound
    to another commit on another path (here: the binding row rewritten) records nothing."""
    with queue_spec.open() as q:
        payload = _payload(make_payload, 1, "v3.0.0", A)
        run_id, _ = q.enqueue(payload, max_attempts=3)
        record = q.claim("w1", 60)
        assert record is not None and record.lease_token
        grading = _grading(run_id, payload, RIGHT)
        release = scored_release(q, record, grading, infra_policy)
        assert release is not None
        # An entry that does not name the run's own source is refused outright.
        for change in ({"commit": B}, {"tag": "v3.0.1"}):
            lying = ScoredRelease(entry=release.entry.model_copy(update=change), comparison=release.comparison)
            with pytest.raises(ValidationError, match=r"must name run .* source"):
                q.complete(run_id, record.lease_token, grading, [], release=lying)

        def rebind(cur: Any) -> None:
            cur.execute("UPDATE release_tags SET source_commit = ? WHERE repository = ? AND tag_key = ?",
                        (B, "acme/widget", "v3.0.0"))

        q._transaction(rebind)
        with pytest.raises(CheckFailed, match=rf"^run {run_id}: tag v3.0.0 of acme/widget was released from commit {B}"):
            q.complete(run_id, record.lease_token, grading, [], release=release)
        assert q.history("acme/widget") == [] and q.get_run(run_id).state == "CLAIMED"  # nothing half-written


def _as_version_5(q: Any) -> None:
    def work(cur: Any) -> None:
        cur.execute("DROP TABLE release_tags")
        cur.execute("ALTER TABLE workers DROP COLUMN problem")  # version 7
        cur.execute("DELETE FROM schema_migrations WHERE version >= 6")

    q._transaction(work)


def test_the_migration_binds_every_queued_tag_to_its_oldest_runs_commit(make_payload, queue_spec) -> None:
    with queue_spec.open() as q:
        q.enqueue(_payload(make_payload, 1, "v4.0.0", A), max_attempts=3)
        _as_version_5(q)
        # Written before tags were bound: the same tag from another commit got in (the bug).
        def smuggle(cur: Any) -> None:
            payload = _payload(make_payload, 2, "V4.0.0", B)
            cur.execute("INSERT INTO runs (run_id, correlation_id, payload, state, attempts, max_attempts, created_at,"
                        " updated_at) VALUES ('run-late', ?, ?, 'QUEUED', 0, 3, '2999-01-01T00:00:00Z',"
                        " '2999-01-01T00:00:00Z')", (payload.correlation_id, json.dumps(payload.to_json_dict())))

        q._transaction(smuggle)
        assert q.migrate() == (5, 7)

        def bound(cur: Any) -> list[Any]:
            cur.execute("SELECT repository, tag_key, tag, source_commit FROM release_tags ORDER BY tag_key")
            return list(cur.fetchall())

        assert [tuple(row) for row in q._read(bound)] == [("acme/widget", "v4.0.0", "v4.0.0", A)]
        with pytest.raises(ValidationError, match=f"released from commit {A}"):
            q.enqueue(_payload(make_payload, 3, "v4.0.0", B), max_attempts=3)


def test_cli_accept_refuses_a_released_tag_from_another_commit_in_one_line(make_payload, tmp_path: Path,
                                                                          queue_db: Path) -> None:
    cmd = [sys.executable, "-m", "pipeline", "infra", "accept", "--db", str(queue_db), "--payload", "-"]
    first = json.dumps(make_payload(correlation_id="tag-once-cli-1",
                                    source={"repository": "acme/widget", "commit": A, "tag": "v5.0.0"}))
    assert subprocess.run(cmd, input=first, capture_output=True, text=True, check=False).returncode == 0
    moved = json.dumps(make_payload(correlation_id="tag-once-cli-2",
                                    source={"repository": "acme/widget", "commit": B, "tag": "v5.0.0"}))
    done = subprocess.run(cmd, input=moved, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "payload.source.tag" in line and "tag v5.0.0 of acme/widget" in line
    assert A in line and B in line and "Traceback" not in done.stderr
