"""The complement of a JSON schema written without ``not``: every instance the schema rejects,
and only those, for a backend that implements no ``not`` (llguidance) to enforce exactly.

A schema is the conjunction of its keywords, each of which constrains one JSON type and passes
every other; so its complement is the ``anyOf`` of each keyword's complement, each typed to the
instances the keyword judges (``required: [a]`` fails exactly the objects without ``a``:
``{"type": "object", "properties": {"a": false}}``). A keyword with no such form here (``items``:
"some item fails" needs ``contains``; ``not`` of a number, ``additionalProperties``...) makes the
whole complement None, and the caller keeps the schema as written.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from fastllm.structured_output.coverage import subschemas
from fastllm.structured_output.one_of import resolve

ALL_TYPES = ("array", "boolean", "null", "number", "object", "string")
# every keyword that can reject an instance; any other (``title``, ``format``, ``$defs``, a
# vendor's ``propertyOrder``...) asserts nothing, as validators ignore unknown keywords
ASSERTIONS = frozenset((
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength",
    "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains", "minContains", "maxProperties",
    "minProperties", "required", "dependentRequired", "dependencies", "properties", "patternProperties",
    "additionalProperties", "propertyNames", "items", "prefixItems", "additionalItems", "contains", "unevaluatedItems",
    "unevaluatedProperties", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "$ref",
    "$dynamicRef", "$recursiveRef", "disallow", "extends", "divisibleBy"))  # the last three: draft 3
_MAX_DEPTH = 8
_READS_SIBLINGS = frozenset(("additionalProperties", "items", "additionalItems", "prefixItems", "unevaluatedProperties",
                             "unevaluatedItems", "if", "then", "else", "contains", "minContains", "maxContains"))


def complement(node: Any, root: Any, within: Optional[dict[str, Any]] = None, depth: int = 0) -> Optional[Any]:
    """A schema accepting exactly what ``node`` rejects, or None. With ``within``, a keyword that
    ``within`` is proven to imply (its instances all pass it) contributes nothing: the result is then
    exact only where it is intersected with ``within``."""
    if node is True or node == {}:
        return False
    if node is False:
        return True
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return None
    if "$ref" in node:
        target = resolve(node, root)
        if target is None or any(key in ASSERTIONS for key in node if key != "$ref"):
            return None
        return complement(target, root, within, depth + 1)
    facts = _facts(within, root) if within is not None else []
    alternatives: list[Any] = []
    for keyword, value in node.items():
        if keyword not in ASSERTIONS or any(_implied(fact, node, keyword) for fact in facts):
            continue
        found = _keyword_complement(node, keyword, value, root, depth, facts)
        if found is None:
            return None
        alternatives.extend(found)
    alternatives = [alt for alt in alternatives if alt is not False]
    if not alternatives:
        return False
    return alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}


def _facts(within: dict[str, Any], root: Any) -> list[dict[str, Any]]:
    """Schemas every instance of ``within`` matches: itself and its ``allOf`` members, followed,
    with the ``required`` of them all joined in the first."""
    facts = [within] + [member for member in map(lambda m: resolve(m, root), within.get("allOf", []))
                        if isinstance(member, dict)] if isinstance(within.get("allOf"), list) else [within]
    required = {name for fact in facts for name in fact.get("required", []) if isinstance(fact.get("required"), list)}
    return [{**facts[0], "required": sorted(required)}, *facts[1:]]


def _implied(within: dict[str, Any], node: dict[str, Any], keyword: str) -> bool:
    """Whether every instance of ``within`` passes ``node``'s ``keyword`` (same value, or a
    required list it contains); keywords that read their siblings are never assumed."""
    if keyword == "required" and isinstance(node[keyword], list) and isinstance(within.get("required"), list):
        return set(node[keyword]) <= set(within["required"])
    if keyword == "properties" and isinstance(node[keyword], dict):
        return all(_property_implied(within, name, schema) for name, schema in node[keyword].items())
    if keyword in _READS_SIBLINGS:
        return False
    return keyword in within and same(within[keyword], node[keyword])  # never 1 == True


def _property_implied(within: dict[str, Any], name: str, schema: Any) -> bool:
    """Whether property ``name`` of every instance of ``within`` matches ``schema``: the same
    schema, or ``within`` never has the property."""
    properties = within.get("properties") if isinstance(within.get("properties"), dict) else {}
    if name in properties:
        return properties[name] is False or same(properties[name], schema)
    return _closed_keys(within) is not None


def _closed_keys(node: dict[str, Any]) -> Optional[set[str]]:
    """The only keys an object matching ``node`` may have; None where it is open."""
    if node.get("additionalProperties") is not False or node.get("patternProperties"):
        return None
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        return None
    return {name for name, schema in properties.items() if schema is not False}


def _keyword_complement(node: dict[str, Any], keyword: str, value: Any, root: Any, depth: int,
                        facts: list[dict[str, Any]]) -> Optional[list[Any]]:
    """The instances ``keyword`` rejects, as alternatives (where ``facts`` are given, only those
    that match them need be right); None where not expressible."""
    if keyword == "type":
        types = _type_set(value)
        if types is None:
            return None
        rest = [t for t in ALL_TYPES if t not in types]
        return [{"type": rest}] if rest else []
    if keyword == "required" and isinstance(value, list):
        return [{"type": "object", "properties": {name: False}} for name in value if isinstance(name, str)]
    if keyword == "properties" and isinstance(value, dict):
        found = []
        for name, schema in value.items():
            if any(_property_implied(fact, name, schema) for fact in facts):
                continue
            negated = complement(schema, root, None, depth + 1)
            if negated is None:
                return None
            if negated is not False:
                found.append({"type": "object", "required": [name], "properties": {name: negated}})
        return found
    if keyword == "additionalProperties" and value in (True, {}):
        return []
    if keyword == "additionalProperties" and value is False and not node.get("patternProperties"):
        # "a key it does not name" is inexpressible, but where the facts allow only named keys
        # it is "one of those it does not name"
        allowed = set(node.get("properties", {})) if isinstance(node.get("properties", {}), dict) else None
        known = [keys for keys in map(_closed_keys, facts) if keys is not None]
        if allowed is None or not known:
            return None
        return [{"type": "object", "required": [name]} for name in sorted(known[0] - allowed)]
    if keyword == "not":
        return [value] if _plain(value) else None
    if keyword in ("enum", "const"):
        return _values_complement(value if keyword == "enum" else [value])
    bounds = {"minLength": ("string", "maxLength", -1), "maxLength": ("string", "minLength", 1),
              "minItems": ("array", "maxItems", -1), "maxItems": ("array", "minItems", 1)}
    if keyword in bounds and isinstance(value, int) and not isinstance(value, bool):
        kind, other, step = bounds[keyword]
        if keyword.startswith("min") and value <= 0:
            return []
        return [{"type": kind, other: value + step}]
    if keyword == "allOf" and isinstance(value, list):
        found = []
        for item in value:
            if any(same(item, member) for fact in facts for member in fact.get("allOf", [])):
                continue  # an allOf member the facts share: no instance of theirs fails it
            negated = complement(item, root, facts[0] if facts else None, depth + 1)
            if negated is None:
                return None
            found.append(negated)
        return found
    if keyword == "anyOf" and isinstance(value, list):
        negated = [complement(item, root, None, depth + 1) for item in value]
        return None if any(item is None for item in negated) else [{"allOf": negated}]
    return None


def _plain(schema: Any) -> bool:
    """Whether ``schema`` holds no keyword the rewrites replace: it may stand as it is."""
    return not any(keyword in node for _, node in subschemas(schema) for keyword in
                   ("oneOf", "not", "if", "then", "else", "dependencies", "dependentRequired", "dependentSchemas",
                    "propertyNames"))


def _type_set(value: Any) -> Optional[set[str]]:
    """``type`` as a set of the six types its complement is written in; None where it splits
    ``number`` (``integer`` alone: the rest of the numbers have no type of their own)."""
    types = {value} if isinstance(value, str) else set(value) if isinstance(value, list) else None
    if types is None or not types <= set(ALL_TYPES) | {"integer"}:
        return None
    if "integer" in types and "number" not in types:
        return None
    return types - {"integer"}


def _values_complement(values: Any) -> Optional[list[Any]]:
    """Everything but ``values``: whole types none of them has, the other boolean, and strings
    through a pattern; None where a number, array or object is among them."""
    if not isinstance(values, list):
        return None
    strings = [v for v in values if isinstance(v, str)]
    booleans = {v for v in values if isinstance(v, bool)}
    if any(not isinstance(v, (str, bool)) and v is not None for v in values):
        return None
    present = {"string"} if strings else set()
    present |= {"boolean"} if booleans else set()
    present |= {"null"} if None in values else set()
    found: list[Any] = [{"type": [t for t in ALL_TYPES if t not in present]}]
    if len(booleans) == 1:
        found.append({"const": not next(iter(booleans))})
    if strings:
        pattern = strings_other_than(strings)
        if pattern is None:
            return None
        found.append({"type": "string", "pattern": pattern})
    return found


def strings_other_than(strings: list[str]) -> Optional[str]:
    """An anchored regular expression, without look-ahead, that matches every string except
    ``strings``: along the trie of the excluded strings, a string leaves it (an other character,
    or more after a leaf) or ends where none of them ends. None for a character outside the BMP."""
    if any(ord(ch) > 0xFFFF for text in strings for ch in text):
        return None
    trie: dict[str, Any] = {}
    for text in strings:
        node = trie
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = {}
    return f"^({_other_than(trie)})$"


def _other_than(trie: dict[str, Any]) -> str:
    chars = sorted(key for key in trie if key)
    alternatives = [] if "" in trie else [""]
    if chars:
        alternatives.append(f"[^{''.join(map(_escape, chars))}][\\s\\S]*")
        alternatives += [f"{_escape(ch)}({_other_than(trie[ch])})" for ch in chars]
    else:
        alternatives.append("[\\s\\S]+")
    return "|".join(alternatives)


def _escape(ch: str) -> str:
    """One character, literally, for both ECMA-262 and Rust regex syntax (and Python's)."""
    return ch if ch.isascii() and ch.isalnum() else f"\\u{ord(ch):04x}"


def same(a: Any, b: Any) -> bool:
    """Whether two schemas are written alike (keys in any order)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
