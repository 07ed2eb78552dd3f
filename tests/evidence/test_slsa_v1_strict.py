"""Issue 37.3: every SLSA provenance benchseal signs is a clean in-toto Statement v1 with an SLSA v1
predicate, held to in-toto's own parser (tests/fixtures/slsa.py), and every build type it names is
documented (docs/build-types.md). The images' attached provenance is checked where it is read back from
the registry (tests/attest/test_image_referrers.py); here, the release's two statements and the image
predicate as built, and the checker's own refusals."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pipeline.attest.images import IMAGE_BUILD_TYPE, BuildInvocation, image_statement, provenance_predicate
from pipeline.core.digests import parse_ref
from pipeline.evidence import provenance
from pipeline.verify.external import SLSA_PROVENANCE
from tests.fixtures.sigstore import make_inputs
from tests.fixtures.slsa import strict_provenance

DOCS = Path(__file__).resolve().parents[2] / "docs" / "build-types.md"
RUNNER = "127.0.0.1:5055/x/runner@sha256:" + "1" * 64
API = "127.0.0.1:5055/x/api@sha256:" + "2" * 64
INVOCATION = BuildInvocation(repository="acme/widget", ref="refs/tags/v9.9.9", commit="0123456789abcdef" * 2 + "01234567",
                             workflow_ref="acme/widget/.github/workflows/tag.yml@refs/tags/v9.9.9",
                             run_url="https://github.com/acme/widget/actions/runs/1/attempts/1")


def _release_statements(tmp_path: Path) -> dict[str, dict[str, Any]]:
    grading, payload = make_inputs({"runner": RUNNER, "api": API})
    summary = tmp_path / "summary.json"
    summary.write_text("{}\n")
    images = provenance.write_statement(tmp_path / "images.json", provenance.images_statement(payload))
    run = provenance.write_statement(tmp_path / "summary.st.json", provenance.summary_statement(summary, grading, payload))
    return {"images": json.loads(images.read_text()), "run": json.loads(run.read_text())}


def _image_statement() -> dict[str, Any]:
    image = parse_ref(RUNNER)
    return json.loads(image_statement(image, SLSA_PROVENANCE, provenance_predicate(  # type: ignore[no-any-return]
        image, "runner", INVOCATION, base=API, reproducible=True)))


def test_the_release_statements_and_the_image_provenance_are_clean_slsa_v1(tmp_path: Path) -> None:
    statements = {**_release_statements(tmp_path), "image": _image_statement()}
    types = {name: strict_provenance(statement).build_definition.build_type for name, statement in statements.items()}
    # One build type per kind of build: the image's own attestation and the release's images statement agree.
    assert types == {"images": IMAGE_BUILD_TYPE, "image": IMAGE_BUILD_TYPE, "run": provenance.RUN_TYPE}
    image_params = statements["image"]["predicate"]["buildDefinition"]["externalParameters"]
    release_params = statements["images"]["predicate"]["buildDefinition"]["externalParameters"]
    assert set(image_params) == set(release_params) == {"source", "workflow"}
    assert image_params["source"] == release_params["source"] == {"repository": "acme/widget", "ref": "refs/tags/v9.9.9"}


def _without(document: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    holder = changed
    for key in path[:-1]:
        holder = holder[key]
    del holder[path[-1]]
    return changed


def _renamed(document: dict[str, Any], path: tuple[str, ...], new: str) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    holder = changed
    for key in path[:-1]:
        holder = holder[key]
    holder[new] = holder.pop(path[-1])
    return changed


META = ("predicate", "runDetails", "metadata", "invocationId")


@pytest.mark.parametrize(("mutate", "problem"), [
    (lambda s: _renamed(s, META, "invocationID"), "invocationID: not a field"),  # cosign's re-serialisation
    (lambda s: _renamed(s, META, "invocation_id"), "invocation_id: not a field"),  # the proto name, not the JSON name
    (lambda s: {**s, "_type": "https://in-toto.io/Statement/v0.1"}, "_type"),
    (lambda s: {**s, "predicateType": "https://slsa.dev/provenance/v0.2"}, "predicateType"),
    (lambda s: _renamed(s, ("predicate", "buildDefinition", "resolvedDependencies"), "materials"), "materials"),
    (lambda s: {**s, "predicate": {**s["predicate"], "extra": 1}}, "extra: not a field"),
    (lambda s: _without(s, ("predicate", "buildDefinition", "buildType")), "buildType: required"),
    (lambda s: _without(s, ("predicate", "runDetails", "builder", "id")), "builder.id: required"),
    (lambda s: {**s, "subject": []}, "subject"),
    (lambda s: _renamed(s, ("predicate", "runDetails", "metadata", "invocationId"), "startedOn"), "startedOn"),
], ids=["cosign-invocationID", "proto-name", "statement-v0.1", "slsa-v0.2", "v0.2-materials", "unknown-field",
        "no-buildType", "no-builder", "no-subject", "bad-timestamp"])
def test_the_checker_refuses_what_the_specs_do_not_spell(mutate: Any, problem: str) -> None:
    good = _image_statement()
    strict_provenance(good)
    with pytest.raises(AssertionError, match=re.escape(problem)):
        strict_provenance(mutate(good))


def test_every_build_type_has_its_documented_section() -> None:
    text = DOCS.read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    for uri in (IMAGE_BUILD_TYPE, provenance.RUN_TYPE):
        name = uri.split("/build-types/", 1)[1]
        assert f"`{name}`" in headings, f"docs/build-types.md has no section for {uri}"
        assert f"`{uri}`" in text
