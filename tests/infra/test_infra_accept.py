"""`benchseal infra accept`: hostile payloads are rejected naming the field; redelivery is idempotent."""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError as PydanticValidationError

from pipeline.core.contracts import DispatchPayload
from pipeline.core.digests import parse_ref
from pipeline.core.errors import ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.accept import (
    MAX_DEPTH,
    MAX_NUMBER_CHARS,
    accept_payload,
    parse_payload_bytes,
    validate_payload,
)
from pipeline.infra.intake.policy import SCHEMA_PATH, InfraPolicy, SignerPolicy, load_policy
from pipeline.verify.policy import load_policy as load_verify_policy
from tests.fixtures.datasets import shipped_smoke

HEX = "0123456789abcdef" * 4
RUNNER = "127.0.0.1:5055/benchseal/runner"

# (description, path to the field, value, expected field named in the error)
HOSTILE: list[tuple[str, tuple[str, ...], Any, str]] = [
    ("tag instead of digest", ("runner",), f"{RUNNER}:latest", "payload.runner"),
    ("tag and digest", ("runner",), f"{RUNNER}:v1@sha256:{HEX}", "payload.runner"),
    ("short hex", ("runner",), f"{RUNNER}@sha256:{HEX[:63]}", "payload.runner"),
    ("long hex", ("runner",), f"{RUNNER}@sha256:{HEX}0", "payload.runner"),
    ("uppercase hex", ("runner",), f"{RUNNER}@sha256:{HEX.upper()}", "payload.runner"),
    ("other algorithm", ("runner",), f"{RUNNER}@sha512:{HEX}", "payload.runner"),
    ("other registry", ("runner",), f"ghcr.io/benchseal/runner@sha256:{HEX}", "payload.runner"),
    ("other repository", ("runner",), f"127.0.0.1:5055/evil/runner@sha256:{HEX}", "payload.runner"),
    ("runner repo as api", ("api",), f"{RUNNER}@sha256:{HEX}", "payload.api"),
    ("implied docker hub", ("runner",), f"benchseal/runner@sha256:{HEX}", "payload.runner"),
    ("traversal in repo", ("runner",), f"127.0.0.1:5055/benchseal/../runner@sha256:{HEX}", "payload.runner"),
    ("whitespace", ("runner",), f" {RUNNER}@sha256:{HEX}", "payload.runner"),
    ("trailing newline", ("runner",), f"{RUNNER}@sha256:{HEX}\n", "payload.runner"),
    ("unicode digit", ("runner",), f"{RUNNER}@sha256:{HEX[:63]}\u0661", "payload.runner"),
    ("homoglyph host", ("runner",), f"127.0.0.1:5055/benchsеal/runner@sha256:{HEX}", "payload.runner"),
    ("not a string", ("runner",), 12345, "payload.runner"),
    ("null", ("api",), None, "payload.api"),
    ("unknown suite", ("suite",), "full", "payload.suite"),
    ("traversal suite", ("suite",), "../etc", "payload.suite"),
    ("unknown agent", ("agent",), "claude-code", "payload.agent"),
    ("uppercase agent", ("agent",), "Oracle", "payload.agent"),
    ("correlation with space", ("correlation_id",), "release v1", "payload.correlation_id"),
    ("correlation too short", ("correlation_id",), "abc", "payload.correlation_id"),
    ("correlation too long", ("correlation_id",), "a" * 129, "payload.correlation_id"),
    ("correlation newline", ("correlation_id",), "release-v1.2.3\n", "correlation_id"),
    ("short commit", ("source", "commit"), "0123456", "payload.source.commit"),
    ("uppercase commit", ("source", "commit"), "0123456789ABCDEF0123456789abcdef01234567", "payload.source.commit"),
    ("tag with space", ("source", "tag"), "v1 2", "payload.source.tag"),
    ("oversized tag", ("source", "tag"), "v" * 129, "payload.source.tag"),
    ("tag traversal", ("source", "tag"), "v1/../../heads/main", "payload.source.tag"),
    ("tag double dot", ("source", "tag"), "v1..2", "payload.source.tag"),
    ("tag trailing slash", ("source", "tag"), "v1/", "payload.source.tag"),
    ("tag trailing dot", ("source", "tag"), "v1.", "payload.source.tag"),
    ("tag empty component", ("source", "tag"), "v1//x", "payload.source.tag"),
    ("tag dot component", ("source", "tag"), "v1/.hidden", "payload.source.tag"),
    ("tag lock", ("source", "tag"), "v1.lock", "payload.source.tag"),
    ("repository traversal", ("source", "repository"), "../../etc", "payload.source.repository"),
    ("wrong schema", ("schema",), "benchseal.dispatch/v2", "payload.schema"),
    ("extra top-level key", ("extra",), "x", "payload.extra"),
    ("extra nested key", ("source", "extra"), "x", "payload.source.extra"),
]


