"""The coverage table against xgrammar itself: each keyword it is said to drop or approximate
really lets a breaking document through when the request is not strict, a strict request is
refused naming the keyword and its JSON pointer, and what it is said to enforce it enforces."""

from __future__ import annotations

import pytest
import xgrammar as xgr

from fastllm.sampling_params import GuidedDecodingParams
from fastllm.structured_output.coverage import InexactSchema
from fastllm_xgrammar import backend as backend_module
from fastllm_xgrammar.backend import XGrammarBackend, compile_error
from fastllm_xgrammar.coverage import classify

INT_B = {"b": {"type": "integer"}}


@pytest.fixture(scope="module")
def backend() -> XGrammarBackend:
    vocab = [chr(c) for c in range(32, 127)] + ["</s>"]
    return XGrammarBackend(xgr.TokenizerInfo(vocab, stop_token_ids=[len(vocab) - 1]))


def accepts(backend: XGrammarBackend, schema: dict, text: str, strict: bool) -> bool:
    matcher = backend.new_matcher(backend.compile(GuidedDecodingParams(json=schema, strict=strict)))
    return matcher.accept_string(text) and matcher.is_completed()


# (schema, a document that breaks it only by the keyword, keyword, its pointer)
LOOSE = [
    ({"type": "object", "properties": {"a": {"type": "integer", "not": {"const": 1}}}}, '{"a": 1}', "not", "/properties/a"),
    ({"type": "integer", "if": {"minimum": 5}, "then": {"maximum": 6}}, "9", "if", ""),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]", "uniqueItems", ""),
    ({"type": "object", "properties": {"a": {"type": "integer"}, **INT_B}, "dependentRequired": {"a": ["b"]}},
     '{"a": 1}', "dependentRequired", ""),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "[1]", "contains", ""),
    ({"type": "object", "properties": {"a": {"anyOf": [{"required": ["x"]}, {"type": "null"}]}}}, '{"a": {}}',
     "required", "/properties/a/anyOf/0"),
    ({"minLength": 3}, '"a"', "minLength", ""),
    ({"type": "string", "enum": ["a", 1]}, "1", "type", ""),
    ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 3}, "1", "minimum", ""),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^[^x]{1,10000}$"}, **INT_B}},
     '{"a": "y", "b": "j"}', "pattern", "/properties/a"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}, '"ab"', "oneOf", ""),
]


@pytest.mark.parametrize("schema, text, keyword, pointer", LOOSE)
def test_what_it_would_not_enforce_is_refused_by_name_and_place(backend, schema, text, keyword, pointer):
    assert accepts(backend, schema, text, strict=False)  # the looser grammar really lets it through
    with pytest.raises(InexactSchema) as info:
        backend.compile(GuidedDecodingParams(json=schema))
    assert f"'{keyword}' at {pointer or '/'} (" in str(info.value)


EXACT = [
    ({"type": "integer", "multipleOf": 3}, "4"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, "{}"),
    ({"type": "object", "propertyNames": {"type": "string", "pattern": "^a+$"}}, '{"b": 1}'),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "$defs": {"n": {"type": "integer"}},
      "$ref": "#/$defs/n", "minimum": 3}, '"x"'),  # draft 7: the sibling asserts nothing
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": 3, "maxLength": 300}, **INT_B}},
     '{"a": "x", "b": "j"}'),  # the length rewrite keeps the string closed
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "1.5"),
]


@pytest.mark.parametrize("schema, text", EXACT)
def test_what_it_enforces_compiles_strictly_and_is_enforced(backend, schema, text):
    assert not accepts(backend, schema, text, strict=True)


# (pattern, a string it matches only where a raw quote or backslash counts as one of its characters);
# which are loose depends on the installed xgrammar: the classifier must say so on each version
LONG = "y" * 127
PATTERNS = [
    ("^[^x]{1,300}$", 'y", "b": "j'),  # loose on 0.2.8 only: one count past 128
    ("^.{1,129}$", 'y"y'),
    ("^[^x]{129}$", LONG + '"y'),
    ("^[^x]{129,}$", LONG + '"y'),
    ("^\\S{1,300}$", 'y"y'),
    ("^([^x]{1,2}){1,129}$", 'y"y'),
    ('^[^"]{1,300}$', "y\\q"),
    ("^[^x]{1,1000}$", 'y"y'),  # 0.2.9 enforces past 128 (at 9090 too: 160 s to compile, probed once)
    ("^[^x]{1,128}$", 'y"y'),  # enforced by both
    ("^[^x]{128}$", LONG[1:] + '"y'),
    ("^[^x]+$", 'y"y'),
    ('^[^"\\\\]{1,300}$', 'y"y'),
    ("^([a-z]{1,100}){1,100}[^x]$", 'y"'),
    ("^[^x]{1,100}y[^x]{1,100}$", 'y"yyy'),
    ("^[^x]{1,9091}$", 'y"y'),  # loose on both: past 9090 ...
    ("^([^x]{1,100}){1,91}$", 'y"y'),  # ... nested counts multiplied
    ('^a"b$', 'a"b'),  # a quote or backslash named outside a class
    ("^a\\\\q$", "a\\q"),
    ("^a\\u0022b$", 'a"b'),
]


@pytest.mark.parametrize("pattern, content", PATTERNS)
def test_a_pattern_is_called_loose_exactly_when_a_raw_quote_gets_through(backend, pattern, content):
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}, **INT_B}}
    loose = accepts(backend, schema, '{"a": "' + content + '"}', strict=False)
    assert loose == (classify(schema["properties"]["a"], "pattern") == "approximated")


def test_a_rewrite_it_cannot_compile_falls_back_to_the_schema_as_written(backend, monkeypatch):
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 2}}, "required": ["a"]}
    monkeypatch.setattr(backend_module, "lengths_as_patterns", lambda node: {"type": "no such type"})
    assert accepts(backend, schema, '{"a": "xy"}', strict=True)
    assert not accepts(backend, schema, '{"a": "xyz"}', strict=True)


def test_a_compile_error_message_is_never_empty():
    assert compile_error(RuntimeError("[10:00:00] /project/cpp/x.cc:12: Check failed: (ok) is false: ")) != ""
    assert compile_error(RuntimeError("[10:00:00] /project/cpp/x.cc:12: minItems too big")) == "minItems too big"
