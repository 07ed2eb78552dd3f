"""Hostile names and exports (issue 22, point 6): one name rule (pipeline.core.fsutil.name_problem) for every
producer and consumer of a name that travels: the export writer and reader, trial packs, the worker's
evidence copy, SHA256SUMS / evidence-SHA256SUMS written and parsed, verify's tree walk.

What the rule accepts survives export -> import -> evidence-SHA256SUMS -> verify byte for byte (a
hypothesis property); every class it refuses makes ``benchseal evidence --from-export`` (run as a
process) exit 1 with one line and no traceback, and leaves the destination absent."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from pipeline.core.contracts import DispatchPayload, trial_name
from pipeline.core.errors import CheckFailed
from pipeline.core.fsutil import (
    MAX_NAME_BYTES,
    NameTree,
    NotRegularFile,
    is_plain_relative_name,
    name_problem,
    open_regular,
)
from pipeline.core.layout import NESTED_SUMS, nested_files, parse_checksums, render_checksums
from pipeline.evidence.artifacts import write_checksums
from pipeline.infra.intake.policy import load_policy
from pipeline.infra.queue.sql import RunRecord, SqliteQueue
from pipeline.infra.worker.export import EVIDENCE, export_run, import_run, trial_pack_files
from pipeline.infra.worker.loop import _copy_evidence
from pipeline.infra.worker.trial_evidence import evidence_copy_ignore, pack_trial_dir, read_trial_pack
from pipeline.local import sigstore as sigstore_local
from pipeline.publish.bundle import load_bundle
from pipeline.verify.release import verify_checksums, verify_release
from tests.doubles.queue_load import noop_grading
from tests.fixtures.trials import graded_export, harbor_result, tampered
from tests.publish.test_seal_export import RUN_ID, _grading, _run_json

REPO = Path(__file__).resolve().parents[2]
HEX = "ab" * 32
TOP = [("run.json", _run_json()), ("grading.json", _grading())]


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> RunRecord:
    """One graded SUCCEEDED run in a real queue (the export writer's input)."""
    payload = {
        "schema": "benchseal.dispatch/v1", "correlation_id": "export-names-0001",
        "source": {"repository": "acme/widget", "commit": "c" * 40, "tag": "v1.0.0"},
        "runner": "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64,
        "api": "127.0.0.1:5055/benchseal/api@sha256:" + "2" * 64, "suite": "smoke", "agent": "oracle",
    }
    with SqliteQueue(tmp_path_factory.mktemp("queue") / "queue.sqlite3") as q:
        run_id, _ = q.enqueue(DispatchPayload.model_validate(payload), max_attempts=1)
        claim = q.claim("host-a", 60)
        assert claim and claim.lease_token
        q.complete(run_id, claim.lease_token, noop_grading(claim, 0, 0), [])
        got = q.get_run(run_id)
        assert got is not None and got.state == "INFRA_ERROR"
        return got


# --- the rule: every name it accepts round-trips; every parse result is one it accepts ---------------

_part = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
_long_part = st.text(st.sampled_from("aé€😀"), min_size=60, max_size=130)  # 1-4 byte characters near 255 bytes
_names = st.lists(st.one_of(_part, _long_part), min_size=1, max_size=3).map("/".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.filter_too_much])
@given(name=_names)
@example(name="café/ü name.txt").via("NFC letters and an inner space")
@example(name="é" * 127 + "x").via("255 bytes in one part")
@example(name="*lead-star/-dash/#hash/a  two spaces").via("what sha256sum lines could misread")
def test_every_name_the_rule_accepts_survives_export_sums_and_verify(record: RunRecord, tmp_path_factory, name: str):
    member = f"{EVIDENCE}/n/{name}"
    assume(is_plain_relative_name(member))
    run_dir = tmp_path_factory.mktemp("run")
    content = hashlib.sha256(name.encode()).digest()
    (run_dir / member).parent.mkdir(parents=True)
    (run_dir / member).write_bytes(content)
    buffer = io.BytesIO()
    export_run(record, run_dir, buffer)
    sealed = import_run(io.BytesIO(buffer.getvalue()), tmp_path_factory.mktemp("sealed") / "run", record.run_id)
    assert (sealed / member).read_bytes() == content
    artifacts = sealed / "artifacts"
    write_checksums(artifacts)
    nested = parse_checksums((artifacts / NESTED_SUMS).read_bytes(), NESTED_SUMS, nested=True)
    assert nested == {f"evidence/n/{name}": hashlib.sha256(content).hexdigest()}
    assert NESTED_SUMS in verify_checksums(artifacts)  # verify's own walk and parse agree