def _with(payload: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    target = payload
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return payload


@pytest.mark.parametrize(("case", "path", "value", "field"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_payload_rejected_naming_field(make_payload, queue_db, case, path, value, field):
    bad = _with(make_payload(), path, value)
    with pytest.raises(ValidationError) as info:
        accept_payload(bad, db=queue_db)
    assert field in info.value.field, (case, info.value.diagnostics())
    # Also rejected as bytes (the CLI path), and nothing was enqueued.
    with pytest.raises(ValidationError):
        accept_payload(json.dumps(bad).encode("ascii"), db=queue_db)
    if queue_db.exists():
        count = sqlite3.connect(queue_db).execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        assert count == 0


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        (b"[]", "JSON object"),
        (b"{", "not valid JSON"),
        (b'{"schema": NaN}', "not valid JSON"),
        ('{"schema": "benchseal.dispatch/v1", "suite": "sm\u00f6ke"}'.encode(), "ASCII"),
        (b'{"schema": "a", "schema": "b"}', "duplicate key"),
        (b"[" * 100000 + b"]" * 100000, "bytes"),
        (b" " * 20000, "bytes"),
    ],
)
def test_malformed_bytes_rejected(queue_db, raw, rule):
    with pytest.raises(ValidationError) as info:
        accept_payload(raw, db=queue_db)
    assert rule in info.value.rule


def test_schema_and_model_agree_on_valid_payload(make_payload):
    schema = json.loads(SCHEMA_PATH.read_text())
    payload = make_payload()
    jsonschema.Draft202012Validator(schema).validate(payload)
    assert DispatchPayload.model_validate(payload).correlation_id == payload["correlation_id"]
    # Every string in the schema is bounded.
    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "string":
                assert "maxLength" in node, node
            for child in node.values():
                walk(child)
    walk(schema)
    assert schema["additionalProperties"] is False
    assert schema["properties"]["source"]["additionalProperties"] is False


def test_redelivery_is_idempotent(make_payload, queue_db):
    first = accept_payload(make_payload(), db=queue_db)
    second = accept_payload(json.dumps(make_payload()).encode(), db=queue_db)
    assert first.created and not second.created
    assert first.run_id == second.run_id
    rows = sqlite3.connect(queue_db).execute("SELECT run_id, state FROM runs").fetchall()
    assert rows == [(first.run_id, "QUEUED")]
    run_json = json.loads((queue_db.parent / "runs" / first.run_id / "run.json").read_text())
    assert run_json["state"] == "QUEUED" and run_json["correlation_id"] == make_payload()["correlation_id"]


def test_same_correlation_different_payload_is_refused(make_payload, queue_db):
    accept_payload(make_payload(), db=queue_db)
    with pytest.raises(ValidationError) as info:
        accept_payload(make_payload(agent="nop"), db=queue_db)
    assert info.value.field == "payload.correlation_id"


def test_cli_accept_exit_codes(make_payload, tmp_path, queue_db):
    good = tmp_path / "payload.json"
    good.write_text(json.dumps(make_payload()))
    cmd = [sys.executable, "-m", "pipeline", "infra", "accept", "--db", str(queue_db)]
    first = subprocess.run([*cmd, "--payload", str(good), "--json"], capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert result["created"] is True
    again = subprocess.run([*cmd, "--payload", "-"], input=good.read_text(), capture_output=True, text=True, check=False)
    assert again.returncode == 0 and again.stdout.strip() == result["run_id"]
    bad = subprocess.run([*cmd, "--payload", "-"], input=json.dumps(make_payload(runner=f"{RUNNER}:latest")),
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2
    assert "payload.runner" in bad.stderr and "tags are not accepted" in bad.stderr


# --- property tests ------------------------------------------------------------

_ref_chars = st.text(alphabet=st.characters(codec="utf-8"), min_size=0, max_size=120)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=_ref_chars, where=st.sampled_from(["suffix", "prefix", "replace_digest", "replace_name"]))
def test_mutated_runner_refs_never_accepted_unless_valid(make_payload, infra_policy, mutation, where):
    valid = make_payload()["runner"]
    name, _, digest = valid.partition("@")
    mutated = {
        "suffix": valid + mutation,
        "prefix": mutation + valid,
        "replace_digest": f"{name}@{mutation}",
        "replace_name": f"{mutation}@{digest}",
    }[where]
    try:
        payload = validate_payload(make_payload(runner=mutated), infra_policy)
    except ValidationError as exc:
        assert "runner" in exc.field
        return
    # Accepted only when it is exactly an allowed runner pinned by a well-formed digest.
    assert payload.runner.startswith(RUNNER + "@sha256:")
    assert len(payload.runner) == len(RUNNER) + 8 + 64
    assert all(c in "0123456789abcdef" for c in payload.runner[-64:])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.text(min_size=1, max_size=40), value=st.one_of(st.text(max_size=40), st.integers(), st.none()))
def test_unknown_keys_always_rejected(make_payload, infra_policy, key, value):
    payload = make_payload()
    if key in payload:
        return
    payload[key] = value
    with pytest.raises(ValidationError):
        validate_payload(payload, infra_policy)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=400))
def test_arbitrary_bytes_rejected_cleanly(queue_db, raw):
    with pytest.raises(ValidationError):
        accept_payload(raw, db=queue_db)


