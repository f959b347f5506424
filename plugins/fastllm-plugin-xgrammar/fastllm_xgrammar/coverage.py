"""Which JSON-schema keywords xgrammar 0.2.8 enforces as written, approximates or ignores.

Found by compiling one-keyword schemas and feeding documents that break only that keyword
(``tests/test_xgrammar_coverage.py`` keeps those probes), then checked on the maskbench test
documents of the JSONSchemaBench sample. xgrammar reads a subschema's type from ``type``, or
from ``properties`` / ``additionalProperties`` (object) or ``items`` / ``prefixItems`` (array);
a type-specific keyword in a subschema of no type at all is dropped. Beside ``enum`` / ``const``
or ``$ref`` the other keywords are dropped too. An ``allOf`` of several schemas is merged
loosely. A ``oneOf`` whose branches xgrammar cannot prove disjoint becomes ``anyOf``: only
its compiler knows, and says so in a warning, which the backend captures. A ``pattern`` is
matched on the raw characters between the quotes, so one whose character class can match a
raw quote (``[^...]``, ``"``), or that counts ``.`` past 128, may end the string early and
let the rest of the document through unchecked.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from fastllm.structured_output.coverage import Level
from fastllm_xgrammar.specs import UNESCAPED_CHAR

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
# A pattern xgrammar may let run past the string's closing quote: a class that can match a raw
# quote (negated, or naming one) or a '.' counted past 128 (only its own rewrite's class is safe).
_LEAKY_PATTERN = re.compile(r'\[\^|"|\.\{\d*,?\d{3,}\}')
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
    if keyword == "pattern" and isinstance(node[keyword], str) and _LEAKY_PATTERN.search(
            node[keyword].replace(UNESCAPED_CHAR, "")):
        return "approximated"
    return None
