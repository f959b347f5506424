"""The llguidance backend on SmolLM2's vocabulary: each spec kind admits exactly its language,
refusals say what and where, and a masked row allows exactly the tokens its matcher accepts."""

from __future__ import annotations

import json

import pytest
import torch

from fastllm import registry
from fastllm.model_loader.resolve import embedded_model_path, load_tokenizer, resolve_load_format
from fastllm.sampling_params import GuidedDecodingParams


@pytest.fixture(scope="module")
def tokenizer():
    path = embedded_model_path()
    return load_tokenizer(registry.get("load_formats", resolve_load_format(path, "auto"))(), path, None)


@pytest.fixture(scope="module")
def backend(tokenizer):
    return registry.get("structured_output_backends", "llguidance")(tokenizer, 49152)


def accepts(backend, tokenizer, spec: dict, text: str) -> bool:
    """Whether ``text`` (then the stop token) passes the matcher, every token checked on the mask."""
    matcher = backend.new_matcher(backend.compile(GuidedDecodingParams(**spec)))
    for token in tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]:
        logits = torch.zeros(2, 49152)
        backend.apply_bitmask(logits, [None, matcher])
        assert not torch.isinf(logits[0]).any()  # an unguided row stays untouched
        if torch.isinf(logits[1, token]):
            return False
        backend.accept_tokens([matcher], [token])
    return True


SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string", "maxLength": 3}},
          "required": ["b", "a"]}


@pytest.mark.parametrize("spec, text, expected", [
    (dict(json=SCHEMA), '{"b": 1, "a": "xyz"}', True),
    (dict(json=SCHEMA), '{"b": 1, "a": "wxyz"}', False),
    (dict(json=SCHEMA), '{"b":1,"a":"x"}', False),  # one line, ", " and ": " as the xgrammar backend writes
    (dict(json=json.dumps(SCHEMA)), '{"b": 1, "a": "x"}', True),
    (dict(json_object=True), '{"k": [1, {"n": null}]}', True),
    (dict(json_object=True), "[1]", False),
    (dict(regex=r"20\d\d-[01]\d"), "2024-07", True),
    (dict(regex=r"20\d\d-[01]\d"), "2024-7", False),
    (dict(grammar='start: "yes" | "no" NUM\nNUM: /[0-9]+/'), "no42", True),
    (dict(grammar='root ::= "yes" | "no" [0-9]+'), "no42", True),  # GBNF, as xgrammar reads it
    (dict(grammar='root ::= "yes" | "no" [0-9]+'), "maybe", False),
    (dict(choice=['say "hi"', "back\\slash", "two\nlines"]), 'say "hi"', True),
    (dict(choice=['say "hi"', "back\\slash", "two\nlines"]), "two\nlines", True),
    (dict(choice=['say "hi"', "back\\slash"]), "say", False),
])
def test_each_kind_admits_exactly_its_language(backend, tokenizer, spec, text, expected):
    assert accepts(backend, tokenizer, spec, text) == expected


@pytest.mark.parametrize("schema, message", [
    ({"type": "object", "properties": {"a": {"type": "integer", "not": {"const": 1}}}},
     r"^json_schema: Unimplemented keys: \[\"not\"\] \('not' at /properties/a\)$"),
    ({"oneOf": [{"type": "number"}, {"type": "integer"}]}, r"^json_schema: oneOf"),  # "a non-integer" has no form
    ({"type": "foo"}, r"^json_schema: .+"),
])
def test_a_refusal_says_what_and_where(backend, schema, message):
    with pytest.raises(ValueError, match=message):
        backend.compile(GuidedDecodingParams(json=schema))


def test_not_strict_approximates_and_unknown_formats_are_annotations(backend, tokenizer):
    one_of = {"oneOf": [{"type": "number"}, {"type": "integer"}]}
    assert accepts(backend, tokenizer, dict(json=one_of, strict=False), "1")
    unknown = {"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}}
    assert accepts(backend, tokenizer, dict(json=unknown), '{"a": "x"}')
    spaced = {"type": "string", "format": "ISO 8601"}  # a format name llguidance's message ends the line with
    assert accepts(backend, tokenizer, dict(json=spaced), '"x"')


def test_a_compiled_grammar_is_shared_and_matchers_are_independent(backend, tokenizer):
    first = backend.compile(GuidedDecodingParams(regex="ab"))
    assert backend.compile(GuidedDecodingParams(regex="ab")) is first
    one, two = backend.new_matcher(first), backend.new_matcher(first)
    [ab] = tokenizer.encode("ab", add_special_tokens=False)
    assert backend.accept_tokens([one], [ab]) == [False]
    logits = torch.zeros(2, 49152)
    backend.apply_bitmask(logits, [one, two])
    assert torch.isinf(logits[0, ab]) and not torch.isinf(logits[1, ab])
    assert not torch.isinf(logits[0, tokenizer.eos_token_id]) and torch.isinf(logits[1, tokenizer.eos_token_id])
    assert backend.accept_tokens([one], [tokenizer.eos_token_id]) == [True]


def test_registered_under_its_distribution():
    entry = registry.entries("structured_output_backends")["llguidance"]
    assert entry.distribution.startswith("fastllm-plugin-llguidance ")


@pytest.mark.parametrize("spec", [dict(grammar="root ::= a\na ::= a"),
                                  dict(json={"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}})],
                         ids=["grammar", "schema"])
def test_a_grammar_that_accepts_nothing_is_refused(backend, spec):
    with pytest.raises(ValueError, match="accepts no output"):
        backend.compile(GuidedDecodingParams(**spec))
