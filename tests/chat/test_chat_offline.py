"""``LLM.chat`` with a reasoning and a tool parser: thought, answer and calls land in their fields."""

from __future__ import annotations

import json

import pytest

from fastllm import LLM, SamplingParams
from tests.chat.forced import (ANSWER, CALL, CALL_ARGUMENTS, THINK_THEN_ANSWER, THINK_THEN_CALL, THOUGHT,
                               WEATHER_TOOL, asked_to_write, forced)


@pytest.fixture(scope="module")
def llm(smollm2_path) -> LLM:
    return LLM(smollm2_path, max_model_len=512, num_gpu_blocks_override=64, max_num_seqs=8,
               reasoning_parser="qwen3", tool_call_parser="hermes")


def chat(llm: LLM, text: str, n: int = 1, **kwargs):
    params = SamplingParams(n=n, temperature=0.0, max_tokens=64, guided_decoding=forced(text))
    return llm.chat(asked_to_write(text), params, use_tqdm=False, **kwargs)[0]


def test_thought_and_answer_are_split(llm):
    output = chat(llm, THINK_THEN_ANSWER)
    assert (output.outputs.reasoning_content, output.outputs.text) == (THOUGHT, ANSWER)
    assert output.outputs.tool_calls is None


def test_disabled_thinking_leaves_everything_answer(llm):
    output = chat(llm, THINK_THEN_ANSWER, chat_template_kwargs={"enable_thinking": False})
    assert (output.outputs.reasoning_content, output.outputs.text) == ("", THINK_THEN_ANSWER)


def test_every_sample_gets_its_tool_calls(llm):
    output = chat(llm, THINK_THEN_CALL, n=2, tools=[WEATHER_TOOL])
    assert output.outputs is output.completions[0]
    for completion in output.completions:
        assert (completion.reasoning_content, completion.text) == (THOUGHT, "")
        (call,) = completion.tool_calls
        assert call.name == "get_weather" and call.id.startswith("call_")
        assert json.loads(call.arguments) == CALL_ARGUMENTS


def test_without_tools_the_call_text_stays_content(llm):
    output = chat(llm, THINK_THEN_CALL)
    assert (output.outputs.text, output.outputs.tool_calls) == (CALL, None)
