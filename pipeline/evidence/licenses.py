"""Licenses as the packages declare them: DEP-5 copyright files, Python core metadata, package.json.

Nothing is inferred from license texts: a package whose metadata is not machine-readable
gets the explicit name ``unknown``. Declared names become SPDX ids where they map (the
SPDX list shipped with cyclonedx-python-lib), and stay names where they do not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.message import Message

from cyclonedx.spdx import fixup_id, is_expression

UNKNOWN = "unknown"


@dataclass(frozen=True)
class DeclaredLicense:
    """One license: an SPDX ``id``, an SPDX ``expression``, or a ``name``; ``source`` says where it was read."""

    value: str
    kind: str  # "id" | "expression" | "name"
    source: str


def is_unknown(licenses: tuple[DeclaredLicense, ...]) -> bool:
    return not licenses or all(lic.kind == "name" and lic.value == UNKNOWN for lic in licenses)


def unknown(source: str) -> tuple[DeclaredLicense, ...]:
    return (DeclaredLicense(UNKNOWN, "name", source),)


def spdx_id(value: str) -> str | None:

    found: str | None = fixup_id(value)
    return found


# DEP-5 short names that differ from SPDX ids (copyright-format 1.0, "License specification").
_DEP5_NAMES = {
    "expat": "MIT",
    "artistic": "Artistic-1.0",
    "artistic-1": "Artistic-1.0",
    "artistic-2": "Artistic-2.0",
    "apache-2": "Apache-2.0",
    "mpl-1.1": "MPL-1.1",
    "mpl-2": "MPL-2.0",
    "python-2": "Python-2.0",
    "zope-2.1": "ZPL-2.1",
    "cc0": "CC0-1.0",
    "gfdl-niv-1.3": "GFDL-1.3-no-invariants-only",
    "gfdl-niv-1.3+": "GFDL-1.3-no-invariants-or-later",
    "gfdl-niv-1.2": "GFDL-1.2-no-invariants-only",
    "gfdl-niv-1.2+": "GFDL-1.2-no-invariants-or-later",
}
_GNU = re.compile(r"\A(A?GPL|LGPL|GFDL)-(\d+(?:\.\d+)?)(\+|\.0\+)?\Z", re.IGNORECASE)
_TOKEN = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9.+_/-]*\Z")
_SPLIT = re.compile(r"\s*,\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+", re.IGNORECASE)


def dep5_token(token: str) -> DeclaredLicense | None:
    """One DEP-5 license short name as an SPDX id or a name; None when it is not a short name (free text)."""
    token = token.strip()
    if not token or len(token) > 100:
        return None
    source = "dep5"
    if " with " in token.lower():
        # "GPL-3+ with Bison exception": the exception wording is free text in DEP-5; keep the name
        return DeclaredLicense(token, "name", source) if all(_TOKEN.match(w) for w in token.split()) else None
    if not _TOKEN.match(token):
        return None
    mapped = _DEP5_NAMES.get(token.lower())
    if mapped:
        return DeclaredLicense(mapped, "id", source)
    gnu = _GNU.match(token)
    if gnu:
        family, version, plus = gnu.group(1).upper(), gnu.group(2), gnu.group(3)
        if "." not in version:
            version += ".0"
        candidate = f"{family}-{version}-{'or-later' if plus else 'only'}"
        found = spdx_id(candidate)
        if found:
            return DeclaredLicense(found, "id", source)
    found = spdx_id(token)
    return DeclaredLicense(found, "id", source) if found else DeclaredLicense(token, "name", source)


def _paragraphs(text: str) -> list[dict[str, str]]:
    paragraphs: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    key: str | None = None
    for line in text.splitlines():
        if not line.strip():
            if fields:
                paragraphs.append(fields)
            fields, key = {}, None
        elif line[0] in " \t":
            if key is not None:
                fields[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
    if fields:
        paragraphs.append(fields)
    return paragraphs


def is_dep5(text: str) -> bool:
    paragraphs = _paragraphs(text[:4096])
    first = paragraphs[0] if paragraphs else {}
    fmt = first.get("format", "")
    return "copyright-format" in fmt or "/deps/dep5" in fmt


def dep5_licenses(text: str, source: str) -> tuple[DeclaredLicense, ...] | None:
    """The license short names of a machine-readable copyright file; None when it is not DEP-5.

    Uses the header's ``License`` and every ``Files`` paragraph's ``License`` first line; stand-alone
    ``License`` paragraphs only hold texts. Free text where a short name belongs is skipped.
    """
    if not is_dep5(text):
        return None
    found: dict[tuple[str, str], DeclaredLicense] = {}
    for index, fields in enumerate(_paragraphs(text)):
        if "license" not in fields or (index > 0 and "files" not in fields):
            continue
        first_line = fields["license"].split("\n", 1)[0].strip()
        for token in _SPLIT.split(first_line):
            lic = dep5_token(token)
            if lic is not None:
                found.setdefault((lic.kind, lic.value), DeclaredLicense(lic.value, lic.kind, source))
    return tuple(sorted(found.values(), key=lambda lic: (lic.kind, lic.value)))


# Trove classifiers (the "License ::" ones in use) -> SPDX ids.
_CLASSIFIERS = {
    "License :: OSI Approved :: MIT License": "MIT",
    "License :: OSI Approved :: MIT No Attribution License (MIT-0)": "MIT-0",
    "License :: OSI Approved :: Apache Software License": "Apache-2.0",
    "License :: OSI Approved :: BSD License": None,  # which BSD is not said
    "License :: OSI Approved :: ISC License (ISCL)": "ISC",
    "License :: OSI Approved :: Python Software Foundation License": "PSF-2.0",
    "License :: OSI Approved :: Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "License :: OSI Approved :: Mozilla Public License 1.1 (MPL 1.1)": "MPL-1.1",
    "License :: OSI Approved :: GNU General Public License v2 (GPLv2)": "GPL-2.0-only",
    "License :: OSI Approved :: GNU General Public License v2 or later (GPLv2+)": "GPL-2.0-or-later",
    "License :: OSI Approved :: GNU General Public License v3 (GPLv3)": "GPL-3.0-only",
    "License :: OSI Approved :: GNU General Public License v3 or later (GPLv3+)": "GPL-3.0-or-later",
    "License :: OSI Approved :: GNU Lesser General Public License v2 (LGPLv2)": "LGPL-2.0-only",
    "License :: OSI Approved :: GNU Lesser General Public License v2 or later (LGPLv2+)": "LGPL-2.0-or-later",
    "License :: OSI Approved :: GNU Lesser General Public License v3 (LGPLv3)": "LGPL-3.0-only",
    "License :: OSI Approved :: GNU Lesser General Public License v3 or later (LGPLv3+)": "LGPL-3.0-or-later",
    "License :: OSI Approved :: GNU Affero General Public License v3": "AGPL-3.0-only",
    "License :: OSI Approved :: GNU Affero General Public License v3 or later (AGPLv3+)": "AGPL-3.0-or-later",
    "License :: OSI Approved :: The Unlicense (Unlicense)": "Unlicense",
    "License :: OSI Approved :: zlib/libpng License": "Zlib",
    "License :: OSI Approved :: Academic Free License (AFL)": None,
    "License :: OSI Approved :: Artistic License": None,
    "License :: OSI Approved :: Eclipse Public License 2.0 (EPL-2.0)": "EPL-2.0",
    "License :: OSI Approved :: Universal Permissive License (UPL)": "UPL-1.0",
    "License :: OSI Approved :: Boost Software License 1.0 (BSL-1.0)": "BSL-1.0",
    "License :: CC0 1.0 Universal (CC0 1.0) Public Domain Dedication": "CC0-1.0",
    "License :: Public Domain": None,
}


def _from_string(value: str, source: str) -> DeclaredLicense:
    """An SPDX id, else a valid SPDX expression, else the string as a name (cyclonedx's license factory rules)."""

    found = spdx_id(value)
    if found:
        return DeclaredLicense(found, "id", source)
    if is_expression(value):
        return DeclaredLicense(value, "expression", source)
    return DeclaredLicense(value, "name", source)


def python_licenses(meta: Message, source: str) -> tuple[DeclaredLicense, ...]:
    """``License-Expression``; else the ``License`` field and ``License ::`` classifiers; else unknown.

    A ``License`` field that holds a whole license text (several lines or very long) names nothing
    by itself; then only the classifiers count.
    """
    expression = (meta.get("License-Expression") or "").strip()
    if expression:
        return (_from_string(expression, f"{source}:License-Expression"),)
    results: dict[tuple[str, str], DeclaredLicense] = {}
    field = str(meta.get("License") or "").strip()
    if field and "\n" not in field and len(field) <= 100 and field.upper() not in ("UNKNOWN", "NONE"):
        lic = _from_string(field, f"{source}:License")
        results[(lic.kind, lic.value)] = lic
    classified: list[DeclaredLicense] = []
    for classifier in meta.get_all("Classifier") or []:
        text = " ".join(str(classifier).split())
        if not text.startswith("License ::") or text == "License :: OSI Approved":
            continue
        mapped = _CLASSIFIERS.get(text)
        name = text.rsplit(" :: ", 1)[-1]
        classified.append(DeclaredLicense(mapped, "id", f"{source}:Classifier") if mapped
                          else DeclaredLicense(name, "name", f"{source}:Classifier"))
    if not any(lic.kind != "name" for lic in results.values()):
        # The License field gave no SPDX id: classifiers that map replace it (names only where nothing maps).
        ids = [lic for lic in classified if lic.kind == "id"]
        if ids:
            results = {(lic.kind, lic.value): lic for lic in ids}
        elif not results:
            results = {(lic.kind, lic.value): lic for lic in classified}
    if not results:
        return unknown(source)
    return tuple(sorted(results.values(), key=lambda lic: (lic.kind, lic.value)))


def npm_licenses(manifest: dict[str, object], source: str) -> tuple[DeclaredLicense, ...]:
    """package.json ``license`` (an SPDX expression by npm's rules), or the old ``licenses`` list."""
    value = manifest.get("license")
    if isinstance(value, dict):
        value = value.get("type")
    if isinstance(value, str) and value.strip() and value.strip().upper() != "UNLICENSED":
        return (_from_string(value.strip(), f"{source}:license"),)
    old = manifest.get("licenses")
    if isinstance(old, list):
        found = [_from_string(str(item.get("type")), f"{source}:licenses") for item in old
                 if isinstance(item, dict) and isinstance(item.get("type"), str)]
        if found:
            return tuple(found)
    if isinstance(value, str) and value.strip().upper() == "UNLICENSED":
        return (DeclaredLicense("UNLICENSED", "name", f"{source}:license"),)
    return unknown(source)
