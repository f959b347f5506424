"""Guided decoding end to end on SmolLM2 (CPU): every kind of spec in one batched generate
call, uncompilable specs failing alone with a 400 while the rest of the batch finishes."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from fastllm import LLM, SamplingParams
from fastllm.model_loader.resolve import embedded_model_path
from fastllm.outputs import RequestOutput
from guided_json_schemas import SCHEMAS

REGEX = r"\d{3}-\d{4}"
CHOICES = ["Paris", "London", "Berlin", "Madrid"]
BAD_SPECS = {
    "bad_ebnf": {"grammar": 'root ::= "a" |'},
    "bad_regex": {"regex": "a(b"},
    "bad_schema": {"json": {"type": "array", "minItems": 3, "maxItems": 1}},
}


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def requests() -> dict[str, tuple[str, SamplingParams | dict]]:
    """Name -> (prompt, params); greedy unless a seed is given."""
    greedy = dict(temperature=0.0, max_tokens=120)
    batch: dict[str, tuple[str, SamplingParams | dict]] = {
        f"schema_{i}": (chat(f"{question} Answer in JSON."),
                        SamplingParams(**greedy, guided_decoding={"json": schema}))
        for i, (question, schema) in enumerate(SCHEMAS)}
    batch["json_object"] = (chat("Describe a cat as a JSON object."),
                            SamplingParams(**greedy, guided_decoding={"json_object": True}))
    batch["regex"] = (chat("What is the phone number of the office?"),
                      SamplingParams(**greedy, guided_decoding={"regex": REGEX}))
    batch["choice"] = (chat("What is the capital of France?"),
                       SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=20,
                                      guided_decoding={"choice": CHOICES}))
    batch["schema_as_dict_params"] = (chat("Describe a person as JSON."),
                                      {**greedy, "guided_decoding": {"json": json.dumps(SCHEMAS[0][1])}})
    batch["unguided"] = (chat("Tell me about the sea."), SamplingParams(temperature=0.0, max_tokens=24))
    for name, spec in BAD_SPECS.items():
        batch[name] = (chat("Hello"), SamplingParams(**greedy, guided_decoding=spec))
    return batch


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(embedded_model_path(), max_model_len=2048, num_gpu_blocks_override=256,
               structured_output_backend="xgrammar")


@pytest.fixture(scope="module")
def outputs(llm) -> dict[str, RequestOutput]:
    """All requests through one generate call."""
    batch = requests()
    results = llm.generate([prompt for prompt, _ in batch.values()], [params for _, params in batch.values()],
                           use_tqdm=False)
    return dict(zip(batch, results))


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_json_schema_outputs_validate(outputs, index):
    result = outputs[f"schema_{index}"]
    assert result.error_code == 200
    assert result.outputs.finish_reason == "stop"
    jsonschema.validate(json.loads(result.outputs.text), SCHEMAS[index][1])


def test_schema_string_in_a_dict_of_params(outputs):
    result = outputs["schema_as_dict_params"]
    assert result.outputs.finish_reason == "stop"
    jsonschema.validate(json.loads(result.outputs.text), SCHEMAS[0][1])


def test_json_object_is_an_object(outputs):
    completion = outputs["json_object"].outputs
    assert completion.finish_reason == "stop"
    assert isinstance(json.loads(completion.text), dict)


def test_regex_output_fullmatches(outputs):
    completion = outputs["regex"].outputs
    assert completion.finish_reason == "stop"
    assert re.fullmatch(REGEX, completion.text)


def test_every_sample_picks_one_choice(outputs):
    completions = outputs["choice"].completions
    assert len(completions) == 2
    for completion in completions:
        assert completion.finish_reason == "stop"
        assert completion.text in CHOICES


@pytest.mark.parametrize("name", BAD_SPECS)
def test_uncompilable_spec_fails_its_request_alone(outputs, name):
    result = outputs[name]
    assert result.finished and result.error_code == 400
    assert result.error_msg.startswith("invalid guided decoding spec: ")
    unguided = outputs["unguided"]
    assert unguided.error_code == 200 and unguided.outputs.text
    assert unguided.outputs.finish_reason in ("stop", "length")


def test_guided_output_ends_on_the_stop_token_not_in_text(llm, outputs):
    eos = llm.tokenizer.eos_token_id
    for name in ["schema_0", "regex", "json_object"]:
        completion = outputs[name].outputs
        assert completion.token_ids[-1] == eos
        assert llm.tokenizer.eos_token not in completion.text


def test_grammar_wins_over_min_tokens(llm):
    """A finished choice allows only EOS, which min_tokens bans: the grammar must win, not NaN."""
    params = SamplingParams(temperature=0.0, max_tokens=20, min_tokens=15, guided_decoding={"choice": CHOICES})
    result = llm.generate(chat("What is the capital of France?"), params, use_tqdm=False)[0]
    assert result.error_code == 200 and result.outputs.text in CHOICES
    assert result.outputs.finish_reason == "stop"
