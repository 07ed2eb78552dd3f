"""A trial's dir packed into the queue by the host that ran it, unpacked by the host that grades.

The unpack side is what a compromised worker host could attack: every pack here that is not a
plain tree of regular files and directories is refused, and a refused pack leaves nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.core.contracts import DispatchPayload, TrialRecord
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.infra.queue.sql import MAX_TRIAL_EVIDENCE_BYTES, PlannedTrial, SqliteQueue
from pipeline.infra.worker import loop as worker
from pipeline.infra.worker import trial_evidence
from pipeline.infra.worker.export import export_bytes, import_run, packs_not_here
from pipeline.infra.worker.grading import RecordedTrial
from pipeline.infra.worker.trial_evidence import pack_trial_dir, unpack_trial_dir
from tests.doubles.queue_load import noop_grading
from tests.fixtures.infra import QueueSpec


def _tree(root: Path) -> dict[str, bytes | None]:
    return {p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def _trial_dir(root: Path) -> Path:
    trial = root / "write-answer__abc"
    (trial / "agent" / "episode-0").mkdir(parents=True)
    (trial / "verifier").mkdir()
    (trial / "result.json").write_text('{"finished_at": "2026-12-03T00:00:00Z"}')
    (trial / "agent" / "episode-0" / "response.txt").write_bytes(os.urandom(3000))
    (trial / "verifier" / "reward.txt").write_text("1\n")
    (trial / "empty").mkdir()
    return trial


def test_a_packed_trial_dir_unpacks_to_the_same_tree_without_links_or_fifos(tmp_path):
    trial = _trial_dir(tmp_path / "host-a")
    expected = _tree(trial)
    (trial / "host-file").symlink_to("/etc/hostname")
    (trial / "agent" / "linked-dir").symlink_to(trial / "verifier")
    os.mkfifo(trial / "pipe")
    data = pack_trial_dir(trial)
    target = tmp_path / "host-b" / "harbor" / trial.name
    unpack_trial_dir(data, target)
    assert _tree(target) == expected
    assert not any(p.is_symlink() for p in target.rglob("*"))


def _pack(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, content in members:
            if content is not None:
                info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if content is not None else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in fields.items():
        setattr(info, key, value)
    return info


HOSTILE: dict[str, Callable[[], bytes]] = {
    "symlink member": lambda: _pack((_member("result.json", tarfile.SYMTYPE, linkname="/etc/shadow"), None)),
    "hard link member": lambda: _pack((_member("a.txt"), b"x"), (_member("b.txt", tarfile.LNKTYPE, linkname="a.txt"), None)),
    "character device": lambda: _pack((_member("tty", tarfile.CHRTYPE, devmajor=5, devminor=0), None)),
    "fifo member": lambda: _pack((_member("pipe", tarfile.FIFOTYPE), None)),
    "absolute name": lambda: _pack((_member("/tmp/evil"), b"x")),
    "parent escape": lambda: _pack((_member("../../evil"), b"x")),
    "dot part": lambda: _pack((_member("./result.json"), b"x")),
    "empty part": lambda: _pack((_member("agent//x"), b"x")),
    "backslash": lambda: _pack((_member("agent\\x"), b"x")),
    "duplicate member": lambda: _pack((_member("result.json"), b"1"), (_member("result.json"), b"2")),
    "file then dir of the same name": lambda: _pack((_member("agent"), b"1"), (_member("agent/x"), b"2")),
    "member then a file of its dir's name": lambda: _pack((_member("agent/x"), b"1"), (_member("agent"), b"2")),
    "directory member over a file": lambda: _pack((_member("agent"), b"1"), (_member("agent", tarfile.DIRTYPE), None)),
    "CR in a name": lambda: _pack((_member("a\rb"), b"x")),
    "line separator in a name": lambda: _pack((_member("a\u2028b"), b"x")),
    "bidi override in a name": lambda: _pack((_member("txt.\u202eexe"), b"x")),
    "zero-width space in a name": lambda: _pack((_member("a\u200bb"), b"x")),
    "part of 256 bytes": lambda: _pack((_member("x" * 256), b"x")),
    "undecodable bytes": lambda: _pack((_member("bad\udcff"), b"x")),
    "NFD name": lambda: _pack((_member("cafe\u0301"), b"x")),
    "not gzip": lambda: b"PK\x03\x04 not a tar at all",
    "truncated": lambda: _pack((_member("result.json"), b"x" * 5000))[:60],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_pack_is_refused_and_leaves_nothing(tmp_path, case):
    harbor = tmp_path / "run" / "harbor"
    harbor.mkdir(parents=True)
    with pytest.raises(CheckFailed, match="trial evidence"):
        unpack_trial_dir(HOSTILE[case](), harbor / "trial__x")
    assert list(harbor.iterdir()) == []  # no staging dir, no partial tree
    assert not (tmp_path / "evil").exists() and not Path("/tmp/evil").exists()


def test_unpack_never_merges_into_an_existing_dir(tmp_path):
    trial = _trial_dir(tmp_path / "a")
    target = tmp_path / "b" / trial.name
    target.mkdir(parents=True)
    (target / "kept.txt").write_text("mine")
    with pytest.raises(CheckFailed, match="already exists"):
        unpack_trial_dir(pack_trial_dir(trial), target)
    assert _tree(target) == {"kept.txt": b"mine"}


def test_sizes_are_bounded_on_both_sides(tmp_path, monkeypatch):
    trial = _trial_dir(tmp_path / "a")
    (trial / "big.bin").write_bytes(os.urandom(200_000))  # incompressible
    monkeypatch.setattr(trial_evidence, "MAX_TRIAL_EVIDENCE_BYTES", 100_000)
    with pytest.raises(CheckFailed, match="exceeds 100000 bytes"):
        pack_trial_dir(trial)
    # A small pack that unpacks to more than the bound (a gzip bomb) is refused too.
    bomb = _pack((_member("zeros.bin"), b"\0" * 2_000_000))
    assert len(bomb) < 10_000
    monkeypatch.setattr(trial_evidence, "MAX_UNPACKED_BYTES", 1_000_000)
    target = tmp_path / "b" / "trial__x"
    with pytest.raises(CheckFailed, match="more than 1000000 bytes unpacked"):
        unpack_trial_dir(bomb, target)
    assert not target.parent.exists() or list(target.parent.iterdir()) == []


# --- the queue holds each trial's pack with its graded record (both backends) ----------


def test_the_queue_keeps_each_trials_pack_with_its_record(queue_spec: QueueSpec, make_payload):
    with queue_spec.open() as q:
        run_id, _ = q.enqueue(DispatchPayload.model_validate(make_payload(correlation_id="evidence-rows-0001")),
                              max_attempts=2)
        claim = q.claim("host-a", 60)
        assert claim and claim.lease_token
        plan = [PlannedTrial(task=f"t{i}", trial_name=f"t{i}__x") for i in range(3)]
        batch = q.plan_trials(run_id, claim.lease_token, plan, max_attempts=2, claim=2, worker="host-a", lease_seconds=60)
        assert batch is not None and [t.idx for t in batch.trials] == [0, 1]
        packed = os.urandom(5000) + b"\0\xff"  # any bytes, kept exactly
        with pytest.raises(ValidationError, match=r"evidence\[2\]"):  # not a trial of this call
            q.complete_trials(run_id, batch.lease_token, {0: "{}"}, lease_seconds=60, evidence={2: b"x"})
        with pytest.raises(ValidationError, match=r"evidence\[0\]"):
            q.complete_trials(run_id, batch.lease_token, {0: "{}"}, lease_seconds=60,
                              evidence={0: b"x" * (MAX_TRIAL_EVIDENCE_BYTES + 1)})
        with pytest.raises(CheckFailed, match="lease"):  # refused: nothing recorded
            q.complete_trials(run_id, "not-the-token", {0: "{}"}, lease_seconds=60, evidence={0: packed})
        assert q.trial_evidence(run_id, 0) is None
        q.complete_trials(run_id, batch.lease_token, {0: "{}", 1: "{}"}, lease_seconds=60, evidence={0: packed})
        assert q.trial_evidence(run_id, 0) == packed
        assert q.trial_evidence(run_id, 1) is None  # recorded without a pack
        assert q.trial_evidence(run_id, 2) is None  # not run yet
        with pytest.raises(ValidationError, match="has no trial 7"):
            q.trial_evidence(run_id, 7)
        # A recorded trial is no longer held: its pack cannot be replaced.
        with pytest.raises(CheckFailed):
            q.complete_trials(run_id, batch.lease_token, {0: "{}"}, lease_seconds=60, evidence={0: b"other"})
        assert q.trial_evidence(run_id, 0) == packed


# --- the grader puts every graded attempt's dir in its run dir ---------------------------


def _recorded(trial_name: str, host: str, batch_dir: Path) -> RecordedTrial:
    return RecordedTrial(trial=TrialRecord(task=trial_name.split("__")[0], trial_name=trial_name, outcome="resolved",
                                           reward=1.0, agent_name="oracle"), host=host, batch_dir=str(batch_dir))


def test_the_grader_unpacks_trials_that_ran_elsewhere_and_moves_its_own(tmp_path, make_payload, caplog):
    with SqliteQueue(tmp_path / "grader" / "queue.sqlite3") as q:
        run_id, _ = q.enqueue(DispatchPayload.model_validate(make_payload(correlation_id="evidence-grader-01")),
                              max_attempts=2)
        claim = q.claim("grader", 60)
        assert claim and claim.lease_token
        plan = [PlannedTrial(task=t, trial_name=f"{t}__x") for t in ("remote", "local", "refused", "unpacked")]
        batch = q.plan_trials(run_id, claim.lease_token, plan, max_attempts=2, claim=4, worker="grader", lease_seconds=60)
        assert batch is not None
        run_dir = q.run_dir(run_id)
        elsewhere = _trial_dir(tmp_path / "other-host" / "batch")
        # "local" ran in a batch of this run dir whose worker died before collecting it.
        own_batch = run_dir / "batches" / "0001-abc"
        _trial_dir(own_batch / "harbor").rename(own_batch / "harbor" / "local__x")
        local_tree = _tree(own_batch / "harbor" / "local__x")
        records = {
            0: _recorded("remote__x", "other-host", tmp_path / "other-host" / "batch"),
            1: _recorded("local__x", socket.gethostname(), own_batch),
            # Same host name, but another state dir: it did not run in THIS run dir.
            2: _recorded("refused__x", socket.gethostname(), tmp_path / "second-state-dir" / "batch"),
            3: _recorded("unpacked__x", "other-host", tmp_path / "other-host" / "batch"),
        }
        q.complete_trials(run_id, batch.lease_token, {i: r.to_json() for i, r in records.items()}, lease_seconds=60,
                          evidence={0: pack_trial_dir(elsewhere), 2: HOSTILE["symlink member"](),
                                    3: pack_trial_dir(elsewhere)})
        # An earlier attempt of "remote" ran here: kept aside, never mixed with the graded attempt's dir.
        earlier = run_dir / "harbor" / "remote__x"
        earlier.mkdir(parents=True)
        (earlier / "attempt-1.txt").write_text("the failed attempt")
        for idx, recorded in records.items():
            worker._adopt_trial_dir(q, run_id, run_dir, idx, recorded)
        harbor = run_dir / "harbor"
        assert _tree(harbor / "remote__x") == _tree(elsewhere) == _tree(harbor / "unpacked__x")
        assert _tree(harbor / "local__x") == local_tree and not (own_batch / "harbor" / "local__x").exists()
        assert not (harbor / "refused__x").exists()
        assert "refused__x" in caplog.text and "not a regular file or directory" in caplog.text
        kept = list((run_dir / "attempts" / "remote__x").iterdir())
        assert len(kept) == 1 and (kept[0] / "attempt-1.txt").read_text() == "the failed attempt"
        origin = json.loads((run_dir / "harbor-origin" / "remote__x.json").read_text())
        assert origin["host"] == "other-host" and origin["sha256"] == hashlib.sha256(q.trial_evidence(run_id, 0) or b"").hexdigest()
        # A second grading (a retried finalize) keeps what it unpacked: nothing moves aside again.
        worker._adopt_trial_dir(q, run_id, run_dir, 0, records[0])
        assert len(list((run_dir / "attempts" / "remote__x").iterdir())) == 1
        assert _tree(harbor / "remote__x") == _tree(elsewhere)


def test_an_export_from_a_host_that_did_not_grade_carries_the_packed_trial_dirs(queue_spec: QueueSpec, make_payload,
                                                                                  tmp_path, caplog):
    with queue_spec.open() as q:
        run_id, _ = q.enqueue(DispatchPayload.model_validate(make_payload(correlation_id="evidence-export-01")),
                              max_attempts=1)
        claim = q.claim("host-a", 60)
        assert claim and claim.lease_token
        plan = [PlannedTrial(task=t, trial_name=f"{t}__x") for t in ("packed", "hostile", "plain")]
        batch = q.plan_trials(run_id, claim.lease_token, plan, max_attempts=1, claim=3, worker="host-a", lease_seconds=60)
        assert batch is not None
        trial = _trial_dir(tmp_path / "host-a")
        records = {i: _recorded(p.trial_name, "host-a", tmp_path / "host-a").to_json() for i, p in enumerate(plan)}
        grader = q.complete_trials(run_id, batch.lease_token, records, lease_seconds=60,
                                   evidence={0: pack_trial_dir(trial), 1: HOSTILE["parent escape"]()})
        assert grader is not None and grader.lease_token
        q.complete(run_id, grader.lease_token, noop_grading(grader, 3, 3), [])
        record = q.get_run(run_id)
        elsewhere = tmp_path / "host-c" / "runs" / run_id  # this host ran and graded nothing of the run
        packs = packs_not_here(q, run_id, elsewhere)
        dest = import_run(io.BytesIO(export_bytes(record, elsewhere, packs)), tmp_path / "sealed", run_id)
        exported = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
        if not q.spans_hosts:  # one host: every trial dir is this host's, none travels in the queue
            assert packs == {} and exported == ["grading.json", "run.json"]
            return
        assert set(packs) == {"packed__x", "hostile__x"}
        prefix = "artifacts/evidence/harbor/packed__x/"
        assert exported == sorted(["grading.json", "run.json", *(prefix + n for n, c in _tree(trial).items() if c)])
        files = {n: c for n, c in _tree(trial).items() if c is not None}  # an export carries files only
        assert {n: c for n, c in _tree(dest / prefix).items() if c is not None} == files
        assert "hostile__x" in caplog.text and "left out of the export" in caplog.text
        # A trial dir this host holds is exported as it is, never replaced by the queue's pack.
        local = elsewhere / "artifacts" / "evidence" / "harbor" / "packed__x"
        local.mkdir(parents=True)
        (local / "result.json").write_text('{"mine": true}')
        assert "packed__x" not in packs_not_here(q, run_id, elsewhere)
        again = import_run(io.BytesIO(export_bytes(record, elsewhere, packs)), tmp_path / "sealed-2", run_id)
        assert _tree(again / "artifacts" / "evidence" / "harbor" / "packed__x") == {"result.json": b'{"mine": true}'}
