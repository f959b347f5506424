"""Which JSON-schema keywords xgrammar enforces as written, approximates or ignores: probed on
0.2.8 and 0.2.9, where they differ only in ``pattern`` (below); later 0.2 releases count as 0.2.9.

Found by compiling one-keyword schemas and feeding documents that break only that keyword
(``tests/test_xgrammar_coverage.py`` keeps those probes), then checked on the maskbench test
documents of the JSONSchemaBench sample. xgrammar reads a subschema's type from ``type``, or
from ``properties`` / ``additionalProperties`` (object) or ``items`` / ``prefixItems`` (array);
a type-specific keyword in a subschema of no type at all is dropped. Beside ``enum`` / ``const``
or ``$ref`` the other keywords are dropped too. An ``allOf`` of several schemas is merged
loosely. A ``oneOf`` whose branches xgrammar cannot prove disjoint becomes ``anyOf``: only
its compiler knows, and says so in a warning, which the backend captures.

A ``pattern`` runs on the characters between the quotes. xgrammar keeps a class (``.``,
``[^x]``, ``\\S``, ...) to the characters a JSON string holds as themselves, except under a
large count, where a raw quote or backslash gets through and may end the string early, letting
the rest of the document through unchecked: past 128 in one count (0.2.8 only), or past 9090
nested counts multiplied (``([^x]{1,100}){1,100}``; 0.2.8 and 0.2.9). Both match a quote or
backslash the pattern names outside a class (``a"b``, ``\\\\``, ``\\u0022``) raw in some places
(not under ``*`` or ``?``): counted loose wherever it is named.
"""

from __future__ import annotations

import re
from importlib.metadata import version
from typing import Any, Optional

from fastllm.structured_output.coverage import Level

IGNORED = frozenset(("not", "if", "then", "else", "contains", "minContains", "maxContains", "unevaluatedItems",
                     "uniqueItems", "dependentRequired", "dependentSchemas", "dependencies"))
_TYPED = {
    "string": ("minLength", "maxLength", "pattern"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "array": ("minItems", "maxItems"),
    "object": ("required", "minProperties", "maxProperties", "propertyNames", "patternProperties",
               "unevaluatedProperties"),
}
TYPED = {keyword for keywords in _TYPED.values() for keyword in keywords}
ASSERTIONS = TYPED | IGNORED | {"type", "properties", "additionalProperties", "items", "prefixItems",
                                "additionalItems", "allOf", "anyOf", "oneOf"}
# How often a class may repeat before xgrammar lets a raw quote or backslash through it: the
# product of nested counts, in every version; 0.2.8 also each single count (0.2.9 fixed that).
_NESTED_LIMIT = 9090
_XGRAMMAR = tuple(int(part) for part in re.findall(r"\d+", version("xgrammar"))[:3])
_COUNT_LIMIT = 128 if _XGRAMMAR < (0, 2, 9) else _NESTED_LIMIT
# A pattern's atoms: a class, an escape, a count ({n}, {n,}, {n,m}: its groups), or one character.
_TOKEN = re.compile(r"\[\^?\]?(?:\\.|[^\]\\])*\]|\\u[0-9A-Fa-f]{4}|\\x[0-9A-Fa-f]{2}|\\.|\{(\d+)(?:,(\d*))?\}|.", re.S)
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
               dict: "object", type(None): "null"}


def _types(node: dict[str, Any]) -> set[str]:
    """The types xgrammar reads for ``node``: its ``type``, else what its keywords imply."""
    declared = node.get("type")
    if declared is not None:
        types = set(declared) if isinstance(declared, list) else {declared}
        return types | ({"number"} if "integer" in types else set())
    if any(key in node for key in ("properties", "additionalProperties")):
        return {"object"}
    if any(key in node for key in ("items", "prefixItems")):
        return {"array"}
    return set()


def _value_types(values: list[Any]) -> set[str]:
    found = {_JSON_TYPES.get(type(value), "?") for value in values}
    return found | ({"number"} if "integer" in found else set())



def classify(node: dict[str, Any], keyword: str, ref_siblings_apply: bool = True) -> Optional[Level]:
    """``None`` where xgrammar enforces ``node[keyword]`` exactly (or it asserts nothing).
    ``ref_siblings_apply``: the schema's draft lets keywords beside ``$ref`` constrain."""
    if keyword in IGNORED:
        return "ignored"
    if keyword in ASSERTIONS and "$ref" in node:
        return "ignored" if ref_siblings_apply else None
    if keyword in ASSERTIONS and ("enum" in node or "const" in node):
        values = node.get("enum", []) if "enum" in node else [node["const"]]
        if keyword != "type" or not _value_types(values) <= _types(node):
            return "ignored"
        return None
    if keyword == "allOf" and isinstance(node[keyword], list) and len(node[keyword]) > 1:
        return "approximated"
    if keyword in TYPED and not _types(node):
        return "ignored"
    if keyword == "pattern" and isinstance(node[keyword], str) and _lets_raw_quote_through(node[keyword]):
        return "approximated"
    return None


def _matches_quote_or_backslash(atom: str) -> bool:
    """Python's regex syntax stands in for ECMA's here; an atom it cannot read is assumed to."""
    try:
        return any(re.fullmatch(atom, char) for char in '"\\')
    except re.error:
        return True


def _lets_raw_quote_through(pattern: str) -> bool:
    """Whether xgrammar may match a raw quote or backslash inside the string for ``pattern``
    (the module docstring says when). Reach: how many times a class that can match one repeats
    inside an atom, nested counts multiplied (0: no such class)."""
    groups, last = [0], 0  # the largest reach inside each open group; the last atom's reach
    for token in _TOKEN.finditer(pattern):
        text, low, high = token.group(0), token.group(1), token.group(2)
        if low is not None:
            bound = int(high or low)
            if last and bound > _COUNT_LIMIT:
                return True
            last *= bound
        elif text == "(":
            groups.append(0)
            last = 0
        elif text == ")":
            last = groups.pop() if len(groups) > 1 else 0
        elif text[0] == "[" or text == "." or text[:2] in ("\\D", "\\S", "\\W", "\\p", "\\P"):
            last = int(_matches_quote_or_backslash(text))
        elif text not in "*+?":  # a literal, an anchor or '|'
            if _matches_quote_or_backslash(text):
                return True
            last = 0
        if last > _NESTED_LIMIT:
            return True
        groups[-1] = max(groups[-1], last)
    return False
