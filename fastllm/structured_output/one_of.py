"""``oneOf`` read as ``anyOf`` where that is proven to change nothing: its branches are pairwise
disjoint (no instance allowed by the node's own keywords matches two of them), so "exactly one"
and "at least one" accept the same documents. A backend that refuses ``oneOf`` (or reads every
one as ``anyOf``) then enforces such a schema exactly; a ``oneOf`` not proven disjoint is left
as written, for the backend to refuse.

The proof is conservative: two branches are disjoint when their types cannot meet, their
``const`` / ``enum`` values cannot, or, as objects, a property both require cannot hold a value
both allow, or one requires a property the other forbids. Local ``$ref`` are followed.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Optional

_TYPES = frozenset(("null", "boolean", "object", "array", "number", "integer", "string"))
_VALUE_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
                type(None): "null"}
_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))
_MAX_REF_DEPTH = 16


def one_of_as_any_of(schema: Any) -> Any:
    """``schema`` with every ``oneOf`` whose branches are proven pairwise disjoint renamed ``anyOf``
    (beside an ``anyOf`` already there the two are joined in an ``allOf``); all else as written."""
    return _rewrite(schema, schema)


def _rewrite(node: Any, root: Any) -> Any:
    if isinstance(node, list):
        return [_rewrite(item, root) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: value if key in _DATA_KEYWORDS else _rewrite(value, root) for key, value in node.items()}
    branches = node.get("oneOf")
    if isinstance(branches, list) and branches and all(
            disjoint(a, b, root, node) for a, b in itertools.combinations(branches, 2)):
        one_of = out.pop("oneOf")
        if "anyOf" in out:
            out["allOf"] = [*out.get("allOf", []), {"anyOf": one_of}]
        else:
            out["anyOf"] = one_of
    return out


def _resolve(node: Any, root: Any) -> Any:
    """``node`` with local ``$ref`` followed (its siblings dropped: only used to prove disjointness,
    where fewer constraints can only make the proof fail); None where it cannot be followed."""
    for _ in range(_MAX_REF_DEPTH):
        if not isinstance(node, dict) or "$ref" not in node:
            return node
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        node = root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
    return None


def _types(node: dict[str, Any]) -> Optional[set[str]]:
    """The JSON types ``node`` allows (``integer`` as its own, inside ``number``); None: any."""
    found: Optional[set[str]] = None
    declared = node.get("type")
    if isinstance(declared, str):
        declared = [declared]
    if isinstance(declared, list) and set(declared) <= _TYPES:
        found = set(declared) | ({"integer"} if "number" in declared else set())
    values = _values(node)
    if values is not None:
        value_types = {"integer" if isinstance(value, float) and value.is_integer() else
                       _VALUE_TYPES.get(type(value), "?") for value in values}
        value_types |= {"number"} if "integer" in value_types else set()
        found = value_types if found is None else found & (value_types | ({"integer"} if "number" in found else set()))
    return found


def _values(node: dict[str, Any]) -> Optional[list[Any]]:
    if "const" in node:
        return [node["const"]]
    enum = node.get("enum")
    return enum if isinstance(enum, list) else None


def _key(value: Any) -> str:
    """One text per JSON value (1 and 1.0 alike, as JSON Schema equates them)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True)


def disjoint(a: Any, b: Any, root: Any, parent: Optional[dict[str, Any]] = None, depth: int = 0) -> bool:
    """Whether no instance that ``parent``'s own keywords allow matches both ``a`` and ``b``."""
    a, b = _resolve(a, root), _resolve(b, root)
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict) or depth > _MAX_REF_DEPTH:
        return False
    within = _types(parent) if parent else None
    ta, tb = _types(a), _types(b)
    ta = ta if within is None else (within if ta is None else ta & within)
    tb = tb if within is None else (within if tb is None else tb & within)
    if ta is not None and tb is not None and not ta & tb:
        return True
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None and not {_key(v) for v in va} & {_key(v) for v in vb}:
        return True
    objects_only = ta is not None and tb is not None and ta & tb == {"object"}
    if not objects_only:
        return False
    required = set(_required(parent or {}))
    req_a, req_b = required | set(_required(a)), required | set(_required(b))
    for name in req_a & req_b:
        pa, pb = _property(a, name), _property(b, name)
        if pa is not None and pb is not None and disjoint(pa, pb, root, None, depth + 1):
            return True
    return any(_forbids(b, name) for name in req_a) or any(_forbids(a, name) for name in req_b)


def _required(node: dict[str, Any]) -> list[str]:
    required = node.get("required")
    return [name for name in required if isinstance(name, str)] if isinstance(required, list) else []


def _property(node: dict[str, Any], name: str) -> Optional[Any]:
    properties = node.get("properties")
    return properties.get(name) if isinstance(properties, dict) else None


def _forbids(node: dict[str, Any], name: str) -> bool:
    """Whether an object matching ``node`` can never hold property ``name``."""
    properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    if name in properties:
        return properties[name] is False
    return node.get("additionalProperties") is False and not node.get("patternProperties")
