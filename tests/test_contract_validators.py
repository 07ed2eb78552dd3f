"""The one-home validators of ``pipeline.core.contracts`` used outside a model (CLI options, tag resolution,
the agent's integrity, trial names): each refuses what its rule refuses and names the field, the rule and the
value. Written against the mutants that survived the first mutation run (issue 39.3, docs/architecture.md
"Mutation testing"): each assertion fails if its check is deleted or weakened.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from pipeline.core.contracts import (
    BUILDER_RULE,
    CORRELATION_RULE,
    GIT_TAG_RULE,
    MAX_SUBSET_TASKS,
    MAX_TASK_ATTEMPTS,
    REPOSITORY_RULE,
    RUN_ID_RULE,
    SRI_RULE,
    AgentArtifact,
    DigestsFile,
    DispatchPayload,
    GradeCounts,
    ImageEntry,
    PayloadSource,
    RunStatus,
    builder_problem,
    check_score,
    load_model,
    parse_subset,
    pep503_name,
    run_id_for,
    run_id_problem,
    sri_hex,
    sri_of,
    sri_problem,
    task_trial_names,
    trial_attempt,
    trial_name,
    validate_correlation,
    validate_repository,
    validate_run_id,
)
from pipeline.core.digests import parse_ref, validate_digest, validate_name
from pipeline.core.errors import ValidationError

RUN = "run-0123456789abcdef0123"


@pytest.mark.parametrize("value", ["has space 123", "-leading-dash", "short", "x" * 129, 12345678])
def test_a_bad_correlation_id_is_refused_naming_field_rule_and_value(value: object) -> None:
    with pytest.raises(ValidationError) as caught:
        validate_correlation(value)  # type: ignore[arg-type]  # a non-string is refused too
    assert (caught.value.field, caught.value.rule, caught.value.value) == ("correlation", CORRELATION_RULE, value)


def test_a_good_correlation_id_passes_unchanged() -> None:
    assert validate_correlation("abc-123_x.y", "--correlation") == "abc-123_x.y"


@pytest.mark.parametrize("value", ["a/b/c", "owner", "owner/..", "owner/.", "ow ner/name", "\u212aey/name", 7])
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


# --- second mutation run (2026-12-07): refusals keep their rule's words; sri_hex, task_trial_names and
# DigestsFile.to_json_dict had no selected test; builder_problem's ref checks were each unguarded.

COMMIT = "0123456789abcdef0123456789abcdef01234567"
NAME = "127.0.0.1:5055/benchseal/runner"
DIGEST = "sha256:" + "a" * 64


def _refusal(model: type[BaseModel], data: dict[str, Any]) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        load_model(model, data, "doc")
    return caught.value


@pytest.mark.parametrize("commit", ["0123456789ABCDEF0123456789abcdef01234567", COMMIT[:39], "main"])
def test_a_commit_refusal_states_the_commit_rule(commit: str) -> None:
    refused = _refusal(PayloadSource, {"repository": "acme/widget", "commit": commit, "tag": "v1"})
    assert (refused.field, refused.rule, refused.value) == (
        "doc: commit", "must be a full 40-character lowercase hex commit SHA", commit)


def test_a_correlation_refusal_in_a_document_states_the_correlation_rule() -> None:
    source = {"repository": "acme/widget", "commit": COMMIT, "tag": "v1"}
    status = {"run_id": RUN, "correlation_id": "no spaces allowed", "state": "QUEUED", "attempts": 0,
              "suite": "smoke", "agent": "oracle", "source": source, "runner": f"{NAME}@{DIGEST}",
              "api": f"{NAME}@{DIGEST}", "created_at": "t", "updated_at": "t"}
    refused = _refusal(RunStatus, status)
    assert (refused.field, refused.rule) == ("doc: correlation_id", CORRELATION_RULE)


@pytest.mark.parametrize(("key", "value", "check"), [
    ("digest", "sha256:" + "A" * 64, validate_digest),
    ("name", "127.0.0.1:5055/Bench", validate_name),
    ("ref", f"{NAME}:latest", parse_ref),
])
def test_an_image_entry_refusal_carries_the_shared_validators_rule(key: str, value: str,
                                                                    check: Callable[[str], object]) -> None:
    with pytest.raises(ValidationError) as shared:
        check(value)
    refused = _refusal(ImageEntry, {"name": NAME, "digest": DIGEST, "ref": f"{NAME}@{DIGEST}", key: value})
    assert (refused.field, refused.rule, refused.value) == (f"doc: {key}", shared.value.rule, value)


def test_an_image_entry_whose_ref_is_another_image_is_refused_saying_so() -> None:
    other = "sha256:" + "b" * 64
    assert ImageEntry(name=NAME, digest=DIGEST, ref=f"{NAME}@{DIGEST}").ref == f"{NAME}@{DIGEST}"
    refused = _refusal(ImageEntry, {"name": NAME, "digest": DIGEST, "ref": f"{NAME}@{other}"})
    assert (refused.field, refused.rule) == ("doc: (root)", "ref must equal '<name>@<digest>' of the same entry")


def test_sri_hex_gives_the_algorithm_and_the_hex_of_its_digest() -> None:
    raw = hashlib.sha512(b"agent").digest()
    assert sri_hex(sri_of("sha512", raw)) == ("sha512", raw.hex())
    assert sri_hex(sri_of("sha256", hashlib.sha256(b"x").digest())) == ("sha256", hashlib.sha256(b"x").hexdigest())


@pytest.mark.parametrize("value", ["sha512-" + base64.b64encode(b"\0" * 32).decode(), "md5-AAAA", "sha256"])
def test_sri_hex_refuses_what_the_sri_rule_refuses(value: str) -> None:
    with pytest.raises(ValueError, match=f"^{SRI_RULE}$"):
        sri_hex(value)


def test_a_task_runs_once_unless_asked_for_more_attempts() -> None:
    assert task_trial_names("t", RUN) == ("t__89abcdef0123",)
    assert task_trial_names("t", RUN, 2) == ("t__a1of2__89abcdef0123", "t__a2of2__89abcdef0123")


def _digests(**extra: Any) -> DigestsFile:
    entry = {"name": NAME, "digest": DIGEST, "ref": f"{NAME}@{DIGEST}"}
    return DigestsFile.model_validate({"schema": "benchseal.digests/v1",
                                       "source": {"commit": COMMIT, "ref": "refs/tags/v1", "repository": "acme/w"},
                                       "images": {"runner": entry, "api": entry}, **extra})


def test_a_digests_file_without_agent_or_project_images_is_written_as_before_they_existed() -> None:
    data = _digests().to_json_dict()
    assert data == {"schema": "benchseal.digests/v1",
                    "source": {"commit": COMMIT, "ref": "refs/tags/v1", "repository": "acme/w"},
                    "images": {role: {"name": NAME, "digest": DIGEST, "ref": f"{NAME}@{DIGEST}", "tags": []}
                               for role in ("runner", "api")}}
    assert DigestsFile.model_validate(data) == _digests()


def test_a_digests_file_keeps_its_project_images() -> None:
    entry = {"name": NAME, "digest": DIGEST, "ref": f"{NAME}@{DIGEST}", "tags": ["v1"]}
    written = _digests(project_images={"tool": entry}).to_json_dict()
    assert written["project_images"] == {"tool": entry}  # JSON data: the tags tuple is a list
    assert DigestsFile.model_validate(written).project_images["tool"].tags == ("v1",)


_WORKFLOW = "benchseal/benchseal/.github/workflows/benchmark.yml@"


@pytest.mark.parametrize("ref", ["refs/heads/a..b", "refs/tags/v1//x", "refs/heads/main/", "refs/heads/main.",
                                 "refs/tags/v1.lock"])
def test_a_builder_ref_that_git_refuses_is_refused(ref: str) -> None:
    assert builder_problem(_WORKFLOW + ref) == BUILDER_RULE


@pytest.mark.parametrize("ref", ["refs/heads/main", "refs/tags/v1.2.3", "refs/heads/release/v1", "ab" * 20])
def test_a_builder_at_one_exact_ref_passes(ref: str) -> None:
    assert builder_problem(_WORKFLOW + ref) is None


@pytest.mark.parametrize("tag", ["v1.", "release/.hidden", "release//v1", "release/v1.lock/x", "v1..2"])
def test_a_tag_git_refuses_is_refused_in_a_document_by_the_tag_rule(tag: str) -> None:
    # Each of git check-ref-format's rules the character class does not give, through the model (the payload's
    # and the run's source) as through validate_git_tag: the one line states the tag rule.
    refused = _refusal(PayloadSource, {"repository": "acme/widget", "commit": COMMIT, "tag": tag})
    assert (refused.field, refused.rule, refused.value) == ("doc: tag", GIT_TAG_RULE, tag)


def test_the_builder_ref_rules_apply_to_the_ref_alone() -> None:
    # '..' in a repository or workflow file name is the path pattern's business, not the ref's.
    assert builder_problem("acme/widget..next/.github/workflows/seal..yml@refs/heads/main") is None


# --- a run's task subset (DispatchPayload.tasks, parse_subset): one spelling, each name once, bounded.

def test_a_subset_has_one_spelling() -> None:
    for empty in (None, "", " , ,"):
        assert parse_subset(empty) is None  # the whole suite
    assert parse_subset(" b,a ,c") == ("a", "b", "c")
    assert parse_subset(",".join(f"t{i}" for i in range(MAX_SUBSET_TASKS)), "inputs.tasks") is not None


@pytest.mark.parametrize(("text", "rule", "value"), [
    ("a,B", "each task must be a task directory name ([a-z0-9][a-z0-9_-]{0,63})", "B"),
    ("a,-b", "each task must be a task directory name ([a-z0-9][a-z0-9_-]{0,63})", "-b"),
    ("a,b,a,b", "names task 'a' twice", None),
    (",".join(f"t{i}" for i in range(MAX_SUBSET_TASKS + 1)), f"names at most {MAX_SUBSET_TASKS} tasks",
     MAX_SUBSET_TASKS + 1),
])
def test_a_subset_refusal_names_the_field_the_rule_and_the_task(text: str, rule: str, value: object) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_subset(text, "inputs.tasks")
    assert (caught.value.field, caught.value.rule, caught.value.value) == ("inputs.tasks", rule, value)
    with pytest.raises(ValidationError) as default:
        parse_subset(text)
    assert default.value.field == "--tasks"


def test_the_payloads_subset_is_sorted_once_and_empty_is_the_whole_suite() -> None:
    source = {"repository": "acme/widget", "commit": COMMIT, "tag": "v1"}
    payload = {"schema": "benchseal.dispatch/v1", "correlation_id": "corr-0001", "source": source,
               "runner": f"{NAME}@{DIGEST}", "api": f"{NAME}@{DIGEST}"}
    assert load_model(DispatchPayload, {**payload, "tasks": ["b", "a"]}, "doc").tasks == ("a", "b")
    assert load_model(DispatchPayload, {**payload, "tasks": []}, "doc").tasks is None
    refused = _refusal(DispatchPayload, {**payload, "tasks": ["a", "b", "a"]})
    assert (refused.field, refused.rule) == ("doc: tasks", "names task 'a' twice")
