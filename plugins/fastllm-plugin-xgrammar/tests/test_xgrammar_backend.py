"""Compiling specs: clear ValueErrors for bad ones, one compile per spec, exact choices."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from fastllm import registry
from fastllm.sampling_params import GuidedDecodingParams
from fastllm_xgrammar.backend import XGrammarBackend
from fastllm_xgrammar.specs import UNESCAPED_CHAR, lengths_as_patterns

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
          "required": ["b", "a"]}


@pytest.fixture
def backend() -> XGrammarBackend:
    vocab = [chr(c) for c in range(32, 127)] + ["</s>"]
    return XGrammarBackend(xgr.TokenizerInfo(vocab, stop_token_ids=[len(vocab) - 1]))


def accepts(backend: XGrammarBackend, spec: dict, text: str) -> bool:
    """Whether ``text`` is a complete output of ``spec``."""
    matcher = backend.new_matcher(backend.compile(GuidedDecodingParams(**spec)))
    return matcher.accept_string(text) and matcher.is_completed()


@pytest.mark.parametrize("spec, message", [
    (dict(grammar='root ::= "a" |'), r"^ebnf: EBNF parser error"),
    (dict(grammar='start ::= "a"'), r"^ebnf: .*root"),
    (dict(regex="a(b"), r"^regex: .*parenthesis is not closed"),
    (dict(regex="[z-a]"), r"^regex: "),
    (dict(json={"type": "foo"}), r'^json_schema: Unsupported type "foo"'),
    (dict(json={"type": "array", "minItems": 3, "maxItems": 1}), r"^json_schema: minItems"),
    (dict(json='{"type": '), r"not valid JSON"),
])
def test_uncompilable_specs_raise_a_clean_value_error(backend, spec, message):
    with pytest.raises(ValueError, match=message) as info:
        backend.compile(GuidedDecodingParams(**spec))
    assert ".cc:" not in str(info.value)


def test_a_spec_compiles_once(backend):
    first = backend.compile(GuidedDecodingParams(json=SCHEMA))
    assert backend.compile(GuidedDecodingParams(json=SCHEMA)) is first
    assert backend.compile(GuidedDecodingParams(json=json.dumps(SCHEMA, indent=4))) is first
    assert backend.cache_info().misses == 1 and backend.cache_info().hits == 2
    reordered = dict(reversed(SCHEMA["properties"].items()))
    assert backend.compile(GuidedDecodingParams(json={**SCHEMA, "properties": reordered})) is not first


def test_schema_properties_keep_their_order(backend):
    assert accepts(backend, dict(json=SCHEMA), '{"b": 1, "a": "x"}')
    assert not accepts(backend, dict(json=SCHEMA), '{"a": "x", "b": 1}')


def test_choice_matches_exactly_its_strings(backend):
    choices = ['say "hi"', "back\\slash", "two\nlines", "é✓", "tab\there", ""]
    for choice in choices:
        assert accepts(backend, dict(choice=choices), choice)
    assert not accepts(backend, dict(choice=choices), "say")
    assert not accepts(backend, dict(choice=choices), 'say "hi"!')


def test_json_object_is_an_object_not_any_json(backend):
    assert accepts(backend, dict(json_object=True), '{"a": [1, {"b": null}], "c": "x"}')
    assert not accepts(backend, dict(json_object=True), "[1, 2]")
    assert not accepts(backend, dict(json_object=True), '"text"')


def test_length_bounds_become_patterns_where_nothing_else_constrains_the_string():
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 16},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}},
        "code": {"type": "string", "minLength": 2},
        "mail": {"type": "string", "maxLength": 30, "format": "email"},
        "id": {"type": "string", "maxLength": 4, "pattern": "^[0-9]+$"},
        "fixed": {"const": {"type": "string", "maxLength": 2}},
        "odd": {"type": "string", "minLength": 1, "maxLength": "3"},
        "crossed": {"type": "string", "minLength": 3, "maxLength": 1},
        "titled": {"type": "string", "maxLength": 2, "title": "t", "x-unknown": 1}}}
    props = lengths_as_patterns(schema)["properties"]
    char = UNESCAPED_CHAR
    assert props["name"] == {"type": "string", "pattern": f"^{char}{{1,16}}$"}
    assert props["tags"]["items"] == {"type": "string", "pattern": f"^{char}{{0,8}}$"}
    assert props["code"] == {"type": "string", "pattern": f"^{char}{{2,}}$"}
    # other constraints on the string, data, a bad bound, a keyword it cannot vouch for
    for kept in ("mail", "id", "fixed", "odd", "crossed", "titled"):
        assert props[kept] == schema["properties"][kept]


@pytest.mark.parametrize("value", ["", "a", "é漢x", "abcd", "漢字漢字", "a\"b", "a\tb", "ok\u0001"])
def test_a_length_bound_admits_what_json_schema_admits(backend, value):
    """Lengths count code points; escapes are outside what the grammar writes (as in
    xgrammar's own form), and raw control characters, which JSON forbids, are refused."""
    spec = {"type": "string", "minLength": 1, "maxLength": 3}
    text = json.dumps(value, ensure_ascii=False)
    expected = 1 <= len(value) <= 3 and not any(c in '"\\' or ord(c) < 32 for c in value)
    assert accepts(backend, dict(json=spec), text) == expected
    raw = '"' + value + '"'  # unescaped: a valid string only without quotes or control characters
    assert accepts(backend, dict(json=spec), raw) == expected


def test_registered_under_its_distribution():
    entry = registry.entries("structured_output_backends")["xgrammar"]
    assert entry.distribution.startswith("fastllm-plugin-xgrammar ")