@settings(max_examples=300, deadline=None)
@given(name=st.text(min_size=0, max_size=40))
@example(name="a\u2028b").via("a line separator splitlines() would break at")
@example(name="a\rb").via("CR")
@example(name="a\x00b").via("NUL")
@example(name="a\udcffb").via("an undecodable byte, as os and tarfile hand it over")
def test_a_checksum_line_parses_to_the_name_the_rule_accepts_or_is_refused(name: str):
    line = f"{HEX}  {name}\n"
    try:
        parsed = parse_checksums(line.encode("utf-8", "surrogatepass"), NESTED_SUMS, nested=True)
    except CheckFailed as exc:
        assert "\n" not in str(exc) and not is_plain_relative_name(name)
        return
    assert parsed == {name: HEX} and is_plain_relative_name(name)
    assert render_checksums([(HEX, name)]) == line  # and the writer writes exactly that line back


def test_the_rule_refuses_each_class_and_says_which():
    refused = {
        "": "is empty", "/etc/x": "absolute", "a/../b": "'..' part", "a//b": "an empty", "./a": "'.' or '..' part",
        "a\\b": "backslash", "a\x00b": "U+0000", "a\rb": "U+000D", "a\nb": "U+000A", "a\x85b": "U+0085",
        "a\u2028b": "U+2028", "a\u2029b": "U+2029", "a\u202eb": "U+202E", "a\u2066b": "U+2066",
        "a\u200bb": "U+200B", "a\ufeffb": "U+FEFF", "a\u00a0b": "U+00A0", "a\ue000b": "U+E000",
        "a\udcffb": "U+DCFF", "a\U000e0001b": "U+E0001", "a\x1bb": "U+001B",
        unicodedata.normalize("NFD", "café"): "NFC", "a/b ": "leading or trailing space", " a": "leading or trailing",
        "x" * 256: "255 bytes", "é" * 128: "255 bytes", "/".join(["x" * 200] * 6): f"{MAX_NAME_BYTES} bytes",
    }
    for name, rule in refused.items():
        problem = name_problem(name)
        assert problem is not None and rule in problem, (name, problem)
    for name in ("a", "x" * 255, "é" * 127, "café", "a b/c.d", ".hidden/x", "日本語/ファイル", "a+b-c_d~e"):
        assert name_problem(name) is None, name


def test_a_tree_holds_each_name_once_and_never_a_file_with_a_member_under_it():
    tree = NameTree()
    assert tree.problem("a/b/c") is None and tree.problem("a/b", is_dir=True) is None  # a parent named later
    assert tree.problem("a/b/c") == "appears twice"
    assert tree.problem("a/b") == "appears twice"
    assert tree.problem("a") == "is a file and a directory"  # child, then file
    assert tree.problem("f") is None
    assert tree.problem("f/x") == "is under 'f', which is a file"  # file, then child
    assert tree.problem("f/x/y", is_dir=True) == "is under 'f', which is a file"
    # Deep names that share no parent are bounded by the directories they make, not by memory.
    small = NameTree(max_dirs=1000)
    refused = [small.problem("/".join([str(i), *["d"] * 300])) for i in range(5)]
    assert refused[:3] == [None] * 3 and refused[3] == "makes more than 1000 directories"