def test_payload_file_read_is_bounded(tmp_path, make_payload, queue_db):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (10 * 1024 * 1024) + json.dumps(make_payload()).encode())
    result = subprocess.run([sys.executable, "-m", "pipeline", "infra", "accept", "--db", str(queue_db),
                             "--payload", str(big)], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "at most" in result.stderr
    assert Path(big).stat().st_size > 10 * 1024 * 1024


def test_cli_validate_checks_without_enqueueing(tmp_path: Path, make_payload) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "BENCHSEAL_HOME": str(tmp_path / "home")}
    good = json.dumps(make_payload(correlation_id="validate-only-0001"))
    cli = [sys.executable, "-m", "pipeline", "infra", "validate", "--payload", "-"]
    ok = subprocess.run(cli, input=good, capture_output=True, text=True, env=env, check=False, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "validate-only-0001"
    assert not (tmp_path / "home" / "infra" / "queue.sqlite3").exists(), "validate must not enqueue"
    bad = subprocess.run(cli, input=good.replace("@sha256:", ":latest@sha256:"), capture_output=True, text=True,
                         env=env, check=False, timeout=60)
    assert bad.returncode == 2 and "payload.api" in bad.stderr and "must not carry a tag" in bad.stderr


# --- source repositories (policy sources[]) ------------------------------------------

def _policy_file(tmp_path: Path, sources: Any, **extra: Any) -> Path:
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data["sources"] = sources
    data.update(extra)
    path = tmp_path / f"infra-{abs(hash(json.dumps(sources, sort_keys=True, default=str)))}.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


def _images(runner: str = "benchseal/runner", api: str = "benchseal/api") -> dict[str, Any]:
    return {"runner": [{"registry": "127.0.0.1:5055", "repository": runner}],
            "api": [{"registry": "127.0.0.1:5055", "repository": api}]}


HOSTILE_SOURCES = [
    ("other owner", "evil/widget"),
    ("other name", "acme/widget2"),
    ("prefix of a listed name", "acme/widge"),
    ("listed name plus suffix", "acme/widget-"),
    ("owner lookalike", "acme-/widget"),
    ("l for i", "acme/wldget"),
    ("digit for letter", "acme/w1dget"),
    ("trailing slash", "acme/widget/"),
    ("leading slash", "/acme/widget"),
    ("double slash", "acme//widget"),
    ("three parts", "acme/widget/evil"),
    ("trailing dot", "acme/widget."),
    ("dot git", "acme/widget.git"),
    ("path traversal", "acme/../widget"),
    ("dotdot name", "acme/.."),
    ("dot name", "acme/."),
    ("url", "https://github.com/acme/widget"),
    ("percent-encoded slash", "acme%2Fwidget"),
    ("backslash", "acme\\widget"),
    ("trailing newline", "acme/widget\n"),
    ("leading space", " acme/widget"),
    ("NUL", "acme/widget\x00"),
    ("cyrillic a", "\u0430cme/widget"),
    ("fullwidth a", "\uff41cme/widget"),
    ("zero-width space", "acme/wid\u200bget"),
    ("right-to-left override", "acme/\u202etegdiw"),
    ("combining mark", "acme/wi\u0307dget"),
]


@pytest.mark.parametrize(("case", "repository"), HOSTILE_SOURCES, ids=[c for c, _ in HOSTILE_SOURCES])
def test_unlisted_or_lookalike_source_repository_refused(make_payload, queue_db, case, repository):
    payload = make_payload(source={**make_payload()["source"], "repository": repository})
    for data in (payload, json.dumps(payload).encode("ascii")):  # the library and the CLI path
        with pytest.raises(ValidationError) as info:
            accept_payload(data, db=queue_db)
        assert info.value.field == "payload.source.repository", (case, info.value.diagnostics())
        assert "\n" not in info.value.diagnostics() and "\x00" not in info.value.diagnostics()
    assert not queue_db.exists() or sqlite3.connect(queue_db).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_unlisted_repository_names_the_rule(make_payload, infra_policy):
    with pytest.raises(ValidationError) as info:
        validate_payload(make_payload(source={**make_payload()["source"], "repository": "evil/widget"}), infra_policy)
    assert info.value.field == "payload.source.repository"
    assert "not allowed by the infra policy" in info.value.rule and "sources" in info.value.rule


@pytest.mark.parametrize("spelling", ["ACME/Widget", "Acme/WIDGET", "acme/widget", "LOCAL/BenchSeal"])
def test_owner_and_name_compare_case_insensitively(make_payload, infra_policy, spelling):
    # GitHub names are case-insensitive: another spelling of a listed repository is that repository.
    payload = validate_payload(make_payload(source={**make_payload()["source"], "repository": spelling}), infra_policy)
    assert infra_policy.source(payload.source.repository).canonical == spelling.lower()


def test_kelvin_sign_cannot_fold_onto_a_listed_name(tmp_path, make_payload):
    # "\u212a".lower() == "k": canonical comparison must check ASCII before folding case.
    assert "\u212a".lower() == "k"
    policy = load_policy(_policy_file(tmp_path, [{"repository": "acme/kit", "images": _images()}]))
    assert policy.source("ACME/KIT").repository == "acme/kit"
    for spoof in ("acme/\u212ait", "acme/\u212aIT", "\u212acme/kit"):
        with pytest.raises(ValidationError) as info:
            validate_payload(make_payload(source={**make_payload()["source"], "repository": spoof}), policy)
        assert info.value.field == "payload.source.repository"


def test_images_are_allowed_per_source_repository(tmp_path, make_payload):
    policy = load_policy(_policy_file(tmp_path, [
        {"repository": "acme/widget", "images": _images()},
        {"repository": "other/tool", "images": _images("other/runner", "other/api")},
    ]))
    own = make_payload()
    assert validate_payload(own, policy).source.repository == "acme/widget"
    other_runner = f"127.0.0.1:5055/other/runner@sha256:{HEX}"
    other_api = f"127.0.0.1:5055/other/api@sha256:{HEX}"
    # acme/widget may not run other/tool's images, and the reverse.
    with pytest.raises(ValidationError) as info:
        validate_payload(make_payload(runner=other_runner), policy)
    assert info.value.field == "payload.runner" and "for source acme/widget" in info.value.rule
    with pytest.raises(ValidationError) as info:
        validate_payload(make_payload(source={**own["source"], "repository": "other/tool"}), policy)
    assert info.value.field == "payload.runner" and "for source other/tool" in info.value.rule
    ok = validate_payload(make_payload(source={**own["source"], "repository": "Other/Tool"},
                                       runner=other_runner, api=other_api), policy)
    assert ok.runner == other_runner
    with pytest.raises(ValidationError) as info:
        validate_payload(make_payload(source={**own["source"], "repository": "other/tool"}, runner=other_runner),
                         policy)
    assert info.value.field == "payload.api"


def test_cli_refuses_unlisted_repository_with_exit_2(make_payload, tmp_path, queue_db):
    bad = json.dumps(make_payload(source={**make_payload()["source"], "repository": "evil/widget"}))
    for verb in (["accept", "--db", str(queue_db)], ["validate"]):
        done = subprocess.run([sys.executable, "-m", "pipeline", "infra", *verb, "--payload", "-"], input=bad,
                              capture_output=True, text=True, check=False, timeout=60)
        assert done.returncode == 2, (verb, done.stderr)
        assert "payload.source.repository" in done.stderr and "not allowed by the infra policy" in done.stderr
        assert "Traceback" not in done.stderr
    assert not queue_db.exists() or sqlite3.connect(queue_db).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


# --- the policy file itself is strictly validated ---------------------------------------

@pytest.mark.parametrize(("case", "mutate", "needle"), [
    ("unknown top-level key", lambda d: d.update(images=d["sources"][0]["images"]), "images"),
    ("unknown key in a source", lambda d: d["sources"][0].update(repo="acme/widget"), "repo"),
    ("unknown role", lambda d: d["sources"][0]["images"].update(worker=[]), "worker"),
    ("unknown key in an image", lambda d: d["sources"][0]["images"]["runner"][0].update(tag="latest"), "tag"),
    ("no sources", lambda d: d.update(sources=[]), "sources"),
    ("source without images", lambda d: d["sources"][0].pop("images"), "images"),
    ("role without images", lambda d: d["sources"][0]["images"].update(api=[]), "api"),
    ("duplicate source", lambda d: d["sources"].append(dict(d["sources"][0])), "listed twice"),
    ("duplicate source in other case",
     lambda d: d["sources"].append({**d["sources"][0], "repository": "ACME/Widget"}), "listed twice"),
    ("trailing slash", lambda d: d["sources"][0].update(repository="acme/widget/"), "owner/name"),
    ("traversal", lambda d: d["sources"][0].update(repository="acme/.."), "'..'"),
    ("kelvin sign", lambda d: d["sources"][0].update(repository="acme/\u212ait"), "ASCII"),
    ("not a list", lambda d: d.update(sources={"acme/widget": {}}), "sources"),
    ("invalid image name", lambda d: d["sources"][0]["images"]["runner"][0].update(repository="Bench/Runner"), ""),
    ("old schema", lambda d: d.update(schema="benchseal.infra-policy/v1"), "no longer accepted"),
])
def test_policy_is_strictly_validated(tmp_path, case, mutate, needle):
    data = {"schema": "benchseal.infra-policy/v2", "max_payload_bytes": 16384, "agents": ["oracle"],
            "suites": {"smoke": {"timeout_seconds": 60, "dataset": shipped_smoke()}}, "max_attempts": 1, "lease_seconds": 10,
            "infra_error_threshold_percent": 10,
            "sources": [{"repository": "acme/widget", "images": _images()}]}
    load_policy_from = tmp_path / "policy.yaml"
    load_policy_from.write_text(yaml.safe_dump(data))
    load_policy(load_policy_from)  # the unmutated policy loads
    mutate(data)
    load_policy_from.write_text(yaml.safe_dump(data, allow_unicode=True))
    with pytest.raises(ValidationError) as info:
        load_policy(load_policy_from)
    assert needle in info.value.diagnostics(), (case, info.value.diagnostics())


def test_policy_duplicate_yaml_keys_refused(tmp_path):
    text = (REPO_ROOT / "policies" / "infra.yaml").read_text()
    path = tmp_path / "dup.yaml"
    # PyYAML would silently keep the second mapping: the first (strict) list must not be replaced.
    path.write_text(text + "\nsources:\n  - repository: evil/widget\n    images: *local-images\n")
    with pytest.raises(ValidationError) as info:
        load_policy(path)
    assert "duplicate key 'sources'" in info.value.diagnostics()


# --- YAML that stands for more than it says: refused while composing, before anything expands -------

def _laughs(levels: int = 9) -> str:
    """The classic billion-laughs document: 9 levels of 9 aliases, about 10**9 strings once expanded."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, levels)]
    return "\n".join(lines) + "\n"


def _nested_aliases() -> str:
    # 20 levels deep, used 20 levels deep: each part is shallow, the expanded document is 40 deep.
    deep = "&deep " + "[" * 20 + "]" * 20
    return f"x: {deep}\ny: {'[' * 19}*deep{']' * 19}\n"


HOSTILE_YAML: list[tuple[str, str, str]] = [
    ("billion laughs", _laughs(), "expands to more than"),
    ("billion laughs as mappings",
     "a: &a {x: 1, y: 1, z: 1, w: 1, v: 1, u: 1, t: 1, s: 1, r: 1, q: 1}\n"
     + "".join(f"l{n}: &l{n} {{{', '.join(f'k{i}: *{chr(97) if n == 1 else f"l{n - 1}"}' for i in range(10))}}}\n"
               for n in range(1, 8)), "expands to more than"),
    ("wide: one list aliased many times", "l: &l [" + ", ".join(["x"] * 2000) + "]\nm: [" + ", ".join(["*l"] * 60) + "]\n",
     "expands to more than"),
    ("merge key of an alias", "base: &b {schema: benchseal.infra-policy/v2}\npolicy:\n  <<: *b\n", "merge keys"),
    ("merge key of an inline mapping", "policy:\n  <<: {schema: benchseal.infra-policy/v2}\n", "merge keys"),
    ("merge key with an explicit tag", "policy:\n  ? !!merge x\n  : {a: 1}\n", "merge keys"),
    ("merge key list", "a: &a {x: 1}\nb: &b {y: 2}\nc:\n  <<: [*a, *b]\n", "merge keys"),
    ("recursive alias", "a: &a [1, *a]\n", "recursive"),
    ("recursive mapping", "a: &a {self: *a}\n", "recursive"),
    ("deep flow nesting", "a: " + "[" * 20000 + "]" * 20000 + "\n", "nested deeper than 32"),
    ("deep block nesting", "".join(" " * i + f"k{i}:\n" for i in range(40)) + " " * 40 + "v\n", "nested deeper than 32"),
    ("deep through aliases", _nested_aliases(), "nested deeper than 32"),
    ("undefined alias", "a: *nowhere\n", "not valid YAML"),
    ("two documents", "a: 1\n---\nb: 2\n", "not valid YAML"),
    ("python tag", "a: !!python/object/apply:os.system [true]\n", "not valid YAML"),
    ("complex key", "? [a, b]\n: 1\n", "mapping keys must be scalars"),
    ("duplicate key in a nested mapping", "a: {b: 1, b: 2}\n", "duplicate key 'b'"),
]


@pytest.mark.parametrize(("case", "text", "needle"), HOSTILE_YAML, ids=[c for c, _, _ in HOSTILE_YAML])
def test_hostile_policy_yaml_is_refused_before_expansion(tmp_path, case, text, needle):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    assert len(text.encode()) <= 65536, case
    for load in (load_policy, load_verify_policy):  # both policies go through the one loader
        with pytest.raises(ValidationError) as info:
            load(path)
        message = info.value.diagnostics()
        assert needle in message and str(path) in message and "\n" not in message, (case, message)
        assert info.value.exit_code == 2


def test_billion_laughs_is_refused_quickly_by_the_cli(tmp_path):
    """628 bytes that took 10.8 s and 386 MB: exit 2, one line naming the file and the rule."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_laughs())
    start = time.perf_counter()
    with pytest.raises(ValidationError) as info:
        load_policy(bomb)
    elapsed = time.perf_counter() - start
    print(f"billion laughs ({bomb.stat().st_size} bytes) refused in {elapsed * 1000:.1f} ms")
    assert "expands to more than 100000 nodes" in info.value.diagnostics()
    env = {**os.environ, "BENCHSEAL_INFRA_POLICY": str(bomb)}
    done = subprocess.run([sys.executable, "-m", "pipeline", "infra", "validate", "--payload", "-"], input="{}",
                          capture_output=True, text=True, env=env, check=False, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bomb) in lines[0] and "expands to more than" in lines[0], done.stderr
    verify = subprocess.run([sys.executable, "-m", "pipeline", "verify", str(tmp_path), "--policy", str(bomb),
                             "--repo", "acme/widget", "--tag", "v1.0.0"],
                            capture_output=True, text=True, check=False, timeout=120)
    assert verify.returncode == 2 and "expands to more than" in verify.stderr and "Traceback" not in verify.stderr, verify.stderr


@pytest.mark.parametrize("case", ["too large", "not UTF-8", "a FIFO", "a directory", "missing"])
def test_policy_file_itself_is_bounded(tmp_path, case):
    path = tmp_path / "policy.yaml"
    if case == "too large":
        path.write_text("a: " + "x" * 70000 + "\n")
    elif case == "not UTF-8":
        path.write_bytes(b"a: \xff\xfe\n")
    elif case == "a FIFO":
        os.mkfifo(path)
    elif case == "a directory":
        path.mkdir()
    needle = {"too large": "at most 65536 bytes", "not UTF-8": "UTF-8", "a FIFO": "regular file",
              "a directory": "regular file", "missing": "does not exist"}[case]
    with pytest.raises(ValidationError) as info:
        load_policy(path)  # a FIFO must not hang the loader
    assert needle in info.value.diagnostics() and str(path) in info.value.diagnostics()


def test_ordinary_policies_with_anchors_still_load(tmp_path):
    """The shipped policies (infra.yaml shares its signer and images through anchors) load, and a policy
    as large as the model allows (1000 sources) stays under the node budget."""
    shipped = load_policy(REPO_ROOT / "policies" / "infra.yaml")
    assert shipped.sources[0].images == shipped.sources[1].images
    assert load_verify_policy(REPO_ROOT / "policies" / "verify.yaml").profiles
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    path = tmp_path / "big.yaml"
    images = "\n".join(f"  - repository: acme/w{n}\n    images: *i\n    signer: *s" for n in range(1, 1000))
    text = yaml.safe_dump({k: v for k, v in data.items() if k != "sources"})
    text += ("sources:\n  - repository: acme/w0\n    images: &i " + json.dumps(data["sources"][0]["images"])
             + "\n    signer: &s " + json.dumps(data["sources"][0].get("signer", {"workflow": "tag.yml"})) + "\n" + images + "\n")
    assert len(text.encode()) <= 65536
    path.write_text(text)
    assert len(load_policy(path).sources) == 1000


def test_shipped_policy_lists_the_demo_repositories(infra_policy):
    # release --local (no $GITHUB_REPOSITORY) and the GitHub emulator's demo repository (e2e).
    from pipeline.imaging.images import source_info

    listed = {s.canonical for s in infra_policy.sources}
    assert {"local/benchseal", "acme/widget"} <= listed
    assert "evil/widget" not in listed
    if not os.environ.get("GITHUB_REPOSITORY"):
        assert source_info().repository in listed


# --- hostile JSON: always exit 2 with one line naming the field and the rule ----------------

DEEP = b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}"
HOSTILE_JSON: list[tuple[str, bytes, str]] = [
    ("5000-digit integer", b'{"schema": ' + b"1" * 5000 + b"}", "number literal longer than"),
    ("5000-digit negative", b'{"schema": -' + b"9" * 5000 + b"}", "number literal longer than"),
    ("long float", b'{"schema": 0.' + b"1" * 5000 + b"}", "number literal longer than"),
    ("overflowing exponent", b'{"schema": 1e999}', "overflows to infinity"),
    ("NaN", b'{"schema": NaN}', "NaN"),
    ("Infinity", b'{"schema": Infinity}', "Infinity"),
    ("-Infinity", b'{"schema": -Infinity}', "Infinity"),
    ("deep nesting", DEEP, "nested deeper than"),
    ("nesting just past the bound", b'{"a":' + b"[" * 8 + b"]" * 8 + b"}", "nested deeper than 8"),
    ("duplicate key", b'{"schema": "a", "schema": "b"}', "duplicate key"),
    ("nested duplicate key", b'{"source": {"tag": "a", "tag": "b"}}', "duplicate key"),
    ("invalid UTF-8", b'{"schema": "\xff\xfe"}', "ASCII"),
    ("UTF-8 BOM", b'\xef\xbb\xbf{"schema": "benchseal.dispatch/v1"}', "byte order mark"),
    ("UTF-16 BOM", b'\xff\xfe{\x00}\x00', "byte order mark"),
    ("array", b"[]", "JSON object"),
    ("string", b'"payload"', "JSON object"),
    ("number", b"12", "JSON object"),
    ("null", b"null", "JSON object"),
    ("empty", b"", "not valid JSON"),
    ("lone surrogate key", b'{"\\ud800": 1}', "unknown key"),
    ("control characters in a key", b'{"\\u001b[31mx\\r\\n::error::forged": 1}', "unknown key"),
    ("bidi override in a value", b'{"schema": "\\u202ebenchseal"}', "required property"),
]


