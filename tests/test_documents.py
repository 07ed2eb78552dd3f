"""The cross-stage documents (pipeline.core.documents): committed schemas, one spelling, upgrades, fail-closed reads."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from pipeline.core import documents, layout
from pipeline.core.contracts import trial_name, trial_short_id
from pipeline.core.documents import (
    BaseLock,
    PublisherError,
    ReleaseSummary,
    TrialsPlan,
    dump_document,
    load_document,
    parse_document,
    read_base_lock,
)
from pipeline.core.errors import ValidationError
from pipeline.evidence.artifacts import build_summary
from pipeline.verify.external import bundle_issuer, certificate_issuer
from tests.fixtures.sigstore import make_inputs

RUNNER = "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64
API = "127.0.0.1:5055/benchseal/api@sha256:" + "2" * 64
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "policies"


@pytest.mark.parametrize("name", sorted(documents.SCHEMAS))
def test_committed_schema_equals_the_model(name: str) -> None:
    """policies/<name> is exported from the model (python -m pipeline.core.documents); a model change must re-export."""
    committed = (SCHEMA_DIR / name).read_text(encoding="utf-8")
    assert committed == documents.json_schema(documents.SCHEMAS[name]), f"re-run python -m pipeline.core.documents ({name})"


def _summary() -> ReleaseSummary:
    grading, payload = make_inputs({"runner": RUNNER, "api": API})
    return build_summary(grading, payload)


def test_summary_round_trips_through_its_model(tmp_path: Path) -> None:
    summary = _summary()
    path = dump_document(summary, tmp_path / layout.SUMMARY)
    data = json.loads(path.read_text())
    assert data["schema"] == "benchseal.summary/v1" and data["run_id"] == "run-evidence-0001"
    assert "infra_run_id" not in data  # one spelling
    assert data["timings"]["started_at"] == "2026-12-02T10:00:00Z"
    assert load_document(ReleaseSummary, path) == summary


def test_old_summary_with_two_run_ids_is_upgraded() -> None:
    data: dict[str, Any] = _summary().to_json_dict()
    old = {**data, "infra_run_id": data["run_id"]}
    assert parse_document(ReleaseSummary, old, "summary.json").run_id == data["run_id"]
    with pytest.raises(ValidationError, match="infra_run_id"):
        parse_document(ReleaseSummary, {**data, "infra_run_id": "run-other"}, "summary.json")


@pytest.mark.parametrize(("change", "field"), [
    ({"schema": "benchseal.summary/v2"}, "schema"),
    ({"run": {"status": "SUCCEEDED"}}, "run"),  # a spelling the writer never produces
    ({"score": 0.75}, "score"),
    ({"status": "FAILED"}, "score must be null"),
    ({"timings": {"started_at": "2026-12-02T10:00:00", "finished_at": "2026-12-02T10:02:00Z", "trials": []}},
     "timings.started_at"),  # a timestamp without an offset
])
def test_summary_fails_closed_naming_the_field(change: dict[str, Any], field: str) -> None:
    data = {**_summary().to_json_dict(), **change}
    with pytest.raises(ValidationError, match=field):
        parse_document(ReleaseSummary, data, "summary.json")


def test_summary_without_schema_is_refused() -> None:
    data = _summary().to_json_dict()
    del data["schema"]
    with pytest.raises(ValidationError, match="schema"):
        parse_document(ReleaseSummary, data, "summary.json")


def test_trials_plan_names_and_upgrade(tmp_path: Path) -> None:
    assert trial_short_id("run-ABC_def-0123456789") == "ef0123456789"
    assert trial_name("hello", "run-0f3a9c") == "hello__run0f3a9c"
    old = {"run_id": "run-1", "agent": "oracle", "agent_version": None, "harbor_version": "0.26.0", "model": None,
           "trials": [{"task": "hello", "trial_name": trial_name("hello", "run-1")}]}
    (tmp_path / "trials.json").write_text(json.dumps(old))
    plan = load_document(TrialsPlan, tmp_path / "trials.json")
    assert plan.trials[0].trial_name == "hello__run1" and plan.to_json_dict()["schema"] == "benchseal.trials/v1"


@pytest.mark.parametrize("name", ["../../etc", "hello__x/y", "Hello__run1", ""])
def test_trials_plan_refuses_trial_names_that_leave_the_trials_dir(name: str) -> None:
    with pytest.raises(ValidationError, match="trial_name"):
        parse_document(TrialsPlan, {"schema": "benchseal.trials/v1", "run_id": "r", "agent": "oracle",
                                    "agent_version": None, "harbor_version": None, "model": None,
                                    "trials": [{"task": "hello", "trial_name": name}]}, "trials.json")


def test_base_lock_reads_and_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock = tmp_path / "base.lock.json"
    monkeypatch.setenv("BENCHSEAL_BASE_LOCK", str(lock))
    assert read_base_lock() == BaseLock()  # none written yet
    ref = "127.0.0.1:5055/benchseal/base@sha256:" + "a" * 64
    lock.write_text(json.dumps({"schema": "benchseal.base-lock/v1", "images": {"base": {
        "name": ref.split("@")[0], "digest": ref.split("@")[1], "ref": ref}}}))
    assert read_base_lock().images["base"].ref == ref
    lock.write_text(json.dumps({"schema": "benchseal.base-lock/v1", "images": {"base": {
        "name": "127.0.0.1:5055/benchseal/other", "digest": "sha256:" + "a" * 64, "ref": ref}}}))
    with pytest.raises(ValidationError, match=r"images\.base"):
        read_base_lock()
    lock.write_text(json.dumps({"images": {}}))
    with pytest.raises(ValidationError, match="schema"):
        read_base_lock()


def test_publisher_error_document(tmp_path: Path) -> None:
    doc = PublisherError(run_id="run-1", tag="v1.0.0", target="github", attempts=5, error="boom",
                         at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    path = dump_document(doc, tmp_path / layout.PUBLISHER_ERROR)
    assert json.loads(path.read_text())["at"] == "2026-01-01T00:00:00Z"
    assert load_document(PublisherError, path) == doc


# --- the Fulcio issuer extension: DER decoded by cryptography ---------------------------------

ISSUER_V2 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8")


def _der_utf8(text: str) -> bytes:
    raw = text.encode()
    if len(raw) < 0x80:
        return b"\x0c" + bytes([len(raw)]) + raw
    size = len(raw).to_bytes((len(raw).bit_length() + 7) // 8, "big")
    return b"\x0c" + bytes([0x80 | len(size)]) + size + raw


def _certificate(extension_value: bytes) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    now = dt.datetime.now(dt.UTC)
    return (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(minutes=5))
            .add_extension(x509.UnrecognizedExtension(ISSUER_V2, extension_value), critical=False)
            .sign(key, hashes.SHA256()))


@pytest.mark.parametrize("issuer", ["https://token.actions.githubusercontent.com",
                                    "https://issuer.example/" + "x" * 200,  # > 127 bytes: long-form DER length
                                    "https://issuer.example/" + "y" * 70_000])
def test_issuer_extension_any_length(issuer: str, tmp_path: Path) -> None:
    cert = _certificate(_der_utf8(issuer))
    assert certificate_issuer(cert) == issuer
    bundle = tmp_path / "x.sigstore.json"
    bundle.write_text(json.dumps({"verificationMaterial": {"certificate": {
        "rawBytes": base64.b64encode(cert.public_bytes(Encoding.DER)).decode()}}}))
    assert bundle_issuer(bundle) == issuer


def test_issuer_extension_of_another_type_is_refused() -> None:
    cert = _certificate(b"\x04\x05hello")  # an OCTET STRING, not a UTF8String
    with pytest.raises(ValueError):
        certificate_issuer(cert)
