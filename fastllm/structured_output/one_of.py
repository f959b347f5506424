"""Whether two ``oneOf`` branches are disjoint (no instance allowed by the node's own keywords
matches both): for such branches "exactly one" and "at least one" accept the same documents, so
``fastllm.structured_output.rewrite`` hands a backend that refuses ``oneOf`` the ``anyOf`` it equals.

The proof is conservative: two branches are disjoint when their types cannot meet, their
``const`` / ``enum`` values cannot, as strings their anchored patterns' leading characters
cannot, or, as objects, a property both require (or the node requires, itself or in every branch
of its ``anyOf``) cannot hold a value both allow, or one requires a property the other forbids.
Local ``$ref`` are followed.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

_TYPES = frozenset(("null", "boolean", "object", "array", "number", "integer", "string"))
_VALUE_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
                type(None): "null"}
_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))
_MAX_REF_DEPTH = 16


def resolve(node: Any, root: Any) -> Any:
    """``node`` with local ``$ref`` followed, its siblings dropped (a disjointness proof can only
    fail with fewer constraints; a complement checks them itself); None where it cannot be followed."""
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
    a, b = resolve(a, root), resolve(b, root)
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict) or depth > _MAX_REF_DEPTH:
        return False
    within = _types(parent) if parent else None
    ta, tb = _branch_types(a, root), _branch_types(b, root)
    ta = ta if within is None else (within if ta is None else ta & within)
    tb = tb if within is None else (within if tb is None else tb & within)
    if ta is not None and tb is not None and not ta & tb:
        return True
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None and not {_key(v) for v in va} & {_key(v) for v in vb}:
        return True
    if ta is not None and tb is not None and ta & tb == {"string"} and _prefixes_differ(a, b):
        return True
    objects_only = ta is not None and tb is not None and ta & tb == {"object"}
    if not objects_only:
        return False
    required = _always_required(parent or {}, root)
    req_a, req_b = required | set(_required(a)), required | set(_required(b))
    for name in req_a & req_b:
        pa, pb = _property(a, name), _property(b, name)
        if pa is not None and pb is not None and disjoint(pa, pb, root, None, depth + 1):
            return True
    return any(_forbids(b, name) for name in req_a) or any(_forbids(a, name) for name in req_b)


def _branch_types(node: dict[str, Any], root: Any, depth: int = 0) -> Optional[set[str]]:
    """``_types``, or for a node of no type the types its ``anyOf`` / ``oneOf`` branches allow."""
    found = _types(node)
    branches = node.get("anyOf", node.get("oneOf"))
    if found is not None or not isinstance(branches, list) or not branches or depth > _MAX_REF_DEPTH:
        return found
    union: set[str] = set()
    for branch in branches:
        branch = resolve(branch, root)
        types = _branch_types(branch, root, depth + 1) if isinstance(branch, dict) else None
        if types is None:
            return None
        union |= types
    return union


def _always_required(node: dict[str, Any], root: Any) -> set[str]:
    """The properties an object matching ``node`` has: its ``required``, and those every branch
    of its ``anyOf`` requires."""
    required = set(_required(node))
    branches = node.get("anyOf")
    if isinstance(branches, list) and branches:
        resolved = [resolve(branch, root) for branch in branches]
        if all(isinstance(branch, dict) for branch in resolved):
            required |= set.intersection(*(set(_required(branch)) for branch in resolved))
    return required


def _prefixes_differ(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two ``^``-anchored patterns need characters no string can have at one position."""
    la, lb = _leading_classes(a.get("pattern")), _leading_classes(b.get("pattern"))
    return any(not x & y for x, y in zip(la, lb))


_CLASS = re.compile(r"\[(?!\^)((?:[^\]\\]|\\[-./:~_@])+)\]")


def _leading_classes(pattern: Any) -> list[set[str]]:
    """The character sets the first characters of every string matching ``pattern`` come from,
    read while the pattern starts ``^`` then plain characters or ``[...]`` classes, each exactly
    once; empty for anything else (an alternation anywhere, so ``^`` surely anchors all)."""
    if not isinstance(pattern, str) or not pattern.startswith("^") or "|" in pattern:
        return []
    found, at = [], 1
    while at < len(pattern):
        match = _CLASS.match(pattern, at)
        if match:
            chars, at = _class_chars(match.group(1)), match.end()
        elif pattern[at].isalnum() or pattern[at] in "-_:/@~ ":
            chars, at = {pattern[at]}, at + 1
        elif pattern[at] == "\\" and at + 1 < len(pattern) and pattern[at + 1] in "./-:~_@":
            chars, at = {pattern[at + 1]}, at + 2
        else:
            break
        if chars is None or (at < len(pattern) and pattern[at] in "?*{"):
            break
        found.append(chars)
        if at < len(pattern) and pattern[at] == "+":
            break
    return found


def _class_chars(body: str) -> Optional[set[str]]:
    """The characters of a class body of plain characters and ``a-z`` ranges."""
    body = body.replace("\\", "")
    chars: set[str] = set()
    at = 0
    while at < len(body):
        if at + 2 < len(body) and body[at + 1] == "-":
            if ord(body[at + 2]) - ord(body[at]) > 256:
                return None
            chars |= {chr(code) for code in range(ord(body[at]), ord(body[at + 2]) + 1)}
            at += 3
        else:
            chars.add(body[at])
            at += 1
    return chars


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
