"""Guided decoding through the engine with the default ``auto`` backend: a schema goes to a
backend that enforces it exactly, a refusal is a 400 that names the keyword and where it is,
``strict=False`` accepts an approximation, and an unknown backend fails at start-up."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import pytest

from fastllm import SamplingParams
from fastllm.engine.llm_engine import LLMEngine
from fastllm.entrypoints.openai.protocol_chat import ChatCompletionRequest
from fastllm.registry import UnknownPluginError

pytest.importorskip("fastllm_xgrammar")
pytest.importorskip("fastllm_llguidance")

PROMPT = "<|im_start|>user\nGive a small JSON object.<|im_end|>\n<|im_start|>assistant\n"
NEITHER = {"type": "object", "properties": {"a": {"type": "integer", "if": {"minimum": 5}, "then": {"maximum": 6}}},
           "required": ["a"]}
# draft 4's boolean exclusiveMinimum: xgrammar cannot compile it, llguidance can
DRAFT4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
          "properties": {"n": {"type": "integer", "minimum": 3, "exclusiveMinimum": True, "maximum": 9}},
          "required": ["n"], "additionalProperties": False}


def run(llm, schema, **guided):
    params = SamplingParams(temperature=0.0, max_tokens=24, guided_decoding={"json": schema, **guided})
    return llm.generate([PROMPT], [params], use_tqdm=False)[0]


def test_a_schema_no_backend_enforces_is_refused_naming_keyword_and_place(smollm2_llm):
    result = run(smollm2_llm, NEITHER)
    assert result.error_code == 400
    message = result.error_msg
    assert message.startswith("invalid guided decoding spec: no backend both compiles it and enforces it exactly; xgrammar: ")
    assert "'if' at /properties/a (ignored)" in message and "llguidance: " in message
    assert "'if' at /properties/a" in message.split("llguidance: ", 1)[1]


def test_not_strict_accepts_the_approximation(smollm2_llm):
    result = run(smollm2_llm, NEITHER, strict=False)
    assert result.error_code == 200 and result.outputs.token_ids


def test_a_schema_only_the_second_backend_enforces_goes_there(smollm2_llm):
    result = run(smollm2_llm, DRAFT4)
    assert result.error_code == 200 and result.outputs.finish_reason == "stop"
    jsonschema.validate(json.loads(result.outputs.text), DRAFT4)


def test_an_unknown_backend_fails_at_start_up_with_the_list():
    engine = SimpleNamespace(config=SimpleNamespace(structured_output_backend="nope"), tokenizer=None)
    with pytest.raises(UnknownPluginError) as info:
        LLMEngine._structured_output_backend(engine)
    assert "'nope'" in str(info.value) and "auto" in str(info.value) and "llguidance" in str(info.value)


def test_openai_strict_reaches_the_spec():
    schema_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": NEITHER, "strict": False}}
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], response_format=schema_format)
    assert request.guided_decoding().strict is False
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], guided_regex="a+", guided_strict=True)
    assert request.guided_decoding().strict is True
    assert ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], guided_regex="a").guided_decoding().strict is None
