"""A guided-decoding request as the one llguidance grammar text that compiles it.

The text is hashable, so it doubles as the compile cache's key. JSON is written on one line
with ", " and ": " between items, exactly as the xgrammar backend writes it (no free
whitespace: small models otherwise wander into endless newlines inside an object).
"""

from __future__ import annotations

import json
from typing import Any

from llguidance import LLMatcher
from llguidance.gbnf_to_lark import gbnf_to_lark

from fastllm.sampling_params import GuidedDecodingParams
from fastllm.structured_output.rewrite import exact_schema

_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_text(params: GuidedDecodingParams, drop_formats: frozenset[str] = frozenset()) -> str:
    """Raises ValueError for what is malformed before llguidance sees it. A strict request
    (None counts as strict) never lets llguidance skip a keyword it does not implement; the
    schema's own ``x-guidance`` options cannot turn that on either. ``drop_formats``: string
    formats llguidance does not know, left out (``format`` asserts nothing by default in JSON
    Schema, so dropping it loosens nothing the schema promised). llguidance refuses every
    ``oneOf``, ``not``, ``if``, ``dependencies`` and most ``propertyNames``: each is handed to it
    rewritten where an exact rewrite is proven (``fastllm.structured_output.rewrite``)."""
    if params.json_schema is not None or params.json_object:
        schema = (exact_schema(_schema(params.json_schema)) if params.json_schema is not None
                  else {"type": "object"})
        if drop_formats:
            schema = _without_formats(schema, drop_formats)
        return LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT,
                                                  overrides={"lenient": params.strict is False,
                                                             "coerce_one_of": params.strict is False})
    if params.regex is not None:
        return LLMatcher.grammar_from_regex(params.regex)
    if params.grammar is not None:
        return LLMatcher.grammar_from_lark(lark_source(params.grammar))
    if not params.choice:
        raise ValueError("choice needs at least one string")
    # JSON string escapes are valid Lark string literals
    return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c, ensure_ascii=False)
                                                             for c in params.choice))


def lark_source(grammar: str) -> str:
    """Lark as given; a GBNF grammar (``root ::= ...``, as xgrammar and llama.cpp read it) converted."""
    if "::=" not in grammar:
        return grammar
    try:
        return gbnf_to_lark(grammar)
    except Exception as exc:  # the converter raises several kinds for a malformed grammar
        raise ValueError(f"EBNF: {exc}") from None


def _schema(schema: dict | str) -> Any:
    try:
        return json.loads(schema) if isinstance(schema, str) else schema
    except ValueError as exc:
        raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None


def _without_formats(node: Any, formats: frozenset[str]) -> Any:
    if isinstance(node, list):
        return [_without_formats(item, formats) for item in node]
    if not isinstance(node, dict):
        return node
    return {key: value if key in _DATA_KEYWORDS else _without_formats(value, formats)
            for key, value in node.items() if not (key == "format" and value in formats)}
