"""pipeline.attest.passed: an image check that passed is not run again for the same digest, identity,
trust root and cosign; anything else is (real cosign, the private Sigstore instance, the local registry)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import pipeline.attest.images as images_module
import pipeline.attest.passed as passed
from pipeline.attest.images import ATTESTATION_TYPES, SigstoreEndpoints, image_identity, verify_image
from pipeline.core.errors import CheckFailed
from tests.attest.test_image_attestations import COMMIT, JOB, _as_job, _sign, _unique_image

POLICY = image_identity("acme/app", "v1.2.3", COMMIT)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BENCHSEAL_HOME", str(tmp_path / "home"))
    # cosign is installed in the default home by setup: the fresh home has none, so keep the same binary.
    cosign = images_module.cosign_path()
    assert cosign is not None
    monkeypatch.setattr(images_module, "cosign_path", lambda: cosign)
    return tmp_path / "home"


@pytest.fixture(scope="module")
def signed(sigstore_instance: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, SigstoreEndpoints]:
    endpoints = SigstoreEndpoints.private(sigstore_instance.url, sigstore_instance.trusted_root)
    ref = _unique_image("passed-checks")
    with pytest.MonkeyPatch.context() as mp:
        _as_job(mp, sigstore_instance, JOB)
        _sign(ref, endpoints, tmp_path_factory.mktemp("passed"))
    return ref, endpoints


@pytest.fixture
def cosign_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every cosign argv verify_image runs (the real cosign still runs)."""
    runs: list[list[str]] = []
    real = images_module._run

    def counting(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
        runs.append(list(args))
        return real(args, env)

    monkeypatch.setattr(images_module, "_run", counting)
    return runs


def test_a_pass_is_remembered_for_the_same_inputs(home: Path, signed: tuple[str, SigstoreEndpoints],
                                                  cosign_runs: list[list[str]]) -> None:
    ref, endpoints = signed
    verify_image(ref, POLICY, endpoints, allow_http_registry=True)
    assert [args[0] for args in cosign_runs] == ["verify", "verify-attestation", "verify-attestation"]
    verify_image(ref, POLICY, endpoints, allow_http_registry=True)
    verify_image(ref, POLICY, endpoints, allow_http_registry=True, attestations=())  # the signature alone: passed too
    assert len(cosign_runs) == 3
    assert len(list((home / "cache" / "image-checks").glob("*.json"))) == 3


def test_a_refusal_is_never_remembered(home: Path, signed: tuple[str, SigstoreEndpoints],
                                       cosign_runs: list[list[str]]) -> None:
    ref, endpoints = signed
    other = image_identity("acme/app", "v1.2.3", "d" * 40)
    for _ in range(2):
        with pytest.raises(CheckFailed, match="not verified"):
            verify_image(ref, other, endpoints, allow_http_registry=True)
    assert len(cosign_runs) == 2
    assert not list((home / "cache" / "image-checks").glob("*.json"))


def test_another_trust_root_or_an_old_record_checks_again(home: Path, signed: tuple[str, SigstoreEndpoints],
                                                          cosign_runs: list[list[str]], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ref, endpoints = signed
    verify_image(ref, POLICY, endpoints, allow_http_registry=True, attestations=())
    assert endpoints.trusted_root is not None
    # The same root in other bytes is another input: checked again (and passes).
    root = tmp_path / "trusted_root.json"
    root.write_text(json.dumps(json.loads(endpoints.trusted_root.read_text()), indent=4))
    verify_image(ref, POLICY, SigstoreEndpoints.verifying(root), allow_http_registry=True, attestations=())
    assert len(cosign_runs) == 2
    monkeypatch.setattr(passed, "MAX_AGE_SECONDS", -1)
    verify_image(ref, POLICY, endpoints, allow_http_registry=True, attestations=())
    assert len(cosign_runs) == 3


@pytest.mark.parametrize("record", ["", "{", "[]", '{"key": "other", "passed_at": 0}', '{"key": "KEY"}',
                                    '{"key": "KEY", "passed_at": "yesterday"}', '{"key": "KEY", "passed_at": 1e300}'])
def test_a_record_that_is_not_a_pass_checks_again(home: Path, signed: tuple[str, SigstoreEndpoints],
                                                  cosign_runs: list[list[str]], record: str) -> None:
    ref, endpoints = signed
    verify_image(ref, POLICY, endpoints, allow_http_registry=True, attestations=())
    (path,) = (home / "cache" / "image-checks").glob("*.json")
    path.write_text(record.replace("KEY", path.stem))
    verify_image(ref, POLICY, endpoints, allow_http_registry=True, attestations=())
    assert len(cosign_runs) == 2


def test_only_a_digest_pinned_check_has_a_key(tmp_path: Path) -> None:
    cosign = tmp_path / "cosign"
    cosign.write_bytes(b"")
    pinned = "127.0.0.1:5055/a/b@sha256:" + "a" * 64
    assert passed.check_key(["verify", pinned], cosign, None) is not None
    assert passed.check_key(["verify", pinned], cosign, None) != passed.check_key(["verify", "--offline", pinned],
                                                                                  cosign, None)
    for ref in ("127.0.0.1:5055/a/b:latest", "127.0.0.1:5055/a/b@sha256:" + "A" * 64, ""):
        assert passed.check_key(["verify", ref], cosign, None) is None
    assert passed.check_key([], cosign, None) is None
    passed.record_pass(None)  # nothing to record
    assert not passed.passed_before(None)


def test_the_attestation_checks_run_side_by_side_and_each_is_required(home: Path, signed: tuple[str, SigstoreEndpoints],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """After the signature, an image's attestation checks run at once (issue 36.6: the worker's and the release's
    six cosign runs were one after another); each is still required: one refused (here the CycloneDX check asked
    of another identity, real cosign refusing it) fails the check, naming it, and only the passes are remembered."""
    ref, endpoints = signed
    real = images_module._run
    lock = threading.Lock()
    running: list[int] = [0, 0]  # now, most at once
    runs: list[str] = []

    def refusing_cyclonedx(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
        with lock:
            running[0] += 1
            running[1] = max(running)
            runs.append(args[0] if args[0] == "verify" else args[args.index("--type") + 1])
        try:
            if ATTESTATION_TYPES["cyclonedx"] in args:
                i = args.index("--certificate-identity")
                args = [*args[:i + 1], args[i + 1].replace("acme/app", "acme/other"), *args[i + 2:]]
            time.sleep(0.2)  # each run overlaps the next one started at once, however fast cosign answers
            return real(args, env)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(images_module, "_run", refusing_cyclonedx)
    with pytest.raises(CheckFailed, match=r"cyclonedx\.org/bom attestation by .*not verified"):
        verify_image(ref, POLICY, endpoints, allow_http_registry=True)
    assert runs[0] == "verify" and sorted(runs[1:]) == sorted(ATTESTATION_TYPES.values())
    assert running[1] == 2  # the two attestation checks at once, after the signature alone
    assert len(list((home / "cache" / "image-checks").glob("*.json"))) == 2  # the signature and the provenance
    runs.clear()
    monkeypatch.setattr(images_module, "_run", real)
    verify_image(ref, POLICY, endpoints, allow_http_registry=True)  # only the refused check runs again, and passes
    assert len(list((home / "cache" / "image-checks").glob("*.json"))) == 3