# --- hostile exports, as real tar files, through the CLI the seal job runs ------------------------------

Member = tuple[str, bytes | None]


def _export(members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _file(name: str, data: bytes = b"x", *, pax: bool = False) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    if pax:  # the name in a pax header, as written (a ustar field would end at a NUL)
        info.pax_headers = {"path": name}
    return info, data


def _link(name: str, kind: bytes, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _with(*extra: tuple[tarfile.TarInfo, bytes | None], fmt: int = tarfile.PAX_FORMAT) -> Callable[[], bytes]:
    return lambda: _export([*(_file(n, d) for n, d in TOP), *extra], fmt)


E = EVIDENCE + "/harbor/t__1"
NFC, NFD = "caf\u00e9", unicodedata.normalize("NFD", "caf\u00e9")
HOSTILE: dict[str, tuple[Callable[[], bytes], str]] = {
    "file then child": (_with(_file(f"{E}/result.json"), _file(f"{E}/result.json/x")), "which is a file"),
    "child then file": (_with(_file(f"{E}/agent/x"), _file(f"{E}/agent")), "is a file and a directory"),
    "trial dir as a file then its members": (_with(_file(E), _file(f"{E}/result.json")), "which is a file"),
    "component of 256 bytes": (_with(_file(f"{E}/" + "x" * 256)), "255 bytes"),
    "component of 128 two-byte characters": (_with(_file(f"{E}/" + "é" * 128)), "255 bytes"),
    "whole name over the bound": (_with(_file("/".join([E, *["d" * 250] * 4, "x"]))), f"{MAX_NAME_BYTES} bytes"),
    "invalid UTF-8 bytes": (_with(_file(f"{E}/bad\udcff.txt"), fmt=tarfile.GNU_FORMAT), "U+DCFF"),
    "CR": (_with(_file(f"{E}/a\rb")), "U+000D"),
    "LF": (_with(_file(f"{E}/a\nb")), "U+000A"),
    "NUL in a pax path": (_with(_file(f"{E}/a\x00b", pax=True)), "U+0000"),
    "NEL": (_with(_file(f"{E}/a\x85b")), "U+0085"),
    "ESC": (_with(_file(f"{E}/a\x1b[31mb")), "U+001B"),
    "U+2028 line separator": (_with(_file(f"{E}/a\u2028b")), "U+2028"),
    "U+2029 paragraph separator": (_with(_file(f"{E}/a\u2029b")), "U+2029"),
    "U+202E right-to-left override": (_with(_file(f"{E}/txt.\u202eexe")), "U+202E"),
    "U+2067 right-to-left isolate": (_with(_file(f"{E}/a\u2067b")), "U+2067"),
    "U+200B zero-width space": (_with(_file(f"{E}/a\u200bb")), "U+200B"),
    "U+FEFF byte order mark": (_with(_file(f"{E}/\ufeffa")), "U+FEFF"),
    "U+00A0 no-break space": (_with(_file(f"{E}/a\u00a0b")), "U+00A0"),
    "trailing space": (_with(_file(f"{E}/a ")), "leading or trailing space"),
    "NFD name": (_with(_file(f"{E}/{NFD}")), "NFC form (it is 'artifacts/evidence/harbor/t__1/cafe\\u0301')"),
    "NFC and NFD of one name": (_with(_file(f"{E}/{NFC}"), _file(f"{E}/{NFD}")), "NFC"),
    "duplicate evidence member": (_with(_file(f"{E}/a"), _file(f"{E}/a")), "appears twice"),
    "duplicate run.json": (_with(_file("run.json", _run_json())), "appears twice"),
    "hard link": (_with(_link(f"{E}/passwd", tarfile.LNKTYPE, "run.json")), "not a regular file"),
    "symlink": (_with(_link(f"{E}/passwd", tarfile.SYMTYPE, "/etc/passwd")), "not a regular file"),
    "absolute": (_with(_file("/tmp/p6-evil")), "is not run.json"),
    "parent escape": (_with(_file(f"{EVIDENCE}/../../../p6-evil")), "'..' part"),
    "backslash": (_with(_file(f"{E}\\..\\x")), "backslash"),
    "another run's export": (lambda: _export([_file("run.json", _run_json("run-ffffffffffffffffffff")),
                                              _file("grading.json", _grading("run-ffffffffffffffffffff")),
                                              _file(f"{E}/result.json")]), "not the expected"),
    "truncated": (lambda: _with(_file(f"{E}/big", b"x" * 50_000))()[:20_000], "not a valid tar stream"),
}


def _seal(export: Path, dest: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(export.parent), "LC_ALL": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "pipeline", "evidence", str(dest), "--from-export", str(export),
                           "--run-id", RUN_ID, "--signer", "ambient", *extra],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120, check=False)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_export_is_refused_in_one_line_and_leaves_no_run_dir(tmp_path: Path, case: str):
    build, rule = HOSTILE[case]
    export = tmp_path / "export.tar"
    export.write_bytes(build())
    dest = tmp_path / "sealed" / "run"
    done = _seal(export, dest)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("benchseal: error: export") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and rule in done.stderr, done.stderr
    assert done.stderr[:-1].isprintable() and done.stdout == ""  # no control or format character reaches a terminal
    assert not dest.exists() and os.listdir(dest.parent) == []  # no run dir, no staging dir left
    assert not Path("/tmp/p6-evil").exists()


def test_an_export_that_is_accepted_but_cannot_be_sealed_leaves_no_run_dir(tmp_path: Path):
    """Sealing itself is staged: the import succeeds, then sealing fails (the trial evidence does not bear
    the grading out, or no ambient credential here: whichever check comes first)."""
    export = tmp_path / "export.tar"
    export.write_bytes(_with(_file(f"{E}/result.json", b"{}"))())
    dest = tmp_path / "run"
    dest.mkdir()  # an empty destination stays empty
    done = _seal(export, dest)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert not done.stderr.startswith("benchseal: error: export")  # the import was accepted
    assert list(dest.iterdir()) == [] and sorted(os.listdir(tmp_path)) == ["export.tar", "run"]


def test_a_destination_that_is_not_new_or_empty_is_a_usage_error(tmp_path: Path):
    export = tmp_path / "export.tar"
    export.write_bytes(_with(_file(f"{E}/result.json", b"{}"))())
    used = tmp_path / "used"
    used.mkdir()
    (used / "mine").write_text("kept")
    done = _seal(export, used)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "new or empty" in done.stderr, done.stderr
    assert [p.name for p in used.iterdir()] == ["mine"]
    directory = tmp_path / "a-dir.tar"
    directory.mkdir()
    done = _seal(directory, tmp_path / "other")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr


# --- the producers: the export writer refuses before its first byte; packs and the copy leave names out ----


@pytest.mark.parametrize("name", ["a\u2028b", "a\rb", "bad\udcff", NFD, "a\u202eb", "a ", "/".join(["d" * 250] * 5)])
def test_the_export_writer_refuses_a_hostile_evidence_name_before_writing(record: RunRecord, tmp_path: Path,
                                                                          name: str):
    run_dir = tmp_path / "run"
    (run_dir / E).mkdir(parents=True)
    (run_dir / E / "result.json").write_bytes(b"{}")
    (run_dir / E / name).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / E / name).write_bytes(b"x")
    out = io.BytesIO()
    with pytest.raises(CheckFailed, match="plain relative names only"):
        export_run(record, run_dir, out)
    assert out.getvalue() == b""


