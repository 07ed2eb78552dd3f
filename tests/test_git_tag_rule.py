"""The git tag rule has one home (``pipeline.core.contracts.validate_git_tag`` / ``GitTag``), and a ref is
not a tag name there: the producer's payload, tag resolution and verify's expectation all refuse
``refs/tags/v1`` by that one rule (``TagIsARef``, naming the field), not by a check of their own
(issue 39: verify's policy used to add the refusal while core accepted the ref).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.contracts import GIT_TAG_REF_RULE, GIT_TAG_RULE, PayloadSource, load_model, validate_git_tag
from pipeline.core.errors import TagIsARef, ValidationError
from pipeline.dispatch.resolve import tag_of_ref
from pipeline.verify.fetch import parse_reference
from pipeline.verify.policy import expectation

REFS = ["refs/tags/v1", "refs/tags/v1.2.3", "refs/heads/main", "refs/x"]


@pytest.mark.parametrize("ref", REFS)
def test_a_ref_is_not_a_tag_name(ref: str) -> None:
    with pytest.raises(TagIsARef) as caught:
        validate_git_tag(ref, "--tag")
    assert (caught.value.field, caught.value.rule, caught.value.value) == ("--tag", GIT_TAG_REF_RULE, ref)


@pytest.mark.parametrize("tag", ["v1", "v1.2.3", "release/v1", "refs", "refsx/v1", "v1-refs/x"])
def test_tag_names_pass(tag: str) -> None:
    assert validate_git_tag(tag, "--tag") == tag


@pytest.mark.parametrize("tag", ["v1..2", "v1.lock", "-v1", "v1/", ""])
def test_the_other_tag_rules_are_not_this_one(tag: str) -> None:
    # The control: a tag broken by another of the rule's parts fails as a plain ValidationError, so a test of
    # the ref rule cannot pass on one of those.
    with pytest.raises(ValidationError) as caught:
        validate_git_tag(tag, "--tag")
    assert type(caught.value) is ValidationError and caught.value.rule == GIT_TAG_RULE


def test_the_producers_payload_refuses_a_ref_as_its_tag() -> None:
    source = {"repository": "acme/widget", "commit": "0" * 40, "tag": "v1"}
    assert load_model(PayloadSource, source, "payload").tag == "v1"
    with pytest.raises(ValidationError) as caught:
        load_model(PayloadSource, {**source, "tag": "refs/tags/v1"}, "payload")
    assert (caught.value.field, caught.value.rule) == ("payload: tag", GIT_TAG_REF_RULE)


def test_tag_resolution_strips_one_refs_tags_prefix_and_no_more() -> None:
    assert tag_of_ref("refs/tags/v1") == "v1"
    with pytest.raises(TagIsARef) as caught:
        tag_of_ref("refs/tags/refs/tags/v1", "ref")
    assert caught.value.field == "ref"


def test_verify_refuses_a_ref_by_the_same_rule(tmp_path: Path) -> None:
    with pytest.raises(TagIsARef) as option:
        expectation(None, "local", repository="acme/widget", tag="refs/tags/v1")
    assert option.value.field == "--tag"
    policy = tmp_path / "verify.yaml"
    policy.write_text("schema: benchseal.verify-policy/v1\nprofiles:\n  local:\n    identity: https://x/y\n"
                      "    issuer: https://issuer\nexpect:\n  tag: refs/tags/v1\n")
    with pytest.raises(TagIsARef) as pinned:
        expectation(policy, "local", repository="acme/widget", tag=None)
    assert pinned.value.field == f"{policy}: expect.tag"
    with pytest.raises(TagIsARef) as reference:
        parse_reference("acme/widget@refs/tags/v1")
    assert reference.value.field == "OWNER/REPO@TAG: TAG"


@pytest.mark.parametrize("value", ["v1..2", 5, ["v1"]])
def test_a_refusal_names_the_default_field_the_rule_and_the_value(value: object) -> None:
    # Mutation testing (issue 39.3): the one line a user reads names the field, the rule and what was given,
    # for a non-string as for a bad string (a refusal that lost any of them passed before).
    with pytest.raises(ValidationError) as caught:
        validate_git_tag(value)
    assert (caught.value.field, caught.value.rule, caught.value.value) == ("tag", GIT_TAG_RULE, value)
