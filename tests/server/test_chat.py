"""/v1/chat/completions through the official openai client: messages, streaming, logprobs, formats, tools."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.conftest import MODEL, start_server

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}


def test_chat_answer_and_usage(client):
    response = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    choice = response.choices[0]
    assert response.object == "chat.completion"
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 < usage.completion_tokens <= 8 and usage.prompt_tokens > 10


def test_chat_stream_matches_whole_response(client):
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_chat_logprobs(client):
    choice = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0,
                                            logprobs=True, top_logprobs=3).choices[0]
    content = choice.logprobs.content
    assert 0 < len(content) <= 5
    for item in content:
        assert len(item.top_logprobs) == 3
        assert item.top_logprobs[0].logprob >= item.logprob - 1e-6  # greedy: the chosen token is the best


def test_chat_n_and_seed(client):
    first = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, max_tokens=6, temperature=1.0, seed=9)
    again = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, max_tokens=6, temperature=1.0, seed=9)
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]


def test_response_format_json_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon"]}},
              "required": ["city"], "additionalProperties": False}
    response = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=30, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    assert json.loads(response.choices[0].message.content)["city"] in ("Paris", "Lyon")


def test_named_tool_choice_calls_that_tool(client):
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}], max_tokens=30,
        temperature=0, tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = response.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")


def test_auto_tool_choice_needs_a_parser(client):
    with pytest.raises(openai.BadRequestError, match="enable-auto-tool-choice"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, tools=[WEATHER_TOOL])


def test_auto_tool_choice_with_parser(engine):
    """With a tool parser configured, ``auto`` is accepted; a tool-less answer stays content."""
    engine.config.tool_call_parser = "hermes"
    try:
        running = start_server(engine, enable_auto_tool_choice=True)
    finally:
        engine.config.tool_call_parser = None
    try:
        response = running.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6,
                                                            temperature=0, tools=[WEATHER_TOOL])
        message = response.choices[0].message
        assert message.content or message.tool_calls
    finally:
        running.stop()