def _pack(*members: tuple[str, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_trial_packs_from_other_hosts_with_hostile_names_are_left_out_of_the_export(caplog):
    caplog.set_level(logging.ERROR, "benchseal.export")
    packs = {
        "ok__1": _pack(("result.json", b"{}")),
        "child-then-file__1": _pack(("agent/x", b"1"), ("agent", b"2")),
        "separator__1": _pack(("a\u2028b", b"1")),
        "too-long-as-evidence__1": _pack(("/".join(["d" * 250] * 4), None), ("/".join(["d" * 250] * 4) + "/x", b"1")),
        "a-file-here__1": _pack(("result.json", b"{}")),
    }
    present = {f"{EVIDENCE}/harbor/a-file-here__1"}
    files = trial_pack_files(packs, present, 1 << 20)
    assert [name for name, _ in files] == [f"{EVIDENCE}/harbor/ok__1/result.json"]
    for trial in ("child-then-file__1", "separator__1", "too-long-as-evidence__1", "a-file-here__1"):
        assert f"trial {trial}: its packed dir is left out" in caplog.text
    with pytest.raises(CheckFailed, match="is a file and a directory"):
        list(read_trial_pack(packs["child-then-file__1"]))


def test_pack_and_copy_leave_hostile_names_behind_and_what_stays_verifies(tmp_path: Path, caplog):
    caplog.set_level(logging.WARNING)
    run_dir = tmp_path / "run"
    trial = run_dir / "harbor" / "t__1"
    (trial / "agent").mkdir(parents=True)
    (trial / "result.json").write_bytes(b"{}")
    (trial / "agent" / "ok.txt").write_bytes(b"ok")
    hostile = ["a\u2028b", "a\rb", "a\u202eb", "z\u200b", os.fsdecode(b"bad\xff"), NFD, "trail "]
    for name in hostile:
        (trial / "agent" / name).write_bytes(b"hostile")
    (trial / "dir\u2029").mkdir()
    (trial / "dir\u2029" / "inside.txt").write_bytes(b"hostile")
    expected = {"agent", "agent/ok.txt", "result.json"}
    # The host that ran the trial packs it for the queue without them.
    assert {name for name, _ in read_trial_pack(pack_trial_dir(trial))} == expected
    # The worker's evidence copy leaves them behind too; the rest is sealed and verifies.
    _copy_evidence(run_dir)
    artifacts = run_dir / "artifacts"
    copied = artifacts / "evidence" / "harbor" / "t__1"
    assert {p.relative_to(copied).as_posix() for p in copied.rglob("*")} == expected
    assert "is left out of the evidence" in caplog.text and "U+2028" in caplog.text
    write_checksums(artifacts)
    assert NESTED_SUMS in verify_checksums(artifacts)
    ignore = evidence_copy_ignore(trial, "artifacts/evidence/harbor/t__1")
    assert ignore(str(trial / "agent"), ["ok.txt", "a\rb"]) == {"a\rb"}


# --- the consumers: SHA256SUMS writer, parser and verify's walk ---------------------------------------------


def test_sealing_refuses_a_nested_name_that_verify_would_not_read_back(tmp_path: Path):
    """Before: a name with U+2028 was written into evidence-SHA256SUMS, and the release then failed its
    own verify (the parser split the line there)."""
    artifacts = tmp_path / "artifacts"
    (artifacts / "evidence").mkdir(parents=True)
    (artifacts / "evidence" / "a\u2028b").write_bytes(b"x")
    with pytest.raises(CheckFailed, match="U\\+2028"):
        write_checksums(artifacts)
    assert not (artifacts / NESTED_SUMS).exists() and not (artifacts / "SHA256SUMS").exists()
    with pytest.raises(CheckFailed, match="U\\+2028"):  # verify's walk meets it the same way
        nested_files(artifacts)


@pytest.mark.parametrize(("text", "rule"), [
    (f"{HEX}  evidence/a\u2028b\n".encode(), "U+2028"),
    (f"{HEX}  evidence/a\rb\n".encode(), "U+000D"),
    (f"{HEX}  evidence/a\x00b\n".encode(), "U+0000"),
    (f"{HEX}  evidence/a\u202eb\n".encode(), "U+202E"),
    (f"{HEX}  evidence/{NFD}\n".encode(), "NFC"),
    (f"{HEX}  evidence/{'x' * 256}\n".encode(), "255 bytes"),
    (f"{HEX}  evidence/../x\n".encode(), "'..' part"),
    (f"{HEX}  /etc/passwd\n".encode(), "absolute"),
    (f"{HEX}  evidence/a\\b\n".encode(), "backslash"),
    (HEX.encode() + b"  evidence/bad\xff\n", "not UTF-8"),
    (f"{HEX}  evidence/a\n{HEX}  evidence/a\n".encode(), "listed twice"),
])
def test_a_nested_listing_with_a_hostile_name_fails_verify_in_one_line(tmp_path: Path, text: bytes, rule: str):
    artifacts = tmp_path / "artifacts"
    (artifacts / "evidence").mkdir(parents=True)
    (artifacts / NESTED_SUMS).write_bytes(text)
    sums = f"{hashlib.sha256(text).hexdigest()}  {NESTED_SUMS}\n"
    (artifacts / "SHA256SUMS").write_text(sums)
    with pytest.raises(CheckFailed) as caught:
        verify_checksums(artifacts)
    assert rule in str(caught.value) and "\n" not in str(caught.value)


def _policy_for(tmp_path: Path, runner: str, api: str) -> Path:
    """policies/infra.yaml with acme/widget's images replaced by these two (the test images)."""
    import yaml

    data = yaml.safe_load((REPO / "policies" / "infra.yaml").read_text())
    [source] = [entry for entry in data["sources"] if entry["repository"] == "acme/widget"]
    source["images"] = {role: [{"registry": ref.partition("/")[0], "repository": ref.partition("@")[0].partition("/")[2]}]
                        for role, ref in (("runner", runner), ("api", api))}
    path = tmp_path / "infra.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.slow
@pytest.mark.docker
def test_an_export_with_unicode_names_seals_in_place_and_its_release_verifies(tmp_path: Path, handmade_image: object,
                                                                              handmade_api_image: object,
                                                                              make_payload) -> None:  # type: ignore[no-untyped-def]
    """The accepted side end to end: a run graded and exported as the infra host does, its trial dir
    holding names from several scripts; the seal CLI renames the staged run dir into place, prints its
    final path, and the release's own evidence-SHA256SUMS verifies with those names."""
    runner, api = handmade_image.ref, handmade_api_image.ref  # type: ignore[attr-defined]
    policy_path = _policy_for(tmp_path, runner, api)
    payload = make_payload(correlation_id="export-names-seal-01", runner=runner, api=api)
    run_id, export = graded_export(tmp_path / "infra", payload, load_policy(policy_path),
                                   {"hello": harbor_result("hello", 1.0), "fail": harbor_result("fail", 0.0)})
    names = ["日本語 ファイル.txt", "café/naïve.log", "Ελληνικά/שלום.txt", "emoji 😀.json", "é" * 127 + "x"]
    trial = f"{EVIDENCE}/harbor/{trial_name('hello', run_id)}"

    def add_names(files: dict[str, bytes]) -> None:
        assert f"{trial}/result.json" in files
        files.update({f"{trial}/agent/{name}": name.encode() for name in names})

    export_file = tmp_path / "export.tar"
    export_file.write_bytes(tampered(export, add_names))
    home = tmp_path / "home"
    dest = tmp_path / "sealed" / "run"
    env = {**os.environ, "BENCHSEAL_HOME": str(home), "BENCHSEAL_INFRA_POLICY": str(policy_path)}
    try:
        done = subprocess.run([sys.executable, "-m", "pipeline", "evidence", str(dest), "--from-export",
                               str(export_file), "--run-id", run_id, "--signer", "local", "--json"],
                              capture_output=True, text=True, check=False, timeout=300, cwd=REPO, env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["artifacts"] == str(dest / "artifacts")
        assert os.listdir(dest.parent) == ["run"]  # the staging dir was renamed, nothing else is left
        nested = parse_checksums((dest / "artifacts" / NESTED_SUMS).read_bytes(), NESTED_SUMS, nested=True)
        assert {f"{trial.removeprefix('artifacts/')}/agent/{name}" for name in names} <= set(nested)
        verify_release(dest / "artifacts", repository=payload["source"]["repository"],
                       tag=payload["source"]["tag"], trusted_root=home / "sigstore" / "trusted_root.json")
    finally:
        sigstore_local.stop(home / "sigstore")


def test_publish_refuses_an_undecodable_checksum_file_in_one_line(tmp_path: Path):
    """`benchseal publish` reads SHA256SUMS with the same parser: bytes that are not UTF-8 are a refusal."""
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    (artifacts / "summary.json").write_text("{}")
    (artifacts / "SHA256SUMS").write_bytes(HEX.encode() + b"  summary.json\xff\n")
    with pytest.raises(CheckFailed, match="not UTF-8"):
        load_bundle(artifacts, "v1.0.0")


_hostile_part = st.lists(st.sampled_from(["a", "b", ".", "..", " ", "\r", "\n", "\u2028", "\u202e", "\u200b", "é",
                                          "e\u0301", "\\", "\x00", "\udcff", "x" * 200]), min_size=1, max_size=3).map("".join)
_kinds = st.sampled_from([tarfile.REGTYPE, tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE])
_members = st.lists(st.tuples(st.lists(_hostile_part, min_size=1, max_size=3).map("/".join), _kinds), max_size=5)


@settings(max_examples=120, deadline=None)
@given(members=_members)
@example(members=[("a", tarfile.REGTYPE), ("a/b", tarfile.REGTYPE)])
@example(members=[("a/b", tarfile.REGTYPE), ("a", tarfile.REGTYPE)])
@example(members=[("é", tarfile.REGTYPE), ("e\u0301", tarfile.REGTYPE)])
def test_any_export_is_unpacked_exactly_or_refused_leaving_nothing(tmp_path_factory, members):
    entries = []
    for name, kind in members:
        info = tarfile.TarInfo(f"{E}/{name}")
        info.type = kind
        if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
            info.linkname = "run.json"
        info.pax_headers = {"path": info.name}  # the name exactly as generated, NUL included
        entries.append((info, b"data" if kind == tarfile.REGTYPE else None))
    data = _export([*(_file(n, d) for n, d in TOP), *entries])
    parent = tmp_path_factory.mktemp("sealed")
    try:
        dest = import_run(io.BytesIO(data), parent / "run", RUN_ID)
    except CheckFailed as exc:
        assert "\n" not in str(exc) and str(exc).isprintable()
        assert os.listdir(parent) == []
        return
    files = {f"{E}/{name}" for name, _ in members}
    assert all(is_plain_relative_name(name) for name in files)
    assert {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()} == {"run.json", "grading.json",
                                                                                       *files}


@pytest.mark.parametrize("name", [".", ".."])
def test_a_top_level_listing_names_no_dot_or_dot_dot(name: str):
    with pytest.raises(CheckFailed, match=r"'\.\.' part"):
        parse_checksums(f"{HEX}  {name}\n".encode())


def test_open_regular_opens_only_the_regular_file_that_is_there_now(tmp_path: Path) -> None:
    # The one open of export, packs and the seal job's result reader: no link followed, and a FIFO
    # swapped in after a listing is refused at once (O_NONBLOCK), never waited on for a writer.
    regular = tmp_path / "result.json"
    regular.write_bytes(b"{}")
    handle, info = open_regular(regular)
    with handle:
        assert handle.read() == b"{}" and info.st_size == 2
    (tmp_path / "link").symlink_to(regular)
    with pytest.raises(OSError) as link:
        open_regular(tmp_path / "link")
    assert not isinstance(link.value, NotRegularFile)  # ELOOP: the link itself is refused
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(NotRegularFile, match="not a regular file"):
        open_regular(tmp_path / "fifo")
    with pytest.raises(NotRegularFile):
        open_regular(tmp_path)
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing")
