"""A JSON schema rewritten, where that is proven to change nothing, into keywords a backend
without ``oneOf`` / ``not`` / ``if`` / ``dependencies`` / ``propertyNames`` (llguidance) enforces
exactly. Each rewrite accepts exactly the instances the keyword it replaces accepts; where one
cannot be proven (a complement with no form without ``not``...) the keyword is left as written,
for the backend to refuse with its reason.

A node's added constraints join its ``allOf``. Objects under unknown keywords are walked as
schemas too (``$ref`` may point into them; if they are annotations, nothing validates them). A
node beside ``$ref`` is left alone (whether siblings of ``$ref`` constrain depends on the
draft), and so is a schema whose ``$ref`` point into a keyword rewritten here (the path would
move).
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from fastllm.structured_output.coverage import SCHEMA_LIST, SCHEMA_MAP, SUBSCHEMA
from fastllm.structured_output.negation import ASSERTIONS, complement, same
from fastllm.structured_output.one_of import disjoint, resolve

_REWRITTEN = ("oneOf", "not", "if", "then", "else", "dependencies", "dependentRequired", "dependentSchemas",
              "propertyNames")
_DATA = frozenset(("const", "enum", "default", "examples"))
_INTO_REWRITTEN = re.compile(r'"\$ref":\s*"[^"]*/(?:' + "|".join(_REWRITTEN) + r')(?:/|")')


def exact_schema(schema: Any) -> Any:
    """``schema`` with every rewrite below applied where it is exact; all else as written."""
    if _INTO_REWRITTEN.search(json.dumps(schema)):
        return schema
    return _walk(schema, schema)


def _walk(node: Any, root: Any) -> Any:
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for keyword, value in node.items():
        if keyword in SUBSCHEMA and isinstance(value, dict):
            out[keyword] = _walk(value, root)
        elif keyword in SCHEMA_LIST and isinstance(value, list):
            out[keyword] = [_walk(item, root) for item in value]
        elif keyword in SCHEMA_MAP and isinstance(value, dict):
            out[keyword] = {name: _walk(item, root) for name, item in value.items()}
        elif keyword not in _DATA and isinstance(value, dict):
            out[keyword] = _walk(value, root)  # a holder of schemas under other names ($defs/a/b)
        else:
            out[keyword] = value
    if "$ref" in node:
        return out
    for rewrite in (_one_of, _not, _if_then_else, _dependencies, _property_names):
        out = rewrite(node, out, root)
    return out


def _join(out: dict[str, Any], removed: tuple[str, ...], constraints: list[Any]) -> dict[str, Any]:
    out = {key: value for key, value in out.items() if key not in removed}
    if constraints:
        out["allOf"] = [*out.get("allOf", []), *constraints]
    return out


def _one_of(node: dict[str, Any], out: dict[str, Any], root: Any) -> dict[str, Any]:
    """``oneOf: [A1..An]`` as ``anyOf`` of each ``Ai`` and the complement of every ``Aj`` not
    proven disjoint from it ("Ai matches and no other does" is the definition); a branch written
    twice alike can never be the only match, so it is dropped (its complement stays in the
    others'). The complement of ``Aj`` need only be exact within ``Ai``, as it is intersected
    with it. Pairwise disjoint branches need no complement: a plain ``anyOf``. Where two branches
    judge objects only, every non-object matches both: the ``oneOf`` then holds objects only,
    so ``type: object`` joins, and branches need only be disjoint as objects."""
    branches = node.get("oneOf")
    if not isinstance(branches, list) or not branches:
        return out
    rewritten = out["oneOf"]
    objects_only = sum(_judges_objects_only(branch, root) for branch in branches) >= 2
    context = {**node, "type": "object"} if objects_only else node
    alternatives = []
    for i, branch in enumerate(branches):
        others = [other for j, other in enumerate(branches) if j != i and not disjoint(branch, other, root, context)]
        if any(same(branch, other) for other in others):
            continue
        within = resolve(branch, root)
        within = within if isinstance(within, dict) else None
        negated = [complement(other, root, within) for other in others]
        if any(item is None for item in negated):
            return out
        if any(item is False for item in negated):
            continue  # another branch matches wherever this one does
        negated = [item for item in negated if item is not True]
        alternatives.append({"allOf": [rewritten[i], *negated]} if negated else rewritten[i])
    if not alternatives:
        alternatives = [False]
    typed = [{"type": "object"}] if objects_only else []
    if "anyOf" in out:
        return _join(out, ("oneOf",), [{"anyOf": alternatives}, *typed])
    return {**_join(out, ("oneOf",), typed), "anyOf": alternatives}


_OBJECT_KEYWORDS = frozenset(("properties", "required", "additionalProperties", "patternProperties", "minProperties",
                              "maxProperties", "dependencies", "dependentRequired", "dependentSchemas", "propertyNames",
                              "unevaluatedProperties"))


def _judges_objects_only(branch: Any, root: Any) -> bool:
    """Whether ``branch`` accepts every non-object: its only assertions are object keywords."""
    branch = resolve(branch, root)
    return branch is True or isinstance(branch, dict) and all(
        key in _OBJECT_KEYWORDS for key in branch if key in ASSERTIONS)


def _not(node: dict[str, Any], out: dict[str, Any], root: Any) -> dict[str, Any]:
    """``not: X`` as the complement of ``X`` written without ``not``."""
    if "not" not in node:
        return out
    negated = complement(node["not"], root)
    return out if negated is None else _join(out, ("not",), [negated])


def _if_then_else(node: dict[str, Any], out: dict[str, Any], root: Any) -> dict[str, Any]:
    """``if: I, then: T, else: E`` as ``anyOf: [allOf: [I, T], allOf: [not I, E]]`` (a missing
    branch is true), with ``not I`` as its complement; ``then`` / ``else`` without ``if`` assert
    nothing and are dropped. Left alone before draft 7, which knows none of the three."""
    if _names_draft(root, (3, 4, 6)):
        return out
    if "if" not in node:
        return _join(out, ("then", "else"), []) if "then" in node or "else" in node else out
    negated = complement(node["if"], root)
    if negated is None:
        return out
    then, otherwise = out.get("then", True), out.get("else", True)
    taken = {"allOf": [out["if"], then]} if then is not True else out["if"]
    skipped = {"allOf": [negated, otherwise]} if otherwise is not True else negated
    return _join(out, ("if", "then", "else"), [{"anyOf": [taken, skipped]}])


def _dependencies(node: dict[str, Any], out: dict[str, Any], root: Any) -> dict[str, Any]:
    """``dependencies`` / ``dependentRequired`` / ``dependentSchemas`` ``{a: X}``: each as
    ``anyOf: [{properties: {a: false}}, X]`` ("a absent, or X"; a list X as ``required: X``).
    Non-objects pass both: ``properties`` and ``required`` judge objects only, as the original.
    ``dependencies`` is read as drafts 4 to 7 define it in every draft (2019-09 split it in two;
    enforcing it there can only narrow); the two later keywords only from 2019-09 on."""
    constraints = []
    removed = []
    later = () if _names_draft(root, (3, 4, 6, 7)) else ("dependentRequired", "dependentSchemas")
    for keyword in ("dependencies", *later):
        value = out.get(keyword)
        if not isinstance(value, dict):
            continue
        for name, then in value.items():
            if isinstance(then, list):
                if not all(isinstance(item, str) for item in then):
                    return out
                then = {"required": then}
            elif not isinstance(then, (dict, bool)):
                return out
            constraints.append({"anyOf": [{"properties": {name: False}}, then]})
        removed.append(keyword)
    return _join(out, tuple(removed), constraints) if removed else out


def _names_draft(root: Any, drafts: tuple[int, ...]) -> bool:
    """Whether the schema's ``$schema`` names one of ``drafts`` (one that names none is read as
    the latest)."""
    declared = str(root.get("$schema", "")) if isinstance(root, dict) else ""
    return any(f"draft-0{n}" in declared for n in drafts)


def _property_names(node: dict[str, Any], out: dict[str, Any], root: Any) -> dict[str, Any]:
    """``propertyNames`` that only says names are strings (always true of JSON keys) is dropped;
    one that is a ``pattern`` on an object with no ``properties`` / ``patternProperties`` becomes
    ``patternProperties: {pattern: additionalProperties}`` with no other key allowed."""
    names = node.get("propertyNames")
    if names is None:
        return out
    if names is True or (isinstance(names, dict) and all(
            key not in ASSERTIONS or (key == "type" and names[key] == "string") for key in names)):
        return _join(out, ("propertyNames",), [])
    pattern = _only_pattern(names)
    if pattern is None or "properties" in node or "patternProperties" in node:
        return out
    rest = _join(out, ("propertyNames", "additionalProperties"), [])
    return {**rest, "patternProperties": {pattern: out.get("additionalProperties", True)},
            "additionalProperties": False}


def _only_pattern(names: Any) -> Optional[str]:
    if not isinstance(names, dict) or not isinstance(names.get("pattern"), str):
        return None
    extra = [key for key in names if key in ASSERTIONS and key != "pattern"]
    return names["pattern"] if extra in ([], ["type"]) and names.get("type", "string") == "string" else None

