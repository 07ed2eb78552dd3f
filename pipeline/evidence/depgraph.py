"""Dependency edges between the packages found in an image, resolved to what is present.

* Debian: ``Pre-Depends`` and ``Depends``; for each clause, the first alternative that is
  installed by name, else a present package that ``Provides`` it (virtual packages).
* Python: ``Requires-Dist`` with markers evaluated for the image's interpreter; extras count
  when a present dependent asks for them (``harbor`` -> ``litellm[proxy]``).
* npm: ``dependencies`` and ``optionalDependencies``, found the way Node looks them up
  (``node_modules`` of the package, then of each parent directory).

Edges to packages that are not present are not invented: a missing dependency is reported
as missing, never mapped to something else.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement

from pipeline.core.contracts import pep503_name

_DEB_NAME = re.compile(r"\A\s*([a-z0-9][a-z0-9+.-]*)(?::([a-z0-9-]+))?")


@dataclass(frozen=True)
class DebNode:
    key: str
    name: str
    arch: str
    depends: str  # Pre-Depends and Depends, comma-joined
    provides: str


def _deb_names(field: str) -> Iterable[str]:
    for item in field.split(","):
        m = _DEB_NAME.match(item)
        if m:
            yield m.group(1)


def deb_edges(nodes: Iterable[DebNode]) -> tuple[dict[str, list[str]], list[str]]:
    """({key: [dependency keys]}, ["pkg -> clause" left unresolved])."""
    nodes = list(nodes)
    by_name: dict[str, list[DebNode]] = {}
    provided: dict[str, list[DebNode]] = {}
    for node in nodes:
        by_name.setdefault(node.name, []).append(node)
        for virtual in _deb_names(node.provides):
            provided.setdefault(virtual, []).append(node)

    def pick(candidates: list[DebNode], arch: str) -> DebNode:
        # same architecture first, then Architecture: all, then any (sorted for a stable answer)
        return sorted(candidates, key=lambda n: (n.arch != arch, n.arch != "all", n.key))[0]

    edges: dict[str, list[str]] = {}
    missing: list[str] = []
    for node in nodes:
        targets: list[str] = []
        for clause in node.depends.split(","):
            if not clause.strip():
                continue
            chosen: DebNode | None = None
            for alternative in clause.split("|"):
                m = _DEB_NAME.match(alternative)
                if not m:
                    continue
                name = m.group(1)
                if name in by_name:
                    chosen = pick(by_name[name], node.arch)
                elif name in provided:
                    chosen = pick(provided[name], node.arch)
                if chosen is not None:
                    break
            if chosen is None:
                missing.append(f"{node.key} -> {clause.strip()}")
            elif chosen.key != node.key and chosen.key not in targets:
                targets.append(chosen.key)
        edges[node.key] = sorted(targets)
    return edges, missing


@dataclass(frozen=True)
class PyNode:
    key: str
    name: str  # normalized (PEP 503)
    location: str
    requires: tuple[str, ...]
    python_version: str  # "3.13"
    python_full_version: str  # "3.13.5"




def marker_environment(python_version: str, python_full_version: str, machine: str) -> dict[str, str]:
    """PEP 508 marker variables for CPython on Linux (the image's interpreter, not the host's)."""
    return {
        "implementation_name": "cpython",
        "implementation_version": python_full_version,
        "os_name": "posix",
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": python_full_version,
        "python_version": python_version,
        "sys_platform": "linux",
    }


def python_edges(nodes: Iterable[PyNode], machine: str) -> tuple[dict[str, list[str]], list[str]]:
    """({key: [dependency keys]}, ["dist -> requirement" that applies but is not present])."""

    nodes = list(nodes)
    by_name: dict[str, list[PyNode]] = {}
    for node in nodes:
        by_name.setdefault(node.name, []).append(node)

    def find(name: str, near: PyNode) -> PyNode | None:
        candidates = by_name.get(name, [])
        if not candidates:
            return None
        # the same site directory first, then the same interpreter version
        return sorted(candidates, key=lambda n: (n.location != near.location, n.python_version != near.python_version, n.key))[0]

    parsed: dict[str, list[Requirement]] = {}
    bad: list[str] = []
    for node in nodes:
        reqs = []
        for text in node.requires:
            try:
                reqs.append(Requirement(text))
            except InvalidRequirement:
                bad.append(f"{node.key} -> {text} (not a PEP 508 requirement)")
        parsed[node.key] = reqs
    # Extras asked for by dependents, to a fixed point (an extra can pull in more extras).
    extras: dict[str, set[str]] = {node.key: set() for node in nodes}
    edges: dict[str, set[str]] = {node.key: set() for node in nodes}
    missing: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in nodes:
            env = marker_environment(node.python_version, node.python_full_version, machine)
            for req in parsed[node.key]:
                wanted = ["", *sorted(extras[node.key])]
                if req.marker is not None:
                    try:
                        applies = any(req.marker.evaluate({**env, "extra": e}) for e in wanted)
                    except Exception as exc:  # packaging raises several types for markers it cannot compare
                        bad.append(f"{node.key} -> {req} (marker not evaluable: {exc})")
                        applies = False
                    if not applies:
                        continue
                target = find(pep503_name(req.name), node)
                if target is None:
                    missing.add(f"{node.key} -> {req}")
                    continue
                if target.key != node.key:
                    edges[node.key].add(target.key)
                new = {pep503_name(e) for e in req.extras} - extras[target.key]
                if new:
                    extras[target.key] |= new
                    changed = True
    return {key: sorted(value) for key, value in edges.items()}, sorted(missing) + sorted(set(bad))


@dataclass(frozen=True)
class NpmNode:
    key: str
    name: str
    directory: str  # where its package.json is
    depends: tuple[str, ...]  # dependency names


def npm_edges(nodes: Iterable[NpmNode]) -> tuple[dict[str, list[str]], list[str]]:
    nodes = list(nodes)
    by_dir = {node.directory: node for node in nodes}
    edges: dict[str, list[str]] = {}
    missing: list[str] = []
    for node in nodes:
        targets: list[str] = []
        for dep in node.depends:
            start = node.directory
            found: NpmNode | None = None
            while True:
                candidate = by_dir.get(posixpath.join(start, "node_modules", dep) if start else f"node_modules/{dep}")
                if candidate is not None:
                    found = candidate
                    break
                if not start:
                    break
                start = posixpath.dirname(start)
            if found is None:
                missing.append(f"{node.key} -> {dep}")
            elif found.key not in targets and found.key != node.key:
                targets.append(found.key)
        edges[node.key] = sorted(targets)
    return edges, missing


def roots(components: Iterable[str], edges: Mapping[str, Iterable[str]]) -> list[str]:
    """What the image depends on directly: components nothing depends on, plus one entry per
    dependency cycle that is otherwise unreachable, so every component is reachable from the image."""
    components = sorted(set(components))
    depended = {target for targets in edges.values() for target in targets}
    result = [c for c in components if c not in depended]
    seen: set[str] = set()

    def visit(start: str) -> None:
        stack = [start]
        while stack:
            key = stack.pop()
            if key in seen:
                continue
            seen.add(key)
            stack.extend(edges.get(key, ()))

    for key in result:
        visit(key)
    for key in components:
        if key not in seen:
            result.append(key)
            visit(key)
    return result
