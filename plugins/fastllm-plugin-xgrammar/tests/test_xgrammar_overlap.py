"""Grammars under async scheduling on SmolLM2 (CPU): a guided request's greedy output does not
depend on what else is in its batch or on the overlap, and grammar steps no longer drain the
pipeline (step n+1's forward pass is queued before step n's tokens are read)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from fastllm import LLM, SamplingParams
from fastllm.model_loader.resolve import embedded_model_path
from fastllm.testing.steps import StepLog
from guided_json_schemas import SCHEMAS

GUIDED = [(f"Describe item {i} in JSON.", {"json": SCHEMAS[i % len(SCHEMAS)][1]}) for i in range(3)]
GUIDED.append(("Give a date.", {"regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"}))


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def guided_params(spec: dict) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=60, guided_decoding=spec)


def unguided_params(i: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=10 + 7 * i, ignore_eos=True)


def engine(async_scheduling: bool) -> LLM:
    llm = LLM(embedded_model_path(), max_model_len=1024, num_gpu_blocks_override=128,
              async_scheduling=async_scheduling, structured_output_backend="xgrammar")
    assert llm.engine.overlap is async_scheduling
    return llm


@pytest.fixture(scope="module")
def alone() -> list[list[int]]:
    """Each guided request on its own, one step after the other: the reference."""
    llm = engine(False)
    return [llm.generate(chat(q), guided_params(spec), use_tqdm=False)[0].outputs.token_ids for q, spec in GUIDED]


@pytest.fixture(scope="module")
def overlapped() -> LLM:
    return engine(True)


def mixed_batch() -> tuple[list[str], list[SamplingParams], list[int]]:
    """Guided requests between unguided ones of staggered lengths; returns the guided positions."""
    prompts, params, guided_at = [], [], []
    for i, (question, spec) in enumerate(GUIDED):
        prompts.append(chat(f"Tell me a story about number {i}."))
        params.append(unguided_params(i))
        guided_at.append(len(prompts))
        prompts.append(chat(question))
        params.append(guided_params(spec))
    return prompts, params, guided_at


def test_guided_outputs_in_a_mixed_overlapped_batch_equal_their_runs_alone(alone, overlapped):
    prompts, params, guided_at = mixed_batch()
    outputs = overlapped.generate(prompts, params, use_tqdm=False)
    assert [outputs[i].outputs.token_ids for i in guided_at] == alone
    for i, (_, spec) in zip(guided_at, GUIDED):
        completion = outputs[i].outputs
        assert completion.finish_reason == "stop"
        if "json" in spec:
            jsonschema.validate(json.loads(completion.text), spec["json"])
    for i in range(0, len(prompts), 2):
        assert len(outputs[i].outputs.token_ids) == params[i].max_tokens


def test_all_guided_overlapped_batch_equals_runs_alone(alone, overlapped):
    outputs = overlapped.generate([chat(q) for q, _ in GUIDED], [guided_params(s) for _, s in GUIDED],
                                  use_tqdm=False)
    assert [out.outputs.token_ids for out in outputs] == alone


def test_grammar_steps_queue_the_next_forward_before_reading_tokens(overlapped):
    """Every decode launch but the first reads the step before it from inside the launch
    (after its forward pass is queued), never before it."""
    log = StepLog(overlapped.engine.runner)
    try:
        question, spec = GUIDED[0]
        out = overlapped.generate(chat(question), guided_params(spec), use_tqdm=False)[0]
    finally:
        log.restore()
    assert out.outputs.finish_reason == "stop"
    inside = log.read_inside()
    assert inside[:2] == [False, True]
    assert set(inside[1:]) == {True}
