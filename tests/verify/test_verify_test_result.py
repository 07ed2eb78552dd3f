"""Issue 26.1: ``benchseal verify`` checks the release's test-result attestation (pipeline.verify.testresult).

Every case changes ``test-result.intoto.json`` and RE-SIGNS it (DSSE) and SHA256SUMS with the test's
signer, so every signature holds and only the test-result check can catch it; each refusal is one
line naming the field. A tampered statement that is not re-signed, and a missing asset, are refused
too, in one line each, by the CLI as well.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.documents import SCORE_EXTENSION
from pipeline.core.errors import (
    ChecksumMismatch,
    EvidenceMissing,
    ReleaseRefused,
    SignedStatementMismatch,
    TestResultMismatch,
)
from pipeline.core.fsutil import canonical_json
from pipeline.evidence.writer import reseal
from pipeline.verify.release import VerifiedRelease
from pipeline.verify.testresult import _check_url

pytestmark = pytest.mark.slow
SOURCE_REPO, SOURCE_TAG = "acme/widget", "v9.9.9"
STATEMENT = "test-result.intoto.json"
REPO = Path(__file__).resolve().parents[2]
Mutate = Callable[[dict[str, Any]], None]
Verify = Callable[[Path], VerifiedRelease]


def _resign(release: Path, signer: Any, mutate: Mutate | None = None) -> None:
    path = release / STATEMENT
    statement = json.loads(path.read_text())
    if mutate is not None:
        mutate(statement)
    path.write_text(canonical_json(statement))
    signer.sign_statement(path)
    reseal(release, signer=signer)


def _refused(release: Path, verify: Verify, rule: type[ReleaseRefused] = TestResultMismatch,
             subject: str = STATEMENT) -> None:
    """Refused by exactly ``rule`` (its class, never its wording) on ``subject``, in one line."""
    with pytest.raises(ReleaseRefused) as caught:
        verify(release)
    assert type(caught.value) is rule and caught.value.subject == subject, repr(caught.value)
    assert "\n" not in str(caught.value)


def test_control_resigned_untampered_statement_verifies(release_copy: Path, signer_v1: object,
                                                        verify: Verify) -> None:
    _resign(release_copy, signer_v1)
    verify(release_copy)


def _predicate(change: Callable[[dict[str, Any]], None]) -> Mutate:
    return lambda statement: change(statement["predicate"])


def _extension(**values: Any) -> Mutate:
    return _predicate(lambda p: p[SCORE_EXTENSION].update(values))


ALL_RESOLVED = {"total": 2, "completed": 2, "resolved": 2, "unresolved": 0, "infra_errors": 0}


CASES: list[tuple[str, Mutate]] = [
    ("flipped result", _predicate(lambda p: p.__setitem__("result", "FAILED"))),
    ("warned result", _predicate(lambda p: p.__setitem__("result", "WARNED"))),
    ("a failed task listed as passed", _predicate(lambda p: p.update(passedTests=["fail", "hello"], failedTests=[]))),
    ("a failed task dropped", _predicate(lambda p: p.__setitem__("failedTests", []))),
    # A score its own counts do not give: the model's score rule, naming the extension.
    ("a raised score", _extension(score=1.0)),
    ("a raised score and counts", _extension(score=1.0, counts=ALL_RESOLVED)),
    ("a narrowed interval", _extension(interval={"low": 0.4, "high": 0.6, "confidence": 0.95, "method": "wilson"})),
    ("counts", _extension(counts={"total": 3, "completed": 2, "resolved": 1, "unresolved": 1, "infra_errors": 1})),
    ("another run", _extension(run_id="run-evidence-0002")),
    ("gated claimed", _extension(gated=True)),
    ("another dataset", _predicate(lambda p: p["configuration"][1]["digest"].__setitem__("sha256", "0" * 64))),
    ("wrong runner subject", lambda s: s["subject"][0]["digest"].__setitem__("sha256", "0" * 64)),
    ("wrong summary subject", lambda s: s["subject"][1]["digest"].__setitem__("sha256", "0" * 64)),
    ("a third subject", lambda s: s["subject"].append({"name": "other", "digest": {"sha256": "1" * 64}})),
    ("another predicate type", lambda s: s.__setitem__("predicateType", "https://slsa.dev/provenance/v1")),
    ("a result outside the enum", _predicate(lambda p: p.__setitem__("result", "pass"))),
    ("no configuration", _predicate(lambda p: p.__setitem__("configuration", []))),
    ("a url that is not https", _predicate(lambda p: p.__setitem__("url", "http://example.com/run"))),
]


@pytest.mark.parametrize(("case", "mutate"), CASES, ids=[c[0] for c in CASES])
def test_a_resigned_statement_that_summary_json_does_not_give_is_refused(
        case: str, mutate: Mutate, release_copy: Path, signer_v1: object, verify: Verify) -> None:
    _resign(release_copy, signer_v1, mutate)
    _refused(release_copy, verify)


def _cli(release: Path, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", "verify", str(release), "--repo", SOURCE_REPO, "--tag",
                           SOURCE_TAG, "--trusted-root", str(root), "--offline"],
                          capture_output=True, text=True, check=False, timeout=120, cwd=REPO)


def test_the_cli_refuses_a_flipped_result_in_one_line(release_copy: Path, signer_v1: object, root: Path) -> None:
    _resign(release_copy, signer_v1, _predicate(lambda p: p.__setitem__("result", "FAILED")))
    done = _cli(release_copy, root)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "test-result.intoto.json: predicate.result is 'FAILED', but summary.json gives 'PASSED'" in line


def test_a_statement_tampered_without_resigning_is_refused(release_copy: Path, signer_v1: object,
                                                           verify: Verify) -> None:
    path = release_copy / STATEMENT
    statement = json.loads(path.read_text())
    statement["predicate"]["result"] = "FAILED"
    path.write_text(canonical_json(statement))
    _refused(release_copy, verify, ChecksumMismatch, STATEMENT)
    reseal(release_copy, signer=signer_v1)  # type: ignore[arg-type]  # SHA256SUMS re-made: the DSSE bundle still says otherwise
    _refused(release_copy, verify, SignedStatementMismatch, f"{STATEMENT}.sigstore.json")


def test_a_missing_statement_is_refused_in_one_line(release_copy: Path, signer_v1: object, root: Path,
                                                    verify: Verify) -> None:
    (release_copy / STATEMENT).unlink()
    _refused(release_copy, verify, ChecksumMismatch, "SHA256SUMS")
    # Gone from SHA256SUMS too (re-signed): a release must carry it.
    (release_copy / f"{STATEMENT}.sigstore.json").unlink()
    reseal(release_copy, signer=signer_v1)  # type: ignore[arg-type]
    _refused(release_copy, verify, EvidenceMissing, f"{STATEMENT}.sigstore.json")
    done = _cli(release_copy, root)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_url_must_be_an_actions_run_of_the_pinned_infra_repository() -> None:
    infra = "acme/bench-infra"
    for url in ("https://github.com/acme/bench-infra/actions/runs/42/attempts/1",
                "https://github.com/acme/bench-infra/actions/runs/42"):
        _check_url(url, infra)
    _check_url("https://example.com/anything", None)  # no infra repository pinned: https is all the model asks
    _check_url(None, infra)  # sealed outside Actions: no url
    for url in ("https://github.com/evil/bench-infra/actions/runs/42", "https://github.com/acme/bench-infra/pulls/1",
                "https://github.com/acme/bench-infra/actions/runs/42/../../x"):
        with pytest.raises(TestResultMismatch):
            _check_url(url, infra)


@pytest.mark.parametrize(("url", "ok"), [
    ("https://github.com/acme/bench-infra/actions/runs/42/attempts/1", True),
    ("https://ghe.example.com/acme/bench-infra/actions/runs/42", True),  # an Enterprise server
    ("http://127.0.0.1:8080/acme/bench-infra/actions/runs/42/attempts/2", True),  # a server on this machine
    ("https://github.com/acme/other-infra/actions/runs/42", False),  # another repository than the pinned one
    ("https://github.com/acme/bench-infra/actions/runs/42/../../../evil", False),
    ("https://github.com/acme/bench-infra/pulls/42", False),
    ("https://user@github.com/acme/bench-infra/actions/runs/42", False),
])
def test_the_run_url_is_an_actions_run_of_the_pinned_infra_repository(url: str, ok: bool) -> None:
    from pipeline.verify.testresult import _check_url

    if ok:
        _check_url(url, "acme/bench-infra")
    else:
        with pytest.raises(TestResultMismatch):
            _check_url(url, "acme/bench-infra")
