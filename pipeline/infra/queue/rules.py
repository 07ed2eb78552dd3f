"""``SqlQueue``: the queue's rules for runs and their trials, written once in portable SQL (``?``
placeholders) over ``SqlBase``'s plumbing; the backends (``SqliteQueue``, ``PostgresQueue``) give it
transactions and the claim lock clause. The rules are described in ``pipeline.infra.queue.sql``."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pipeline.core.contracts import (
    DispatchPayload,
    Grading,
    PublicationRequest,
    RunState,
    canonical_repository,
    run_id_for,
)
from pipeline.core.digests import validate_digest
from pipeline.core.documents import Comparison, HistoryEntry, PlannedTrial
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.history import baseline, tag_key, tag_refusal
from pipeline.infra.queue.helpers import Cursor, epoch, iso, one_line
from pipeline.infra.queue.interface import ACCEPTED_POLICY
from pipeline.infra.queue.records import (
    ACTIVE_STATES,
    MAX_TRIAL_EVIDENCE_BYTES,
    PublicationState,
    RunRecord,
    ScoredRelease,
    TrialBatch,
    TrialClaim,
    TrialRow,
    TrialState,
    batch_label,
    canonical_payload,
)
from pipeline.infra.queue.schema import RUN_COLUMNS, sql_list, sql_text
from pipeline.infra.queue.sqlbase import SqlBase

# The states as the statements below write them, generated from their enums (never spelled out here);
# the S608 noqa on those statements: what they interpolate is these constants, never input.
_QUEUED, _CLAIMED, _RUNNING = (sql_text(s) for s in (RunState.QUEUED, RunState.CLAIMED, RunState.RUNNING))
_ACTIVE = sql_list(ACTIVE_STATES)
_TRIAL_QUEUED, _TRIAL_RUNNING, _TRIAL_DONE = (sql_text(s) for s in (TrialState.QUEUED, TrialState.RUNNING, TrialState.DONE))
_PENDING = sql_text(PublicationState.PENDING)


class SqlQueue(SqlBase):
    """The queue's rules over a DB-API backend; subclasses give transactions and the claim lock clause."""

    def __enter__(self) -> SqlQueue:
        return self

    # --- runs --------------------------------------------------------------------

    def enqueue(self, payload: DispatchPayload, *, max_attempts: int,
                policy_digest: str | None = None) -> tuple[str, bool]:
        run_id = run_id_for(payload.correlation_id)
        accepted = None if policy_digest is None else ACCEPTED_POLICY + validate_digest(policy_digest, "policy_digest")
        encoded = canonical_payload(payload)
        now = time.time()

        def work(cur: Cursor) -> tuple[str, bool, bool]:
            cur.execute(
                "INSERT INTO runs (run_id, correlation_id, payload, state, attempts, max_attempts, created_at, updated_at)"  # noqa: S608
                f" VALUES (?, ?, ?, {_QUEUED}, 0, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING run_id",
                (run_id, payload.correlation_id, encoded, max_attempts, iso(now), iso(now)),
            )
            if cur.fetchone() is not None:
                # Bound in the transaction that accepts the run: of two concurrent dispatches of one tag
                # from two commits, the second waits on the first's key, then is refused here.
                refusal = self._bind_tag(cur, payload, run_id, now)
                if refusal is not None:
                    raise ValidationError("payload.source.tag", refusal, payload.source.tag)
                self._event(cur, run_id, "accepted", None, RunState.QUEUED, accepted, now)
                return run_id, True, True
            cur.execute("SELECT run_id, payload FROM runs WHERE correlation_id = ?", (payload.correlation_id,))
            existing = cur.fetchone()
            if existing is None:
                raise CheckFailed(f"run id {run_id} is taken by another correlation id; refusing {payload.correlation_id!r}")
            same = str(existing[1]) == encoded
            # A refused redelivery is recorded as what it is, never as "redelivered".
            self._event(cur, str(existing[0]), "redelivered" if same else "redelivery_refused", None, None,
                        None if same else "same correlation id, different payload", now)
            return str(existing[0]), False, same

        found, created, same = self._transaction(work)
        if not same:
            # Same correlation id, different content: never silently merge two dispatches.
            raise ValidationError("payload.correlation_id", f"already used by run {found} with a different payload",
                                  payload.correlation_id)
        if created:
            self._write_status(found)
        return found, created

    def claim(self, worker: str, lease_seconds: float, now: datetime | None = None) -> RunRecord | None:
        at = epoch(now)
        token = secrets.token_hex(16)

        def work(cur: Cursor) -> tuple[object, ...] | None:
            # One statement: pick the oldest QUEUED run (finalize before run: 'finalize' < 'run', their
            # results are already in), skipping rows other claimers hold, and claim it; the outer
            # state guard is the contract.
            cur.execute(
                f"UPDATE runs SET state = {_CLAIMED}, lease_token = ?, lease_expires_at = ?, worker = ?,"  # noqa: S608
                " attempts = attempts + CASE WHEN phase = 'run' THEN 1 ELSE 0 END,"
                " finalize_attempts = finalize_attempts + CASE WHEN phase = 'finalize' THEN 1 ELSE 0 END,"
                f" updated_at = ? WHERE state = {_QUEUED} AND run_id = (SELECT run_id FROM runs WHERE state = {_QUEUED}"
                " ORDER BY phase, created_at, run_id LIMIT 1" + self._claim_lock + f") RETURNING {RUN_COLUMNS}",
                (token, at + lease_seconds, worker, iso(at)),
            )
            row: tuple[object, ...] | None = cur.fetchone()
            if row is None:
                self._beat(cur, worker, None, at)
                return None
            run_id = str(row[0])
            self._event(cur, run_id, "claimed", RunState.QUEUED, RunState.CLAIMED, f"worker={worker}", at)
            self._beat(cur, worker, run_id, at)
            return row

        row = self._transaction(work)
        if row is None:
            return None
        record = self._record(row)
        self._write_status(record.run_id, row)
        return record

    def start(self, run_id: str, lease_token: str) -> None:
        self._transition(run_id, lease_token, from_states=(RunState.CLAIMED,), event="started", to_state=RunState.RUNNING, detail=None)

    def heartbeat(self, run_id: str, lease_token: str, lease_seconds: float, now: datetime | None = None) -> bool:
        at = epoch(now)

        def work(cur: Cursor) -> bool:
            if self._relaxed_commit:
                cur.execute(self._relaxed_commit)
            cur.execute(
                f"UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND lease_token = ? AND state IN {_ACTIVE}"  # noqa: S608
                " RETURNING worker",
                (at + lease_seconds, run_id, lease_token),
            )
            row = cur.fetchone()
            if row is None:
                return False
            if row is not None and row[0] is not None:
                self._beat(cur, str(row[0]), run_id, at)
            return True

        return self._transaction(work)

    def release(self, run_id: str, lease_token: str, reason: str) -> None:
        # A voluntary release (SIGTERM) does not use up an attempt (of either phase).
        self._transition(
            run_id, lease_token, from_states=tuple(ACTIVE_STATES), event="released", to_state=RunState.QUEUED, detail=reason,
            sets=", lease_token = NULL, lease_expires_at = NULL, worker = NULL,"
                 " phase = CASE WHEN trials_planned > 0 THEN 'finalize' ELSE phase END,"
                 " attempts = CASE WHEN phase = 'run' AND trials_planned = 0 AND attempts > 0 THEN attempts - 1 ELSE attempts END,"
                 " finalize_attempts = CASE WHEN phase = 'finalize' AND finalize_attempts > 0"
                 " THEN finalize_attempts - 1 ELSE finalize_attempts END",
        )

    def fail_infra(self, run_id: str, lease_token: str, reason: str) -> RunState:
        """Record an infrastructure error: requeue; once attempts are used up, requeue for finalization.

        Never terminal by itself: the run ends through ``complete`` (grading + outbox rows).
        """
        record = self.get_run(run_id)
        # A planned run has no attempts left to run: its trials ended; it waits to be graded again.
        exhausted = record.phase == "finalize" or record.attempts >= record.max_attempts or record.trials_planned > 0
        self._transition(
            run_id, lease_token, from_states=tuple(ACTIVE_STATES),
            event="finalize_pending" if exhausted else "requeued", to_state=RunState.QUEUED, detail=reason,
            sets=", lease_token = NULL, lease_expires_at = NULL, reason = ?, phase = ?",
            params=(reason, "finalize" if exhausted else "run"),
        )
        return RunState.QUEUED

    def begin_finalize(self, run_id: str, lease_token: str, reason: str) -> None:
        """The attempts are used up: keep the lease and switch the run to its finalize phase."""
        self._transition(
            run_id, lease_token, from_states=tuple(ACTIVE_STATES), event="finalizing", to_state=RunState.RUNNING, detail=reason,
            sets=", reason = ?, phase = 'finalize'", params=(reason,),
        )

    def complete(
        self, run_id: str, lease_token: str, grading: Grading, publications: Sequence[PublicationRequest],
        *, release: ScoredRelease | None = None,
    ) -> list[int]:
        """Terminal state + grading + outbox rows (+ the release's history entry and comparison) in ONE
        transaction; refuses unless the lease is held.

        Returns the ids of the run's outbox rows (so a caller can deliver them without a lookup)."""
        if grading.run_id != run_id:
            raise ValidationError("grading.run_id", f"must equal the run id {run_id}", grading.run_id)
        if release is not None and (release.entry.run_id != run_id or grading.status != RunState.SUCCEEDED
                                    or release.entry.score != grading.score):
            raise ValidationError("release", f"must be the history entry of run {run_id}'s SUCCEEDED grading",
                                  release.entry.run_id)
        for index, request in enumerate(publications):
            if request.run_id != run_id:
                raise ValidationError(f"publications[{index}].run_id", f"must equal the run id {run_id}", request.run_id)
        now = time.time()

        def work(cur: Cursor) -> tuple[tuple[object, ...] | None, list[int]]:
            ended: tuple[object, ...] | None = None
            current: RunState | None = None
            # RUNNING first (the usual case: no read before the update), then CLAIMED.
            for current in (RunState.RUNNING, RunState.CLAIMED):
                cur.execute(
                    "UPDATE runs SET state = ?, grading = ?, reason = ?, lease_token = NULL, lease_expires_at = NULL,"  # noqa: S608
                    " updated_at = ? WHERE run_id = ? AND lease_token = ? AND state = ?"
                    # A planned run ends only once every one of its trials has ended.
                    f" AND NOT EXISTS (SELECT 1 FROM trials WHERE trials.run_id = runs.run_id AND trials.state <> {_TRIAL_DONE})"
                    f" RETURNING {RUN_COLUMNS}",
                    (grading.status, grading.model_dump_json(), grading.reason, iso(now), run_id, lease_token, current),
                )
                ended = cur.fetchone()
                if ended is not None:
                    break
            if ended is None:
                found = self._row(cur, run_id)
                if found is None:
                    raise ValidationError("run_id", "no such run", run_id)
                raise CheckFailed(f"run {run_id}: lease not held or trials still open (state {found[3]}); refusing to complete")
            self._event(cur, run_id, "completed", current, grading.status, grading.reason, now)
            if release is not None:
                self._insert_release(cur, self._record(ended).payload, grading, release, now)
            ids: list[int] = []
            for request in publications:
                cur.execute(
                    "INSERT INTO publications (run_id, target, tag, request, state, attempts, next_attempt_at, created_at, updated_at)"  # noqa: S608
                    f" VALUES (?, ?, ?, ?, {_PENDING}, 0, ?, ?, ?) ON CONFLICT (run_id, target, tag) DO NOTHING RETURNING id",
                    (run_id, request.target, request.tag, request.model_dump_json(), now, iso(now), iso(now)),
                )
                inserted = cur.fetchone()
                if inserted is not None:
                    ids.append(int(inserted[0]))
                self._event(cur, run_id, "publication_queued", None, None, f"{request.target}:{request.tag}", now)
            return ended, ids

        row, ids = self._transaction(work)
        self._write_status(run_id, row)
        return ids

    # --- the history of scored releases (pipeline.core.history) -------------------

    @staticmethod
    def _bind_tag(cur: Cursor, payload: DispatchPayload, run_id: str, now: float) -> str | None:
        """Bind the payload's tag to its commit unless it is bound already; why a run of it may not be
        accepted or recorded (``tag_refusal``), or None."""
        source = payload.source
        repository, key = canonical_repository(source.repository), tag_key(source.tag)
        cur.execute("INSERT INTO release_tags (repository, tag_key, tag, source_commit, run_id, bound_at)"
                    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (repository, key, source.tag, source.commit, run_id, iso(now)))
        cur.execute("SELECT tag, source_commit FROM release_tags WHERE repository = ? AND tag_key = ?", (repository, key))
        bound = cur.fetchone()
        if bound is None:  # pragma: no cover - the insert above or a committed one holds the key
            raise CheckFailed(f"tag {source.tag} of {repository}: its binding to a commit was not recorded")
        return tag_refusal(repository=source.repository, tag=source.tag, commit=source.commit,
                           released_tag=str(bound[0]), released_commit=str(bound[1]))

    def _insert_release(self, cur: Cursor, payload: DispatchPayload, grading: Grading, release: ScoredRelease,
                        now: float) -> None:
        entry, source, run_id = release.entry, payload.source, grading.run_id
        if entry.gated != release.comparison.gated:
            raise ValidationError("release.entry.gated", "must be the comparison's verdict", entry.gated)
        if (canonical_repository(entry.repository), entry.tag, entry.commit) != (
                canonical_repository(source.repository), source.tag, source.commit):
            raise ValidationError("release.entry", f"must name run {run_id}'s source (repository, tag, commit) "
                                  f"{source.repository} {source.tag} {source.commit}", f"{entry.tag} {entry.commit}")
        # The tag's binding again, where the history entry is written: no path records a second commit.
        refusal = self._bind_tag(cur, payload, run_id, now)
        if refusal is not None:
            raise CheckFailed(f"run {run_id}: {refusal}")
        # A finalize retry of the same run writes the same entry again: the first one stands.
        cur.execute(
            "INSERT INTO releases (run_id, repository, suite, tag, entry, comparison, gated, recorded_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
            (run_id, canonical_repository(entry.repository), grading.suite, entry.tag, entry.model_dump_json(),
             release.comparison.model_dump_json(by_alias=True), int(entry.gated), iso(now)),
        )

    def previous_release(self, repository: str, suite: str, tag: str) -> HistoryEntry | None:
        """The release one of ``repository``, ``suite`` and ``tag`` is compared with
        (``pipeline.core.history.baseline`` over the repository and suite's history)."""
        return baseline(self.history(repository, suite), tag)

    def history(self, repository: str, suite: str | None = None) -> list[HistoryEntry]:
        """Every recorded release of ``repository`` (and ``suite``), oldest first."""

        def work(cur: Cursor) -> list[Any]:
            clause, params = ("", (canonical_repository(repository),)) if suite is None else (
                " AND suite = ?", (canonical_repository(repository), suite))
            cur.execute("SELECT entry, summary_digest FROM releases WHERE repository = ?"  # noqa: S608
                        f"{clause} ORDER BY recorded_at, run_id", params)
            return cur.fetchall()

        return [_history_entry(row) for row in self._read(work)]

    def history_repositories(self) -> list[str]:
        """The (canonical) source repositories that have a recorded release."""

        def work(cur: Cursor) -> list[Any]:
            cur.execute("SELECT DISTINCT repository FROM releases ORDER BY repository")
            return cur.fetchall()

        return [str(row[0]) for row in self._read(work)]

    def comparison(self, run_id: str) -> Comparison | None:
        """The comparison recorded with ``run_id``'s history entry (None: the run was not scored)."""

        def work(cur: Cursor) -> Any:
            cur.execute("SELECT comparison FROM releases WHERE run_id = ?", (run_id,))
            return cur.fetchone()

        row = self._read(work)
        return None if row is None else Comparison.model_validate_json(str(row[0]))

    def record_summary(self, run_id: str, summary_digest: str) -> None:
        """Record the digest of the sealed summary.json of ``run_id``'s release (idempotent; a different
        digest for the same run is refused: one run has one sealed summary)."""
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", summary_digest):
            raise ValidationError("summary_digest", "must be sha256:<64 lowercase hex>", summary_digest)

        def work(cur: Cursor) -> None:
            cur.execute("UPDATE releases SET summary_digest = ? WHERE run_id = ? AND summary_digest IS NULL",
                        (summary_digest, run_id))
            if cur.rowcount == 1:
                self._event(cur, run_id, "summary_recorded", None, None, summary_digest, time.time())
                return
            cur.execute("SELECT summary_digest FROM releases WHERE run_id = ?", (run_id,))
            found = cur.fetchone()
            if found is None:
                raise ValidationError("run_id", "has no scored release in the history", run_id)
            if str(found[0]) != summary_digest:
                raise CheckFailed(f"run {run_id}: its summary was recorded as {found[0]}, refusing {summary_digest}")

        self._transaction(work)

    def requeue_expired(self, now: datetime | None = None) -> list[str]:
        """Requeue runs whose lease expired (a dead worker); to the finalize phase once attempts are used up."""
        at = epoch(now)

        def expired(cur: Cursor) -> bool:
            cur.execute(f"SELECT 1 FROM runs WHERE state IN {_ACTIVE} AND lease_expires_at < ? LIMIT 1", (at,))  # noqa: S608
            return cur.fetchone() is not None

        # Trials first: a run whose last trial expires here is queued for grading in the same pass.
        changed_trials = self._requeue_expired_trials(at)
        # A plain read first: the common case (nothing expired) takes no write lock.
        if not self._read(expired):
            return changed_trials

        def work(cur: Cursor) -> list[str]:
            changed: list[str] = []
            cur.execute(
                "SELECT run_id, state, attempts, max_attempts, lease_token, phase, trials_planned FROM runs"  # noqa: S608
                f" WHERE state IN {_ACTIVE} AND lease_expires_at < ?" + self._claim_lock,
                (at,),
            )
            for run_id, state, attempts, max_attempts, token, phase, planned in cur.fetchall():
                # A planned run's lease is its grader's: every trial has ended, so the next claim grades it.
                exhausted = phase == "finalize" or attempts >= max_attempts or int(planned) > 0
                if int(planned) > 0:
                    reason = "lease expired while grading; queued for grading again"
                elif exhausted:
                    reason = (f"lease expired on the final attempt ({attempts} of {max_attempts}); finalizing with the"
                              " trials that completed")
                else:
                    reason = "lease expired"
                cur.execute(
                    f"UPDATE runs SET state = {_QUEUED}, lease_token = NULL, lease_expires_at = NULL, reason = ?, phase = ?,"  # noqa: S608
                    " updated_at = ? WHERE run_id = ? AND lease_token = ? AND state = ? RETURNING run_id",
                    (reason, "finalize" if exhausted else "run", iso(at), run_id, token, state),
                )
                if cur.fetchone() is not None:
                    self._event(cur, run_id, "lease_expired", state, RunState.QUEUED, reason, at)
                    changed.append(str(run_id))
            return changed

        changed = self._transaction(work)
        for run_id in changed:
            self._write_status(run_id)
        return changed_trials + [r for r in changed if r not in changed_trials]

    # --- trials: the work split below the run -----------------------------------------
    # Lock order everywhere: the run row first, then its trial rows (no deadlock between a
    # completing batch and the expiry scan). Every transaction that can end a run's last trial
    # locks the run row before counting what is left, so exactly one of two concurrent batches
    # sees zero trials left (READ COMMITTED re-reads after the lock).

    def _lock_run(self, cur: Cursor, run_id: str) -> tuple[object, ...]:
        cur.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?" + self._row_lock, (run_id,))  # noqa: S608
        row: tuple[object, ...] | None = cur.fetchone()
        if row is None:
            raise ValidationError("run_id", "no such run", run_id)
        return row

    def _claim_trials(self, cur: Cursor, worker: str, lease_seconds: float, limit: int, run_id: str | None,
                      at: float) -> TrialBatch | None:
        if limit < 1:
            raise ValidationError("limit", "must be >= 1", limit)
        target = run_id
        if target is None:
            cur.execute(f"SELECT run_id FROM trials WHERE state = {_TRIAL_QUEUED}"  # noqa: S608
                        " ORDER BY created_at, run_id, idx LIMIT 1" + self._claim_lock)
            first = cur.fetchone()
            if first is None:
                return None
            target = str(first[0])
        cur.execute(f"SELECT idx FROM trials WHERE run_id = ? AND state = {_TRIAL_QUEUED} ORDER BY idx LIMIT ?"  # noqa: S608
                    + self._claim_lock, (target, int(limit)))
        picked = [int(r[0]) for r in cur.fetchall()]
        if not picked:
            return None
        token = secrets.token_hex(16)
        marks = ",".join("?" for _ in picked)
        cur.execute(
            f"UPDATE trials SET state = {_TRIAL_RUNNING}, lease_token = ?, lease_expires_at = ?, worker = ?,"  # noqa: S608
            f" attempts = attempts + 1, updated_at = ? WHERE run_id = ? AND state = {_TRIAL_QUEUED} AND idx IN ({marks})"
            " RETURNING idx, task, trial_name, attempts, max_attempts",
            (token, at + lease_seconds, worker, iso(at), target, *picked),
        )
        claims = tuple(sorted((TrialClaim(idx=int(i), task=str(t), trial_name=str(n), attempts=int(a), max_attempts=int(m))
                               for i, t, n, a, m in cur.fetchall()), key=lambda c: c.idx))
        if len(claims) != len(picked):  # cannot happen under the row locks; the guard is the contract
            raise CheckFailed(f"run {target}: trials {picked} changed while being claimed")
        self._event(cur, target, "trials_claimed", None, None, f"worker={worker} trials={picked}", at)
        self._beat(cur, worker, target, at)
        run = self._row(cur, target)
        if run is None:
            raise ValidationError("run_id", "no such run", target)
        return TrialBatch(run=self._record(run), lease_token=token, trials=claims)

    def plan_trials(self, run_id: str, lease_token: str, trials: Sequence[PlannedTrial], *, max_attempts: int,
                    claim: int = 0, worker: str | None = None, lease_seconds: float = 0.0) -> TrialBatch | None:
        if not trials:
            raise ValidationError("trials", "a run must be planned with at least one trial", run_id)
        names = [t.trial_name for t in trials]
        if len(set(names)) != len(names):
            raise ValidationError("trials", "trial names must be unique within a run", run_id)
        if max_attempts < 1:
            raise ValidationError("max_attempts", "must be >= 1", max_attempts)
        if claim and (worker is None or lease_seconds <= 0):
            raise ValidationError("claim", "claiming a first batch needs a worker and a lease", claim)
        at = time.time()

        def work(cur: Cursor) -> tuple[tuple[object, ...] | None, TrialBatch | None]:
            current = str(self._lock_run(cur, run_id)[3])
            cur.execute(
                f"UPDATE runs SET state = {_RUNNING}, lease_token = NULL, lease_expires_at = NULL, worker = NULL,"  # noqa: S608
                " trials_planned = ?, updated_at = ? WHERE run_id = ? AND lease_token = ?"
                f" AND state IN {_ACTIVE} AND phase = 'run' AND trials_planned = 0 RETURNING run_id",
                (len(trials), iso(at), run_id, lease_token),
            )
            if cur.fetchone() is None:
                raise CheckFailed(f"run {run_id}: lease not held, or already planned (state {current}); refusing to plan trials")
            self._event(cur, run_id, "trials_planned", current, RunState.RUNNING, f"{len(trials)} trials", at)
            for first in range(0, len(trials), 100):  # one statement per 100 trials
                chunk = list(enumerate(trials))[first:first + 100]
                cur.execute(
                    "INSERT INTO trials (run_id, idx, task, trial_name, state, attempts, max_attempts, created_at, updated_at)"  # noqa: S608
                    " VALUES " + ",".join(f"(?, ?, ?, ?, {_TRIAL_QUEUED}, 0, ?, ?, ?)" for _ in chunk),
                    [v for idx, trial in chunk for v in (run_id, idx, trial.task, trial.trial_name, max_attempts,
                                                          iso(at), iso(at))],
                )
            batch = self._claim_trials(cur, worker or "", lease_seconds, claim, run_id, at) if claim else None
            return (None if batch is not None else self._row(cur, run_id)), batch

        row, batch = self._transaction(work)
        if batch is not None:
            self._write_status(run_id, batch.run)
        else:
            self._write_status(run_id, row)
        return batch

    def claim_trials(self, worker: str, lease_seconds: float, limit: int, *, run_id: str | None = None,
                     now: datetime | None = None) -> TrialBatch | None:
        at = epoch(now)

        def any_queued(cur: Cursor) -> bool:
            if run_id is None:
                cur.execute(f"SELECT 1 FROM trials WHERE state = {_TRIAL_QUEUED} LIMIT 1")  # noqa: S608
            else:
                cur.execute(f"SELECT 1 FROM trials WHERE run_id = ? AND state = {_TRIAL_QUEUED} LIMIT 1", (run_id,))  # noqa: S608
            return cur.fetchone() is not None

        # The common case for an idle worker or one-trial runs (nothing queued) takes no write lock.
        if not self._read(any_queued):
            return None
        return self._transaction(lambda cur: self._claim_trials(cur, worker, lease_seconds, limit, run_id, at))

    def heartbeat_trials(self, run_id: str, lease_token: str, lease_seconds: float, now: datetime | None = None) -> bool:
        at = epoch(now)

        def work(cur: Cursor) -> bool:
            if self._relaxed_commit:
                cur.execute(self._relaxed_commit)
            cur.execute(f"UPDATE trials SET lease_expires_at = ? WHERE run_id = ? AND lease_token = ? AND state = {_TRIAL_RUNNING}"  # noqa: S608
                        " RETURNING worker", (at + lease_seconds, run_id, lease_token))
            rows = cur.fetchall()
            if not rows:
                return False
            row = rows[0]
            if row is not None and row[0] is not None:
                self._beat(cur, str(row[0]), run_id, at)
            return True

        return self._transaction(work)

    def _held_trials(self, cur: Cursor, run_id: str, lease_token: str, what: str) -> tuple[list[int], str]:
        cur.execute(f"SELECT idx, worker FROM trials WHERE run_id = ? AND lease_token = ? AND state = {_TRIAL_RUNNING} ORDER BY idx",  # noqa: S608
                    (run_id, lease_token))
        rows = cur.fetchall()
        if not rows:
            raise CheckFailed(f"run {run_id}: trial lease not held; refusing {what}")
        return [int(r[0]) for r in rows], str(rows[0][1] or "")

    def _after_trials_end(self, cur: Cursor, run_id: str, worker: str | None, lease_seconds: float,
                          at: float) -> tuple[object, ...] | None:
        """When no trial of ``run_id`` is left, hand the run to ``worker`` under a fresh lease (it grades
        and completes it), or with no worker (lease expiry) queue it to be graded by the next claim."""
        cur.execute(f"SELECT COUNT(*) FROM trials WHERE run_id = ? AND state <> {_TRIAL_DONE}", (run_id,))  # noqa: S608
        if int(cur.fetchone()[0]) != 0:
            return None
        if worker is None:
            cur.execute(
                f"UPDATE runs SET state = {_QUEUED}, phase = 'finalize', lease_token = NULL, lease_expires_at = NULL,"  # noqa: S608
                f" worker = NULL, updated_at = ? WHERE run_id = ? AND state = {_RUNNING} AND lease_token IS NULL"
                " AND trials_planned > 0 RETURNING run_id", (iso(at), run_id))
            if cur.fetchone() is not None:
                self._event(cur, run_id, "trials_done", RunState.RUNNING, RunState.QUEUED, "the last trial ended by lease expiry: queued for grading", at)
            return None
        token = secrets.token_hex(16)
        cur.execute(
            "UPDATE runs SET lease_token = ?, lease_expires_at = ?, worker = ?, updated_at = ?"  # noqa: S608
            f" WHERE run_id = ? AND state = {_RUNNING} AND lease_token IS NULL AND trials_planned > 0"
            f" RETURNING {RUN_COLUMNS}",
            (token, at + lease_seconds, worker, iso(at), run_id))
        row: tuple[object, ...] | None = cur.fetchone()
        if row is None:
            return None
        self._event(cur, run_id, "trials_done", None, None, f"worker={worker} grades the run", at)
        self._beat(cur, worker, run_id, at)
        return row

    def complete_trials(self, run_id: str, lease_token: str, results: Mapping[int, str], *,
                        lease_seconds: float, evidence: Mapping[int, bytes] | None = None) -> RunRecord | None:
        at = time.time()
        packed = dict(evidence or {})
        for idx, data in packed.items():
            if idx not in results:
                raise ValidationError(f"evidence[{idx}]", "must belong to a trial recorded in the same call", run_id)
            if not isinstance(data, bytes) or len(data) > MAX_TRIAL_EVIDENCE_BYTES:
                raise ValidationError(f"evidence[{idx}]", f"must be bytes, at most {MAX_TRIAL_EVIDENCE_BYTES}",
                                      type(data).__name__ if not isinstance(data, bytes) else len(data))

        def work(cur: Cursor) -> tuple[object, ...] | None:
            self._lock_run(cur, run_id)
            held, worker = self._held_trials(cur, run_id, lease_token, "to complete trials")
            lost = sorted(set(results) - set(held))
            if lost:
                raise CheckFailed(f"run {run_id}: trials {lost} are not held under this lease; refusing to complete them")
            if not results:
                raise ValidationError("results", "must hold at least one trial result", run_id)
            for idx in sorted(results):
                cur.execute(
                    f"UPDATE trials SET state = {_TRIAL_DONE}, result = ?, evidence = ?, reason = NULL, lease_token = NULL,"  # noqa: S608
                    " lease_expires_at = NULL, updated_at = ? WHERE run_id = ? AND idx = ? AND lease_token = ?"
                    f" AND state = {_TRIAL_RUNNING} RETURNING idx",
                    (results[idx], packed.get(idx), iso(at), run_id, idx, lease_token))
                if cur.fetchone() is None:
                    raise CheckFailed(f"run {run_id}: trial {idx} changed under its lease; refusing to complete it")
            self._event(cur, run_id, "trials_completed", None, None, f"worker={worker} trials={sorted(results)}", at)
            return self._after_trials_end(cur, run_id, worker, lease_seconds, at)

        row = self._transaction(work)
        # A hand-over changes no state run.json shows (the run stays RUNNING): no rewrite.
        return None if row is None else self._record(row)

    def fail_trials(self, run_id: str, lease_token: str, reason: str, *, lease_seconds: float) -> RunRecord | None:
        at = time.time()
        reason = one_line(reason, 2000)

        def work(cur: Cursor) -> tuple[object, ...] | None:
            self._lock_run(cur, run_id)
            held, worker = self._held_trials(cur, run_id, lease_token, "to fail trials")
            cur.execute(
                f"UPDATE trials SET state = CASE WHEN attempts >= max_attempts THEN {_TRIAL_DONE} ELSE {_TRIAL_QUEUED} END,"  # noqa: S608
                " reason = ?, result = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = ?"
                f" WHERE run_id = ? AND lease_token = ? AND state = {_TRIAL_RUNNING}",
                (reason, iso(at), run_id, lease_token))
            self._event(cur, run_id, "trials_failed", None, None, f"worker={worker} trials={held}: {reason[:300]}", at)
            return self._after_trials_end(cur, run_id, worker, lease_seconds, at)

        row = self._transaction(work)
        if row is None:
            return None
        self._write_status(run_id, row)
        return self._record(row)

    def release_trials(self, run_id: str, lease_token: str, reason: str) -> None:
        at = time.time()

        def work(cur: Cursor) -> None:
            self._lock_run(cur, run_id)
            held, worker = self._held_trials(cur, run_id, lease_token, "to release trials")
            cur.execute(
                f"UPDATE trials SET state = {_TRIAL_QUEUED}, attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,"  # noqa: S608
                " lease_token = NULL, lease_expires_at = NULL, worker = NULL, updated_at = ?"
                f" WHERE run_id = ? AND lease_token = ? AND state = {_TRIAL_RUNNING}",
                (iso(at), run_id, lease_token))
            self._event(cur, run_id, "trials_released", None, None, f"worker={worker} trials={held}: {reason[:300]}", at)

        self._transaction(work)

    def trials(self, run_id: str) -> list[TrialRow]:
        def work(cur: Cursor) -> list[Any]:
            cur.execute("SELECT run_id, idx, task, trial_name, state, attempts, max_attempts, worker, reason, result"
                        " FROM trials WHERE run_id = ? ORDER BY idx", (run_id,))
            return cur.fetchall()

        return [TrialRow(run_id=str(r), idx=int(i), task=str(t), trial_name=str(n), state=TrialState(str(st)),
                         attempts=int(a), max_attempts=int(m), worker=None if w is None else str(w),
                         reason=None if why is None else str(why), result=None if res is None else str(res))
                for r, i, t, n, st, a, m, w, why, res in self._read(work)]

    def trial_evidence(self, run_id: str, idx: int) -> bytes | None:
        def work(cur: Cursor) -> Any:
            cur.execute("SELECT evidence FROM trials WHERE run_id = ? AND idx = ?", (run_id, int(idx)))
            return cur.fetchone()

        row = self._read(work)
        if row is None:
            raise ValidationError("idx", f"run {run_id} has no trial {idx}", idx)
        return None if row[0] is None else bytes(row[0])

    def held_batches(self, run_id: str) -> set[str]:
        def work(cur: Cursor) -> list[Any]:
            cur.execute(f"SELECT DISTINCT lease_token FROM trials WHERE run_id = ? AND state = {_TRIAL_RUNNING}", (run_id,))  # noqa: S608
            return cur.fetchall()

        return {batch_label(str(r[0])) for r in self._read(work) if r[0] is not None}

    def _requeue_expired_trials(self, at: float) -> list[str]:
        def expired(cur: Cursor) -> list[str]:
            cur.execute(f"SELECT DISTINCT run_id FROM trials WHERE state = {_TRIAL_RUNNING} AND lease_expires_at < ?", (at,))  # noqa: S608
            return sorted(str(r[0]) for r in cur.fetchall())

        changed: list[str] = []
        for run_id in self._read(expired):
            def work(cur: Cursor, run_id: str = run_id) -> bool:
                self._lock_run(cur, run_id)
                cur.execute(
                    f"UPDATE trials SET state = CASE WHEN attempts >= max_attempts THEN {_TRIAL_DONE} ELSE {_TRIAL_QUEUED} END,"  # noqa: S608
                    " reason = CASE WHEN attempts >= max_attempts THEN 'lease expired on the final attempt' ELSE 'lease expired' END,"
                    " lease_token = NULL, lease_expires_at = NULL, updated_at = ?"
                    f" WHERE run_id = ? AND state = {_TRIAL_RUNNING} AND lease_expires_at < ? RETURNING idx",
                    (iso(at), run_id, at))
                ended = cur.fetchall()
                if not ended:
                    return False
                self._event(cur, run_id, "trials_lease_expired", None, None, f"{len(ended)} trials", at)
                self._after_trials_end(cur, run_id, None, 0.0, at)
                return True

            if self._transaction(work):
                changed.append(run_id)
        return changed



def _history_entry(row: Sequence[object]) -> HistoryEntry:
    entry = HistoryEntry.model_validate_json(str(row[0]))
    return entry.model_copy(update={"summary_digest": None if row[1] is None else str(row[1])})
