"""The one YAML loader of benchseal (the infra policy, the verify policy): bounded before anything expands.

YAML aliases let a 628-byte document stand for a billion nodes ("billion laughs"): PyYAML
composes it as a small graph of shared nodes, and whoever walks the result (the constructor's
duplicate-key check, pydantic) expands it. So the budget is enforced while composing, before
any construction: each node's expanded size (an alias counts as everything it stands for) and
expanded depth are computed bottom-up, and the document is refused as soon as one exceeds its
bound. An alias inside its own anchor (a recursive document) and merge keys (``<<``, which
rewrite a mapping behind the duplicate-key check) are refused outright; so are duplicate keys,
non-scalar keys, files that are not regular files, larger than ``max_bytes`` or not UTF-8.
Plain anchors and aliases stay usable (policies/infra.yaml shares a signer and an image list).
Every refusal is one ValidationError (exit 2) naming the file and the rule.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode

from pipeline.core.errors import ValidationError

MAX_BYTES = 65536
# Expanded nodes (scalars, sequences, mappings; an alias counts as all it stands for). The largest
# valid infra policy (1000 sources with their images and signers) is about 30 000.
MAX_NODES = 100_000
MAX_DEPTH = 32
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(yaml.YAMLError):
    def __init__(self, rule: str, mark: Any = None) -> None:
        super().__init__(rule)
        self.rule = rule
        self.mark = mark


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that bounds the expanded document while composing and refuses what is ambiguous."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        # id(node) -> (expanded size, expanded height); the nodes stay alive in the graph being composed.
        self._bounds: dict[int, tuple[int, int]] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels", mark)
        try:
            alias = self.check_event(AliasEvent)
            composed = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if composed is None:  # only at the end of the stream, which compose_node is never called for
            raise _Refused("empty node", mark)
        node: Node = composed
        if alias:
            bounds = self._bounds.get(id(node))
            if bounds is None:
                raise _Refused("an alias inside its own anchor (a recursive document) is not allowed", mark)
            size, height = bounds
        else:
            children: list[Node] = []
            if isinstance(node, SequenceNode):
                children = list(node.value)
            elif isinstance(node, MappingNode):
                for key, value in node.value:
                    if key.tag == _MERGE_TAG:
                        raise _Refused("merge keys (<<) are not allowed: write the mapping out", key.start_mark)
                    children += [key, value]
            size = 1 + sum(self._bounds[id(c)][0] for c in children)
            height = 1 + max((self._bounds[id(c)][1] for c in children), default=0)
            self._bounds[id(node)] = (size, height)
        if size > MAX_NODES:
            raise _Refused(f"expands to more than {MAX_NODES} nodes (YAML aliases standing for too much)", mark)
        # Depth as expanded: this node's place plus how deep what it stands for goes.
        if self._depth + height > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels (aliases included)", mark)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool) and key is not None:
                raise ConstructorError(None, None, "mapping keys must be scalars", key_node.start_mark)
            if key in keys:
                # PyYAML keeps the last one silently; readers disagree on which wins.
                raise ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            keys.add(key)
        return super().construct_mapping(node, deep=deep)


def _where(mark: Any) -> str:
    return "" if mark is None else f" (line {mark.line + 1}, column {mark.column + 1})"


def _read(path: Path, max_bytes: int, field: str) -> bytes:
    try:
        # O_NONBLOCK: a FIFO in the policy's place fails the regular-file check instead of hanging.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ValidationError(field, "file does not exist") from None
    except OSError as exc:
        raise ValidationError(field, f"cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValidationError(field, "must be a regular file")
    with os.fdopen(fd, "rb") as handle:
        try:
            raw = handle.read(max_bytes + 1)
        except OSError as exc:
            raise ValidationError(field, f"cannot be read ({exc.strerror})") from None
    if len(raw) > max_bytes:
        raise ValidationError(field, f"must be at most {max_bytes} bytes")
    return raw


def load_yaml(path: Path, *, what: str = "policy", max_bytes: int = MAX_BYTES) -> Any:
    """The one document in ``path``, under every bound of the module docstring."""
    return load_yaml_bytes(path, what=what, max_bytes=max_bytes)[0]


def load_yaml_bytes(path: Path, *, what: str = "policy", max_bytes: int = MAX_BYTES) -> tuple[Any, bytes]:
    """``load_yaml``, and the exact bytes it parsed (a digest of the document read, not of a second read)."""
    field = f"{what} {path}"
    raw = _read(path, max_bytes, field)
    return _parse(raw, field), raw


def _parse(raw: bytes, field: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(field, f"must be UTF-8 (invalid byte at offset {exc.start})") from None
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except _Refused as exc:
        raise ValidationError(field, f"{exc.rule}{_where(exc.mark)}") from None
    except yaml.MarkedYAMLError as exc:  # the scanner's, parser's, composer's and constructor's errors
        raise ValidationError(field, f"not valid YAML: {exc.problem}{_where(exc.problem_mark)}") from None
    except yaml.YAMLError as exc:
        raise ValidationError(field, f"not valid YAML: {exc}") from None
    except RecursionError:  # a guard: composition is depth-bounded above
        raise ValidationError(field, f"nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()