@pytest.mark.parametrize(("case", "raw", "rule"), HOSTILE_JSON, ids=[c for c, _, _ in HOSTILE_JSON])
def test_hostile_json_is_a_validation_error(queue_db, case, raw, rule):
    with pytest.raises(ValidationError) as info:
        accept_payload(raw, db=queue_db)
    message = info.value.diagnostics()
    assert rule in message, (case, message)
    assert message.isprintable(), (case, message)


@pytest.mark.parametrize(("case", "value"), [
    ("huge int", 10**5000),
    ("nan", float("nan")),
    ("inf", float("inf")),
    ("deep", json.loads("[" * 900 + "]" * 900)),
    ("non-string key", {1: "x"}),
    ("bytes", b"raw"),
], ids=["huge int", "nan", "inf", "deep", "non-string key", "bytes"])
def test_hostile_dict_payload_is_a_validation_error(make_payload, queue_db, case, value):
    with pytest.raises(ValidationError) as info:
        accept_payload(make_payload(extra=value), db=queue_db)
    assert info.value.diagnostics().isprintable()


@pytest.mark.parametrize(("case", "raw", "rule"), [h for h in HOSTILE_JSON if h[0] in {
    "5000-digit integer", "deep nesting", "UTF-8 BOM", "invalid UTF-8", "NaN", "array", "control characters in a key",
    "duplicate key"}], ids=lambda v: v if isinstance(v, str) and len(v) < 40 else "")
