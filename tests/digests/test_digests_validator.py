"""Property tests over hostile references for pipeline.core.digests (the one validator)."""

from __future__ import annotations

import string
import sys

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from pipeline.core.digests import ImageRef, parse_ref, validate_digest, validate_name, validate_ref
from pipeline.core.errors import ValidationError

HEX = "0123456789abcdef"
hex64 = st.text(HEX, min_size=64, max_size=64)
component = st.from_regex(r"\A[a-z0-9]{1,8}(?:[._-][a-z0-9]{1,8}){0,2}\Z")
host = st.one_of(
    st.just("localhost"),
    st.builds(lambda a, b, c, d: f"{a}.{b}.{c}.{d}", *(st.integers(0, 255) for _ in range(4))),
    st.builds(lambda a, b: f"{a}.{b}", st.from_regex(r"\A[a-z][a-z0-9]{0,10}\Z"), st.sampled_from(["io", "com", "example"])),
)
port = st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}"))
name = st.builds(lambda h, p, comps: f"{h}{p}/" + "/".join(comps), host, port, st.lists(component, min_size=1, max_size=3))
good_ref = st.builds(lambda n, h: f"{n}@sha256:{h}", name, hex64)


def _rejected(value: object, check=parse_ref, field: str = "ref") -> ValidationError:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as info:
        check(value, field)
    assert info.value.field == field
    assert info.value.rule
    return info.value


@given(good_ref)
def test_valid_refs_round_trip(ref: str) -> None:
    parsed = parse_ref(ref)
    assert parsed.ref == ref == validate_ref(ref)
    assert ImageRef(parsed.name, parsed.digest) == parsed
    assert parsed.registry == ref.split("/", 1)[0]


@given(name, hex64, st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9._-]{0,20}\Z"))
def test_tags_are_rejected(n: str, h: str, tag: str) -> None:
    _rejected(f"{n}:{tag}")
    _rejected(f"{n}:{tag}@sha256:{h}")


@given(name, st.text(HEX, min_size=63, max_size=63), st.sampled_from("abcdef"), st.integers(0, 63))
def test_any_uppercase_hex_digit_is_rejected(n: str, rest: str, letter: str, i: int) -> None:
    digest = rest[:i] + letter + rest[i:]
    bad = digest[:i] + digest[i].upper() + digest[i + 1 :]
    err = _rejected(f"{n}@sha256:{bad}")
    assert "lowercase" in err.rule
    assert "lowercase" in _rejected(f"sha256:{bad}", validate_digest, "digest").rule


@given(name, st.text(HEX, min_size=0, max_size=130).filter(lambda s: len(s) != 64))
def test_wrong_lengths_are_rejected(n: str, h: str) -> None:
    _rejected(f"{n}@sha256:{h}")
    assert "64" in _rejected(f"sha256:{h}", validate_digest, "digest").rule or not h


@given(good_ref, st.sampled_from([" ", "\t", "\n", "\r", "\x0b", "\x0c", "\u00a0", "\u2028", "\u3000"]), st.data())
@example("127.0.0.1:5055/benchseal/runner@sha256:" + "a" * 64, "\n", None)
def test_whitespace_anywhere_is_rejected(ref: str, ws: str, data: st.DataObject | None) -> None:
    positions = [0, len(ref)] if data is None else [data.draw(st.integers(0, len(ref)))]
    for pos in positions:
        _rejected(ref[:pos] + ws + ref[pos:])
    _rejected(ref + "\n")  # a `$`-anchored regex would accept this one


@given(name, hex64, st.sampled_from(["sha512", "sha384", "md5", "SHA256", "sha-256", "sha256+b64", "blake3", ""]))
def test_other_algorithms_are_rejected(n: str, h: str, algorithm: str) -> None:
    _rejected(f"{n}@{algorithm}:{h}")
    _rejected(f"{algorithm}:{h}", validate_digest, "digest")


LOOKALIKES = {
    "a": "\u0430",  # Cyrillic a
    "e": "\u0435",
    "o": "\u043e",
    "c": "\u0441",
    "1": "\u0661",  # Arabic-Indic one
    "0": "\uff10",  # fullwidth zero
    ".": "\u2024",  # one dot leader
    "/": "\u2215",  # division slash
    ":": "\u02d0",
    "@": "\uff20",
}


@given(good_ref, st.data())
def test_unicode_lookalikes_are_rejected(ref: str, data: st.DataObject) -> None:
    candidates = [i for i, ch in enumerate(ref) if ch in LOOKALIKES]
    assume(candidates)
    i = data.draw(st.sampled_from(candidates))
    _rejected(ref[:i] + LOOKALIKES[ref[i]] + ref[i + 1 :])


@given(st.lists(component, min_size=1, max_size=3), hex64)
def test_missing_registry_host_is_rejected(comps: list[str], h: str) -> None:
    path = "/".join(comps)
    if len(comps) == 1 or ("." not in comps[0] and comps[0] != "localhost"):
        # Docker Hub style `library/x` or bare `x`: no explicit registry host
        _rejected(f"{path}@sha256:{h}")
    _rejected(f"/{path}@sha256:{h}")
    _rejected(f"@sha256:{h}")


@given(good_ref)
def test_uppercase_names_and_hosts_are_rejected(ref: str) -> None:
    n, sep, d = ref.partition("@")
    assume(any(c in string.ascii_lowercase for c in n))
    _rejected(n.upper() + sep + d)


@given(good_ref, st.sampled_from(["@", "@sha256:", "#", "?", "\\", "//"]))
def test_extra_separators_are_rejected(ref: str, junk: str) -> None:
    _rejected(ref + junk)


@given(st.one_of(st.none(), st.integers(), st.binary(), st.lists(st.text())))
def test_non_strings_are_rejected(value: object) -> None:
    _rejected(value)
    _rejected(value, validate_digest, "digest")
    _rejected(value, validate_name, "name")


def test_error_names_field_and_rule() -> None:
    err = _rejected("127.0.0.1:5055/benchseal/runner:latest", parse_ref, "images.runner.ref")
    assert "images.runner.ref" in err.diagnostics()
    assert "digest" in err.rule or "tag" in err.rule


def test_the_whitespace_rule_is_exactly_str_isspace() -> None:
    # The validator searches with one regex (the queue's hot path); it must refuse exactly what
    # str.isspace() calls whitespace, over every code point.
    from pipeline.core.digests import _WHITESPACE_RE

    differing = [c for c in range(sys.maxunicode + 1) if chr(c).isspace() != bool(_WHITESPACE_RE.search(chr(c)))]
    assert differing == []
    for c in (" ", "\t", "\u00a0", "\u2003", "\u3000", "\x1c"):
        with pytest.raises(ValidationError, match="whitespace"):
            validate_name(f"127.0.0.1:5055/bench{c}seal/runner")
