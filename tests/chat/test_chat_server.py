"""/v1/chat/completions with a reasoning parser and auto tool choice, whole and streamed, and the
structured-output errors a client sees; the official openai client reads every response."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from fastllm.config import EngineConfig
from fastllm.engine.async_llm import AsyncLLM
from tests.chat.forced import (ANSWER, CALL, CALL_ARGUMENTS, THINK_THEN_ANSWER, THINK_THEN_CALL, THOUGHT,
                               WEATHER_TOOL, asked_to_write)
from tests.server.conftest import MODEL, start_server

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def client(smollm2_path) -> Iterator[openai.OpenAI]:
    """A server started as ``--reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes``."""
    engine = AsyncLLM(EngineConfig(model=smollm2_path, max_model_len=512, max_num_seqs=8, block_size=16,
                                   cpu_kv_cache_gib=0.25, reasoning_parser="qwen3", tool_call_parser="hermes"))
    running = start_server(engine, enable_auto_tool_choice=True)
    yield running.client()
    running.stop()
    engine.shutdown(timeout=10)


def ask(client: openai.OpenAI, text: str, stream: bool = False, extra_body: dict | None = None, **kwargs):
    """A greedy request whose answer is ``text`` (forced, unless ``extra_body`` says otherwise)."""
    return client.chat.completions.create(
        model=MODEL, messages=asked_to_write(text), max_tokens=64, temperature=0, stream=stream,
        extra_body=extra_body if extra_body is not None else {"guided_choice": [text]}, **kwargs)


def joined(chunks: list, field: str) -> str:
    return "".join(getattr(c.choices[0].delta, field, None) or "" for c in chunks if c.choices)


def test_reasoning_content_whole_and_streamed(client):
    message = ask(client, THINK_THEN_ANSWER).choices[0].message
    assert (message.reasoning_content, message.content) == (THOUGHT, ANSWER)
    chunks = list(ask(client, THINK_THEN_ANSWER, stream=True))
    assert (joined(chunks, "reasoning_content"), joined(chunks, "content")) == (THOUGHT, ANSWER)
    assert sum(bool(getattr(c.choices[0].delta, "reasoning_content", None)) for c in chunks if c.choices) > 1


def test_disabled_thinking_is_all_content(client):
    message = ask(client, THINK_THEN_ANSWER, extra_body={"guided_choice": [THINK_THEN_ANSWER], **NO_THINKING})
    assert not getattr(message.choices[0].message, "reasoning_content", None)
    assert message.choices[0].message.content == THINK_THEN_ANSWER


def test_auto_tool_calls_stream_as_openai_deltas(client):
    chunks = list(ask(client, THINK_THEN_CALL, stream=True, tools=[WEATHER_TOOL]))
    parts = [part for c in chunks if c.choices for part in c.choices[0].delta.tool_calls or []]
    assert parts[0].index == 0 and parts[0].id.startswith("call_") and parts[0].function.name == "get_weather"
    assert all(part.index == 0 and not part.id for part in parts[1:])
    assert json.loads("".join(part.function.arguments or "" for part in parts)) == CALL_ARGUMENTS
    assert (joined(chunks, "reasoning_content"), joined(chunks, "content")) == (THOUGHT, "")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    whole = ask(client, THINK_THEN_CALL, tools=[WEATHER_TOOL]).choices[0]
    (call,) = whole.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", CALL_ARGUMENTS)
    assert whole.finish_reason == "tool_calls" and not whole.message.content


def test_tool_choice_none_leaves_the_call_text_as_content(client):
    message = ask(client, THINK_THEN_CALL, tools=[WEATHER_TOOL], tool_choice="none").choices[0].message
    assert (message.content, message.tool_calls) == (CALL, None)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_forced_tool_choice_streams_a_valid_call(client, tool_choice):
    chunks = list(ask(client, "Call the weather tool for Paris.", stream=True, extra_body=NO_THINKING,
                      tools=[WEATHER_TOOL], tool_choice=tool_choice))
    parts = [part for c in chunks if c.choices for part in c.choices[0].delta.tool_calls or []]
    assert parts[0].function.name == "get_weather" and parts[0].id
    assert json.loads("".join(part.function.arguments or "" for part in parts))["city"] in ("Paris", "Rome")


def test_response_format_json_object(client):
    response = ask(client, '{"city": "Paris"}', extra_body=NO_THINKING, response_format={"type": "json_object"})
    assert isinstance(json.loads(response.choices[0].message.content), dict)


@pytest.mark.parametrize("extra_body", [
    {"guided_grammar": 'root ::= "a" ('},
    {"guided_regex": "a(b"},
    {"response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": {"type": "array", "minItems": 3, "maxItems": 1}}}},
], ids=["grammar", "regex", "json_schema"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_uncompilable_spec_is_a_400(client, extra_body, stream):
    with pytest.raises(openai.BadRequestError, match="invalid guided decoding spec"):
        ask(client, ANSWER, stream=stream, extra_body=extra_body)
