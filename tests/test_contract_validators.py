"""The one-home validators of ``pipeline.core.contracts`` used outside a model (CLI options, tag resolution,
the agent's integrity, trial names): each refuses what its rule refuses and names the field, the rule and the
value. Written against the mutants that survived the first mutation run (issue 39.3, docs/architecture.md
"Mutation testing"): each assertion fails if its check is deleted or weakened.
"""

from __future__ import annotations

import base64
import hashlib

import pytest

from pipeline.core.contracts import (
    CORRELATION_RULE,
    MAX_TASK_ATTEMPTS,
    REPOSITORY_RULE,
    RUN_ID_RULE,
    SRI_RULE,
    AgentArtifact,
    GradeCounts,
    check_score,
    pep503_name,
    run_id_for,
    run_id_problem,
    sri_of,
    sri_problem,
    trial_attempt,
    trial_name,
    validate_correlation,
    validate_repository,
    validate_run_id,
)
from pipeline.core.errors import ValidationError

RUN = "run-0123456789abcdef0123"


@pytest.mark.parametrize("value", ["has space 123", "-leading-dash", "short", "x" * 129, 12345678])
def test_a_bad_correlation_id_is_refused_naming_field_rule_and_value(value: object) -> None:
    with pytest.raises(ValidationError) as caught:
        validate_correlation(value)  # type: ignore[arg-type]  # a non-string is refused too
    assert (caught.value.field, caught.value.rule, caught.value.value) == ("correlation", CORRELATION_RULE, value)


def test_a_good_correlation_id_passes_unchanged() -> None:
    assert validate_correlation("abc-123_x.y", "--correlation") == "abc-123_x.y"


@pytest.mark.parametrize("value", ["a/b/c", "owner", "owner/..", "ow ner/name", "\u212aey/name", 7])
def test_a_bad_repository_is_refused_naming_field_rule_and_value(value: object) -> None:
    with pytest.raises(ValidationError) as caught:
        validate_repository(value)
    assert (caught.value.field, caught.value.rule, caught.value.value) == ("repo", REPOSITORY_RULE, value)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


@pytest.mark.parametrize("value", [
    "sha512-" + _b64(b"\0" * 32),  # a sha256-long digest under sha512: the length is the algorithm's
    "sha256-" + _b64(b"\0" * 31),
    "md5-" + _b64(b"\0" * 16),  # not an SRI algorithm, though its digest is well-formed base64
    "sha256",
    "sha256-",
    "sha256-" + _b64(b"\0" * 32)[:-1],  # padding cut: not valid base64
    "sha256-" + _b64(b"\1" * 32) + "=",  # excess padding: only strict decoding refuses it (32 bytes otherwise)
])
def test_sri_refuses_a_wrong_algorithm_length_or_encoding(value: str) -> None:
    assert sri_problem(value) == SRI_RULE


def test_an_agent_artifact_with_a_bad_integrity_is_refused() -> None:
    good = sri_of("sha512", hashlib.sha512(b"agent").digest())
    artifact = {"name": "a", "kind": "npm", "package": "a", "version": "1.0.0", "source_commit": "a" * 40}
    assert AgentArtifact.model_validate({**artifact, "integrity": good}).integrity == good
    with pytest.raises(ValueError, match="SRI hash"):
        AgentArtifact.model_validate({**artifact, "integrity": "sha512-" + _b64(b"\0" * 32)})


def test_trial_names_cover_every_attempt_up_to_the_limit() -> None:
    assert trial_name("t", RUN) == "t__89abcdef0123"  # one attempt: the names of before attempts existed
    assert trial_name("t", RUN, 1, 2) == "t__a1of2__89abcdef0123"
    last = trial_name("t", RUN, MAX_TASK_ATTEMPTS, MAX_TASK_ATTEMPTS)
    assert last.startswith(f"t__a{MAX_TASK_ATTEMPTS}of{MAX_TASK_ATTEMPTS}__")
    assert trial_attempt(last, "t", RUN) == (MAX_TASK_ATTEMPTS, MAX_TASK_ATTEMPTS)
    with pytest.raises(ValueError, match="attempt"):
        trial_name("t", RUN, 1, MAX_TASK_ATTEMPTS + 1)


@pytest.mark.parametrize("value", ["run-0123", "run-0123456789ABCDEF0123", "job-0123456789abcdef0123", 5,
                                   "run-0123456789abcdef0123\n"])
def test_a_bad_run_id_is_refused_naming_field_rule_and_value(value: object) -> None:
    assert run_id_problem(value) == RUN_ID_RULE
    with pytest.raises(ValidationError) as caught:
        validate_run_id(value)  # type: ignore[arg-type]  # a non-string is refused too
    assert (caught.value.field, caught.value.rule, caught.value.value) == ("RUN_ID", RUN_ID_RULE, value)


def test_a_run_id_the_queue_issues_passes() -> None:
    assert run_id_problem(RUN) is None and validate_run_id(RUN, "--run") == RUN
    assert run_id_problem(run_id_for("corr-1234")) is None


def test_pep503_folds_runs_of_separators_and_case() -> None:
    assert pep503_name("Hello__Agent.-.Core") == "hello-agent-core"


def test_the_score_rule_refuses_a_succeeded_run_without_completed_trials_or_score() -> None:
    one = GradeCounts(total=1, completed=1, resolved=1, unresolved=0, infra_errors=0)
    check_score("SUCCEEDED", one, 1.0)  # one completed trial is a scored run
    none = GradeCounts(total=1, completed=0, resolved=0, unresolved=0, infra_errors=1)
    with pytest.raises(ValueError, match=r"^a SUCCEEDED run must have counts.completed > 0$"):
        check_score("SUCCEEDED", none, 0.0)
    with pytest.raises(ValueError, match=r"^score of a SUCCEEDED run must be a finite number \(got None\)$"):
        check_score("SUCCEEDED", one, None)