def test_cli_hostile_json_exit_2_one_line(queue_db, case, raw, rule):
    for verb in (["accept", "--db", str(queue_db)], ["validate"]):
        done = subprocess.run([sys.executable, "-m", "pipeline", "infra", *verb, "--payload", "-"], input=raw,
                              capture_output=True, check=False, timeout=60)
        err = done.stderr.decode("utf-8")
        assert done.returncode == 2, (case, verb, err)
        assert "Traceback" not in err and rule in err, (case, err)
        assert err.endswith("\n") and err.count("\n") == 1 and err[:-1].isprintable(), (case, err)
        assert err.startswith("benchseal: error: invalid payload"), err


# --- echoed keys and values are escaped in every error message --------------------------------

FORGED = "\x1b[31mred\x1b[0m\r\n::error file=x::forged\u202e\u2066\u2028\x85\x00"


def _one_clean_line(err: str) -> None:
    assert err.count("\n") == 1 and err.endswith("\n"), repr(err)
    line = err[:-1]
    assert line.isprintable(), repr(line)
    for bad in ("\x1b", "\r", "\u202e", "\u2066", "\u2028", "\x85", "\x00"):
        assert bad not in line
    assert not line.startswith("::")


def test_cli_escapes_keys_and_values_in_errors(make_payload, tmp_path, queue_db):
    unknown_key = json.dumps({**make_payload(), FORGED: 1})
    dup_key = '{"' + json.dumps(FORGED)[1:-1] + '": 1, "' + json.dumps(FORGED)[1:-1] + '": 2}'
    bad_value = json.dumps(make_payload(source={**make_payload()["source"], "tag": FORGED}))
    for payload in (unknown_key, dup_key, bad_value):
        for verb in (["accept", "--db", str(queue_db)], ["validate"]):
            done = subprocess.run([sys.executable, "-m", "pipeline", "infra", *verb, "--payload", "-"],
                                  input=payload.encode("ascii"), capture_output=True, check=False, timeout=60)
            assert done.returncode == 2
            err = done.stderr.decode("utf-8")
            _one_clean_line(err)
            assert "\\x1b[31mred" in err and "::error file=x::forged" in err  # shown, escaped, on the same line
    # A policy path is echoed too (infra validate --policy).
    done = subprocess.run([sys.executable, "-m", "pipeline", "infra", "validate", "--payload", "-",
                           "--policy", str(tmp_path / ("p\n::error::forged\x1b[2J"))],
                          input=b"{}", capture_output=True, check=False, timeout=60)
    assert done.returncode == 2
    _one_clean_line(done.stderr.decode("utf-8"))


