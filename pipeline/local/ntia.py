"""NTIA minimum elements of an SBOM, measured on a CycloneDX 1.6 JSON document.

Per component: supplier, name, version, unique identifier, dependency relationship.
Per document: author of the SBOM data and timestamp. Each is reported as the share of
components that meet it (a document-level element counts for every component or none),
so a reviewer sees where an SBOM is thin instead of a single pass/fail.

Also reported (not NTIA, but what a compliance or vulnerability review reads next):
declared licenses and hashes, per package type.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pipeline.core.errors import CheckFailed

ELEMENTS = ("supplier", "name", "version", "unique_id", "dependency_relationship", "author", "timestamp")


@dataclass(frozen=True)
class NtiaReport:
    total: int
    met: dict[str, int]
    licensed: Counter[str] = field(default_factory=Counter)  # per package type: a declared license (not "unknown")
    hashed: Counter[str] = field(default_factory=Counter)  # per package type: at least one SHA-256
    by_type: Counter[str] = field(default_factory=Counter)

    def share(self, element: str) -> float:
        return self.met[element] / self.total if self.total else 0.0

    def summary(self) -> str:
        return ", ".join(f"{e} {self.share(e):.0%} ({self.met[e]}/{self.total})" for e in ELEMENTS)

    def license_share(self, types: tuple[str, ...] | None = None) -> float:
        keys = types or tuple(self.by_type)
        total = sum(self.by_type[k] for k in keys)
        return sum(self.licensed[k] for k in keys) / total if total else 0.0

    def coverage_summary(self) -> str:
        parts = [f"{kind}: {self.by_type[kind]} components, licenses {self.licensed[kind]}, hashes {self.hashed[kind]}"
                 for kind in sorted(self.by_type)]
        return "; ".join(parts) + f"; licenses on {self.license_share():.1%} of all components"


def component_type(component: dict[str, Any]) -> str:
    purl = component.get("purl")
    if isinstance(purl, str) and purl.startswith("pkg:"):
        return purl[4:].split("/", 1)[0]
    return str(component.get("type", "unknown"))


def _flatten(components: list[Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for component in components:
        if isinstance(component, dict):
            found.append(component)
            found += _flatten(component.get("components") or [])
    return found


def _has_license(component: dict[str, Any]) -> bool:
    for entry in component.get("licenses") or []:
        if not isinstance(entry, dict):
            continue
        if entry.get("expression"):
            return True
        lic = entry.get("license") or {}
        if lic.get("id") or (lic.get("name") and str(lic.get("name")).lower() != "unknown"):
            return True
    return False


def ntia_report(text: str) -> NtiaReport:
    """Measure the NTIA minimum elements of a CycloneDX JSON SBOM."""
    try:
        bom = json.loads(text)
    except ValueError as exc:
        raise CheckFailed(f"SBOM is not JSON: {exc}") from None
    if not isinstance(bom, dict):
        raise CheckFailed("SBOM is not a JSON object")
    metadata = bom.get("metadata") or {}
    components = _flatten(bom.get("components") or [])
    refs = Counter(str(c.get("bom-ref")) for c in components if c.get("bom-ref"))
    # dependency relationship: the component is a node of the graph and reachable from the image
    graph = {str(d.get("ref")): [str(x) for x in d.get("dependsOn") or []] for d in bom.get("dependencies") or []
             if isinstance(d, dict)}
    root = str((metadata.get("component") or {}).get("bom-ref", ""))
    reachable: set[str] = set()
    stack = [root]
    while stack:
        ref = stack.pop()
        if ref in reachable:
            continue
        reachable.add(ref)
        stack.extend(graph.get(ref, ()))
    author = bool(metadata.get("authors") or metadata.get("manufacturer") or metadata.get("supplier")
                  or (metadata.get("tools") or {}).get("components") or (metadata.get("tools") or {}).get("services"))
    timestamp = False
    if isinstance(metadata.get("timestamp"), str):
        try:
            datetime.fromisoformat(metadata["timestamp"].replace("Z", "+00:00"))
            timestamp = True
        except ValueError:
            timestamp = False
    met = dict.fromkeys(ELEMENTS, 0)
    licensed: Counter[str] = Counter()
    hashed: Counter[str] = Counter()
    by_type: Counter[str] = Counter()
    for component in components:
        kind = component_type(component)
        by_type[kind] += 1
        supplier = component.get("supplier") or component.get("manufacturer") or {}
        if (isinstance(supplier, dict) and supplier.get("name")) or component.get("publisher") or component.get("authors"):
            met["supplier"] += 1
        if component.get("name"):
            met["name"] += 1
        if component.get("version"):
            met["version"] += 1
        ref = str(component.get("bom-ref", ""))
        identified = bool(component.get("purl") or component.get("cpe") or component.get("swid")
                          or (kind == "file" and component.get("hashes")))
        if ref and refs[ref] == 1 and identified:
            met["unique_id"] += 1
        if ref in graph and ref in reachable:
            met["dependency_relationship"] += 1
        met["author"] += author
        met["timestamp"] += timestamp
        if _has_license(component):
            licensed[kind] += 1
        if any(h.get("alg") == "SHA-256" and h.get("content") for h in component.get("hashes") or []):
            hashed[kind] += 1
    return NtiaReport(total=len(components), met=met, licensed=licensed, hashed=hashed, by_type=by_type)
