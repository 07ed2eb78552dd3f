"""Payload building, correlation ids and the transport policy."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.contracts import CORRELATION_RE, DigestsFile, load_model
from pipeline.core.errors import UsageError, ValidationError
from pipeline.dispatch.client import make_client, make_retry, token_from_env
from pipeline.dispatch.correlate import title_matches
from pipeline.dispatch.dispatch import build_payload, client_payload, load_digests, new_correlation_id, workflow_inputs
from tests.fixtures.github import API_REF, RUNNER_REF, digests_data


def digests(**changes: Any) -> DigestsFile:
    return load_model(DigestsFile, {**digests_data(), **changes}, "digests")


def test_payload_carries_only_refs_source_and_correlation() -> None:
    payload = build_payload(digests(), correlation_id="widget-77-2-abcdef01")
    data = client_payload(payload)
    assert data == {
        "schema": "benchseal.dispatch/v1", "correlation_id": "widget-77-2-abcdef01",
        "source": {"repository": "acme/widget", "commit": "c" * 40, "tag": "v1.2.3"},
        "runner": RUNNER_REF, "api": API_REF, "suite": "smoke", "agent": "oracle",
    }
    assert len(data) <= 10
    inputs = workflow_inputs(payload)
    assert json.loads(inputs["payload"]) == data and inputs["tag"] == "v1.2.3"


def test_tag_option_overrides_source_ref() -> None:
    payload = build_payload(digests(), correlation_id="widget-77-2-abcdef01", tag="v9.0.0", suite="full")
    assert payload.source.tag == "v9.0.0" and payload.suite == "full"


@pytest.mark.parametrize("bad_ref", [
    "127.0.0.1:5055/benchseal/runner:latest",
    "127.0.0.1:5055/benchseal/runner@sha256:" + "A" * 64,
    "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 63,
    "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64 + "\n",
])
def test_bad_refs_in_the_digests_file_are_rejected(tmp_path: Path, bad_ref: str) -> None:
    data = digests_data()
    data["images"]["runner"]["ref"] = bad_ref
    path = tmp_path / "digests.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValidationError, match=r"images\.runner"):
        load_digests(path)


def test_missing_and_unreadable_digests_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_digests(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValidationError, match="readable JSON"):
        load_digests(tmp_path / "bad.json")


def test_correlation_id_from_the_actions_environment() -> None:
    cid = new_correlation_id({"GITHUB_REPOSITORY": "acme/widget", "GITHUB_RUN_ID": "123456", "GITHUB_RUN_ATTEMPT": "2"})
    assert re.fullmatch(r"widget-123456-2-[0-9a-f]{12}", cid)
    assert cid != new_correlation_id({"GITHUB_REPOSITORY": "acme/widget", "GITHUB_RUN_ID": "123456",
                                      "GITHUB_RUN_ATTEMPT": "2"})


@given(repo=st.text(max_size=300), run_id=st.text(max_size=300), attempt=st.text(max_size=50))
def test_generated_correlation_ids_always_match_the_contract(repo: str, run_id: str, attempt: str) -> None:
    cid = new_correlation_id({"GITHUB_REPOSITORY": repo, "GITHUB_RUN_ID": run_id, "GITHUB_RUN_ATTEMPT": attempt})
    assert CORRELATION_RE.match(cid) and " " not in cid and len(cid) <= 128


@pytest.mark.parametrize("cid", ["short", "has space-12345", "-leading-dash-123", "x" * 129, "tab\tin-it-123"])
def test_bad_correlation_ids_are_rejected(cid: str) -> None:
    with pytest.raises(ValidationError, match="correlation"):
        build_payload(digests(), correlation_id=cid)


_IDS = st.from_regex(CORRELATION_RE, fullmatch=True)


@given(mine=_IDS, other=_IDS, prefix=st.sampled_from(["Benchmark v1.2.3 ", "x ", "Benchmark  "]))
def test_a_title_matches_only_its_own_correlation_id(mine: str, other: str, prefix: str) -> None:
    assert title_matches(prefix + mine, mine)
    assert title_matches(prefix + other, mine) == (other == mine)
    assert not title_matches(mine, mine)  # the token must be delimited by a space


def test_transport_never_retries_post_but_retries_get_on_5xx() -> None:
    retry = make_retry()
    for status in (500, 502, 503, 504):
        assert retry.is_retry("GET", status) and not retry.is_retry("POST", status)
    assert not retry.is_retry("PATCH", 502) and not retry.is_retry("GET", 404)


def test_token_only_from_the_environment() -> None:
    assert token_from_env({"GITHUB_TOKEN": "t1", "GH_TOKEN": "t2"}) == "t1"
    assert token_from_env({"GH_TOKEN": "t2"}) == "t2"
    with pytest.raises(UsageError, match="GITHUB_TOKEN or GH_TOKEN"):
        token_from_env({"GITHUB_TOKEN": "  "})
    gh = make_client(env={"GITHUB_TOKEN": "t1", "GITHUB_API_URL": "http://127.0.0.1:9/api/v3/"})
    assert gh.requester.base_url == "http://127.0.0.1:9/api/v3"