def test_cli_escapes_in_infra_status(queue_db):
    # infra status: the run id is echoed.
    status = subprocess.run([sys.executable, "-m", "pipeline", "infra", "status", "run-" + FORGED.replace("\x00", ""), "--db", str(queue_db)],
                            capture_output=True, check=False, timeout=60)
    assert status.returncode == 2
    _one_clean_line(status.stderr.decode("utf-8"))


def test_error_hierarchy_escapes_every_message():
    from pipeline.core.errors import CheckFailed, Error, UsageError, escape_text

    hostile = "a\nb\rc\td\x1be\x7ff\x85g\u200bh\u202ei\u2066j\u2028k\u2029l\ufeffm\ud800n\U000e0001o"
    escaped = escape_text(hostile)
    assert escaped.isprintable() and escape_text(escaped) == escaped
    assert escaped == ("a\\x0ab\\x0dc\\x09d\\x1be\\x7ff\\x85g\\u200bh\\u202ei\\u2066j\\u2028k\\u2029l\\ufeffm"
                       "\\ud800n\\U000e0001o")
    assert escape_text("plain ascii, unicode caf\u00e9 ok") == "plain ascii, unicode caf\u00e9 ok"

    class Custom(CheckFailed):  # a subclass with its own diagnostics (as other stages define)
        def diagnostics(self) -> str:
            return f"custom: {self.args[0]}"

    for exc in (Error(hostile), UsageError(hostile), CheckFailed(hostile), Custom(hostile),
                ValidationError(f"payload.{hostile}", f"rule {hostile}", hostile)):
        assert exc.diagnostics().isprintable() and str(exc).isprintable(), type(exc)
    assert Custom(hostile).diagnostics().startswith("custom: a\\x0ab")
    assert ValidationError("f", "r", 10**5000).diagnostics().isprintable()  # repr of a huge int cannot fail


@pytest.mark.parametrize("repository", ["ACME/Unlisted", "not a repository"])
def test_a_source_refusal_names_the_field_the_rule_and_the_repository(repository: str) -> None:
    # Mutation testing (issue 39.3): the refusal's one line keeps its field, its rule and what was given.
    with pytest.raises(ValidationError) as caught:
        load_policy().source(repository)
    assert (caught.value.field, caught.value.value) == ("payload.source.repository", repository)
    assert caught.value.rule.startswith(("repository is not allowed by the infra policy (not listed in "
                                         "policies/infra.yaml sources; owner/name compared case-insensitively)",
                                         "must be OWNER/NAME, a GitHub owner/name"))


def test_an_image_name_is_checked_against_every_source_without_a_repository() -> None:
    policy = load_policy()
    allowed = [f"{i.registry}/{i.repository}" for s in policy.sources for i in s.images.runner]
    policy.check_name("runner", allowed[-1])  # allowed for some listed source: no repository needed
    with pytest.raises(ValidationError) as caught:
        policy.check_name("runner", "127.0.0.1:1/evil/runner", "f")
    assert (caught.value.field, caught.value.value) == ("f", "127.0.0.1:1/evil/runner")
    assert caught.value.rule == ("image '127.0.0.1:1/evil/runner' is not an allowed runner image (allowed: "
                                 f"{', '.join(dict.fromkeys(allowed))})")


def test_a_suite_outside_the_policy_is_refused_naming_the_suites() -> None:
    policy = load_policy()
    assert policy.dataset("smoke") == policy.suites["smoke"].dataset
    with pytest.raises(ValidationError) as caught:
        policy.dataset("ghost")
    assert (caught.value.field, caught.value.value) == ("payload.suite", "ghost")
    assert caught.value.rule == f"suite not in the infra policy (suites: {', '.join(sorted(policy.suites))})"


def test_the_infra_error_threshold_is_a_strict_percentage_and_no_trial_exceeds_it() -> None:
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text(encoding="utf-8"))
    policy = InfraPolicy.model_validate({**data, "infra_error_threshold_percent": 25})
    assert not policy.infra_errors_exceed_threshold(1, 4)  # 25 % is the threshold, not over it
    assert policy.infra_errors_exceed_threshold(2, 4)
    assert not policy.infra_errors_exceed_threshold(0, 1)
    assert policy.infra_errors_exceed_threshold(0, 0)  # a run with no trial never passes as healthy


@pytest.mark.parametrize("ref", ["refs/heads/a..b", "refs/tags/x//y", "refs/heads/x/", "refs/heads/x.",
                                 "refs/tags/v1.lock", "refs/pull/1/merge", "main"])
def test_a_signer_ref_is_tag_or_one_exact_ref(ref: str) -> None:
    with pytest.raises(PydanticValidationError) as caught:
        SignerPolicy(ref=ref)
    if ref.startswith("refs/") and "/pull/" not in ref:  # the pattern admits it: the rule's own check names itself
        assert ("must be 'tag' or one exact refs/heads/NAME or refs/tags/NAME (no '..', '//', and not ending in "
                "'/', '.' or '.lock')") in str(caught.value)


@pytest.mark.parametrize("ref", ["tag", "refs/heads/main", "refs/tags/v1.2.3", "refs/heads/release/v1"])
def test_exact_signer_refs_pass(ref: str) -> None:
    assert SignerPolicy(ref=ref).ref == ref


# --- second mutation run (2026-12-07): the refusals list every allowed image and suite (the shipped policy
# has one of some, where a join of one item cannot tell its separator).

REGISTRY = "127.0.0.1:5055"


def _policy_with(**changes: Any) -> InfraPolicy:
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text(encoding="utf-8"))
    data.update(copy.deepcopy(changes))
    return InfraPolicy.model_validate(data)


def _source_entry(repository: str, *runners: str) -> dict[str, Any]:
    return {"repository": repository,
            "images": {"runner": [{"registry": REGISTRY, "repository": r} for r in runners],
                       "api": [{"registry": REGISTRY, "repository": "benchseal/api"}]}}


def test_an_image_refusal_names_every_allowed_image_once() -> None:
    policy = _policy_with(sources=[_source_entry("acme/one", "a/runner", "b/runner"), _source_entry("acme/two", "b/runner", "c/runner")])
    with pytest.raises(ValidationError) as caught:
        policy.check_name("runner", f"{REGISTRY}/evil/runner", "payload.runner")
    assert (caught.value.field, caught.value.value) == ("payload.runner", f"{REGISTRY}/evil/runner")
    assert caught.value.rule == (f"image '{REGISTRY}/evil/runner' is not an allowed runner image (allowed: "
                                 f"{REGISTRY}/a/runner, {REGISTRY}/b/runner, {REGISTRY}/c/runner)")
    # For one source: only that source's images, and the refusal says whose list it is.
    with pytest.raises(ValidationError) as caught:
        policy.check_name("runner", f"{REGISTRY}/c/runner", repository="acme/one")
    assert caught.value.rule == (f"image '{REGISTRY}/c/runner' is not an allowed runner image for source acme/one "
                                 f"(allowed: {REGISTRY}/a/runner, {REGISTRY}/b/runner)")


def test_a_suite_refusal_names_every_suite_in_order() -> None:
    shipped = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text(encoding="utf-8"))["suites"]
    smoke = shipped["smoke"]
    policy = _policy_with(suites={"zeta": smoke, "alpha": smoke})
    with pytest.raises(ValidationError) as caught:
        policy.dataset("smoke")
    assert (caught.value.field, caught.value.value) == ("payload.suite", "smoke")
    assert caught.value.rule == "suite not in the infra policy (suites: alpha, zeta)"


# --- the payload parser's bounds, at their exact limits, each refusal naming the field, the rule and the value:
# the hostile-JSON tests above look for the rule's words only (second mutation run, 2026-12-07).

def _parse_refusal(raw: bytes, max_bytes: int = 65536) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        parse_payload_bytes(raw, max_bytes)
    return caught.value


def test_a_number_literal_is_bounded_at_exactly_its_limit() -> None:
    n = MAX_NUMBER_CHARS
    assert parse_payload_bytes(b'{"a": -' + b"1" * (n - 1) + b"}", 256) == {"a": -int("1" * (n - 1))}
    assert parse_payload_bytes(b'{"a": 0.' + b"5" * (n - 2) + b"}", 256) == {"a": float("0." + "5" * (n - 2))}
    for literal in ("-" + "1" * n, "0." + "5" * (n - 1)):
        refused = _parse_refusal(b'{"a": ' + literal.encode() + b"}")
        assert (refused.field, refused.rule, refused.value) == (
            "payload", f"number literal longer than {n} characters", literal[:20] + "...")


@pytest.mark.parametrize("literal", ["1e999", "-1e999"])
def test_a_number_that_overflows_is_refused_as_infinity(literal: str) -> None:
    refused = _parse_refusal(b'{"a": ' + literal.encode() + b"}")
    assert (refused.field, refused.rule, refused.value) == (
        "payload", "number literal out of range (overflows to infinity)", literal)


@pytest.mark.parametrize("name", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals_are_refused_by_name(name: str) -> None:
    refused = _parse_refusal(b'{"a": ' + name.encode() + b"}")
    assert (refused.field, refused.rule) == ("payload", f"{name} is not valid JSON (NaN and Infinity literals are refused)")


def test_the_payload_size_bound_is_exact() -> None:
    raw = b'{"a": "' + b"x" * 20 + b'"}'
    assert parse_payload_bytes(raw, len(raw)) == {"a": "x" * 20}
    refused = _parse_refusal(raw, len(raw) - 1)
    assert (refused.field, refused.rule) == ("payload", f"must be at most {len(raw) - 1} bytes (got {len(raw)})")


@pytest.mark.parametrize(("raw", "rule"), [
    (b"\xef\xbb\xbf{}", "must be ASCII JSON without a byte order mark (starts with a UTF-8 BOM)"),
    (b"\xff\xfe{\x00}\x00", "must be ASCII JSON without a byte order mark (starts with a UTF-16 BOM)"),
    (b"\xfe\xff\x00{\x00}", "must be ASCII JSON without a byte order mark (starts with a UTF-16 BOM)"),
    (b'{"a": "\xc3\xa9"}', "must be ASCII JSON (non-ASCII byte at offset 7)"),
    (b'{"a": "\x7f\xc3"}', "must be ASCII JSON (non-ASCII byte at offset 8)"),  # DEL (0x7f) is ASCII
    (b'{"a": }', "not valid JSON: Expecting value at line 1 column 7"),
    (b'{"a": 1,\n"a": 2}', "duplicate key (each key may appear once per object)"),
])
def test_bytes_that_are_not_plain_json_are_refused_saying_where(raw: bytes, rule: str) -> None:
    refused = _parse_refusal(raw)
    assert refused.rule == rule
    assert refused.field == ("payload.a" if b'"a": 2' in raw else "payload")


def test_nesting_is_bounded_at_exactly_its_depth_and_names_where() -> None:
    inner = b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1)
    assert parse_payload_bytes(b'{"a":' + inner + b"}", 256) == {"a": json.loads(inner)}
    refused = _parse_refusal(b'{"a": [{"b": [[[[[[]]]]]]}]}')
    assert (refused.field, refused.rule) == ("payload.a[0].b[0][0][0][0][0]", f"nested deeper than {MAX_DEPTH} levels")


@pytest.mark.parametrize(("value", "where", "rule", "shown"), [
    ({1: "x"}, "payload.extra", "object keys must be strings", "int"),
    (10**MAX_NUMBER_CHARS, "payload.extra", f"integer longer than {MAX_NUMBER_CHARS} digits", None),
    (-(10**MAX_NUMBER_CHARS), "payload.extra", f"integer longer than {MAX_NUMBER_CHARS} digits", None),
    (float("nan"), "payload.extra", "NaN and Infinity are not valid JSON", None),
    ([[[[[[[[1]]]]]]]], "payload.extra[0][0][0][0][0][0][0]", f"nested deeper than {MAX_DEPTH} levels", None),
])
def test_a_dict_payload_is_held_to_the_same_shape(make_payload, value, where, rule, shown):  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as caught:
        validate_payload(make_payload(extra=value), load_policy())
    assert (caught.value.field, caught.value.rule, caught.value.value) == (where, rule, shown)


def test_the_largest_integer_within_the_bound_is_left_to_the_schema(make_payload) -> None:  # type: ignore[no-untyped-def]
    # 10**32 - 1 passes the shape check (the schema then refuses a number where a string belongs).
    with pytest.raises(ValidationError) as caught:
        validate_payload(make_payload(suite=10**MAX_NUMBER_CHARS - 1), load_policy())
    assert caught.value.field == "payload.suite" and caught.value.rule.startswith("schema rule 'type'")


def test_a_schema_refusal_inside_a_list_names_the_item(make_payload) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as caught:
        validate_payload(make_payload(tasks=["ok", 5]), load_policy())
    assert (caught.value.field, caught.value.rule, caught.value.value) == (
        "payload.tasks[1]", "schema rule 'type': 5 is not of type 'string'", 5)


def test_an_image_refusal_shows_the_whole_reference_given() -> None:
    ref = parse_ref("127.0.0.1:1/evil/runner@sha256:" + "a" * 64)
    with pytest.raises(ValidationError) as caught:
        load_policy().check_image("runner", ref)
    assert (caught.value.field, caught.value.value) == ("runner", ref.ref)
    assert caught.value.rule.startswith("image '127.0.0.1:1/evil/runner' is not an allowed runner image (allowed: ")


def test_nesting_too_deep_for_the_decoder_is_refused_as_nesting() -> None:
    # The decoder's own recursion limit is reached before the shape check sees anything.
    refused = _parse_refusal(b"[" * 100000 + b"]" * 100000, 10**7)
    assert (refused.field, refused.rule) == ("payload", f"not valid JSON: nested deeper than {MAX_DEPTH} levels")


def test_a_dict_payload_is_measured_in_utf8_bytes(make_payload) -> None:  # type: ignore[no-untyped-def]
    # 'é' is two bytes in UTF-8 (six as a \\u escape): a payload of exactly the bound passes the size check
    # (and is refused later, for its unknown key, naming that key); one byte over is refused by its size.
    policy = load_policy()
    base = len(json.dumps(make_payload(extra=""), ensure_ascii=False).encode("utf-8"))
    fits = make_payload(extra="é" * ((policy.max_payload_bytes - base) // 2))
    size = len(json.dumps(fits, ensure_ascii=False).encode("utf-8"))
    with pytest.raises(ValidationError) as caught:
        validate_payload(fits, policy)
    assert caught.value.field == "payload.extra"
    over = make_payload(extra=fits["extra"] + "x" * (policy.max_payload_bytes - size + 1))
    with pytest.raises(ValidationError) as caught:
        validate_payload(over, policy)
    assert (caught.value.field, caught.value.rule) == (
        "payload", f"must be at most {policy.max_payload_bytes} bytes (got {policy.max_payload_bytes + 1})")
