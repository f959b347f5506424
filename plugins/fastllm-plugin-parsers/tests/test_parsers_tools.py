"""Tool parsers on typical model outputs, whole and streamed at every split."""

from __future__ import annotations

import json

import pytest

from fastllm import registry
from fastllm.chat import tool_parser
from fastllm.testing.parsers import assert_streaming_matches_extract, extract_tools

WEATHER = ("get_weather", '{"city": "Paris", "unit": "celsius"}')
TIME = ("get_time", '{"tz": "Europe/Paris"}')
WEATHER_JSON = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
TIME_JSON = '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}'
TIME_QUOTED = '{"name": "get_time", "arguments": "{\\"tz\\": \\"Europe/Paris\\"}"}'
WEATHER_XML = (
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=unit>\ncelsius\n</parameter>\n</function>"
)
UNCLOSED = '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>'
NOT_JSON = "<|action_start|><|plugin|>\nnot json<|action_end|>"
INTERPRETER = "<|action_start|><|interpreter|>\nprint(1)<|action_end|>"

# (parser, model output, expected content, expected calls)
CASES = [
    ("hermes", "Just an answer.", "Just an answer.", []),
    ("hermes", f"Let me check.\n<tool_call>\n{WEATHER_JSON}\n</tool_call>", "Let me check.\n", [WEATHER]),
    (
        "hermes",
        f"<tool_call>\n{WEATHER_JSON}\n</tool_call>\n<tool_call>\n{TIME_QUOTED}\n</tool_call>",
        "", [WEATHER, TIME],
    ),
    ("hermes", UNCLOSED, UNCLOSED, []),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>!', '<tool_call>{"arguments": {}}</tool_call>!', []),
    ("hermes", f"<tool_call>\n{TIME_JSON}", "", [TIME]),
    ("hermes", '<tool_call>\n{"name": "get_time", "argu', '<tool_call>\n{"name": "get_time", "argu', []),
    ("qwen3", f"<tool_call>\n{WEATHER_JSON}\n</tool_call>", "", [WEATHER]),
    ("qwen3", f"I'll look.\n\n<tool_call>\n{WEATHER_XML}\n</tool_call>", "I'll look.\n\n", [WEATHER]),
    (
        "qwen3",
        "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n"
        "<parameter=b>\n[1, 2]\n</parameter>\n</function>\n</tool_call>",
        "", [("add", '{"a": 2, "b": [1, 2]}')],
    ),
    (
        "qwen3",
        "<tool_call>\n<function=add>\nstray<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=add>\nstray<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>", [],
    ),
    ("llama3_json", "The capital is Paris.", "The capital is Paris.", []),
    ("llama3_json", WEATHER_JSON.replace("arguments", "parameters"), "", [WEATHER]),
    ("llama3_json", f"<|python_tag|>{WEATHER_JSON}; {TIME_JSON}", "", [WEATHER, TIME]),
    ("llama3_json", f"[{WEATHER_JSON}, {TIME_JSON}]", "", [WEATHER, TIME]),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),
    ("llama3_json", '  {"name": "f", "parameters": {}} trailing', '  {"name": "f", "parameters": {}} trailing', []),
    ("llama3_json", "<|python", "<|python", []),
    ("mistral", "No tools needed.", "No tools needed.", []),
    ("mistral", f"[TOOL_CALLS][{WEATHER_JSON}, {TIME_JSON}]", "", [WEATHER, TIME]),
    (
        "mistral",
        'Checking. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}'
        '[TOOL_CALLS]get_time[ARGS]{"tz": "Europe/Paris"}',
        "Checking. ", [WEATHER, TIME],
    ),
    ("mistral", '[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"tz": "Europe/Paris"}', "", [TIME]),
    ("mistral", "[TOOL_CALLS][{oops", "[TOOL_CALLS][{oops", []),
    (
        "internlm",
        f"I need the weather.<|action_start|><|plugin|>\n{WEATHER_JSON}<|action_end|>\n",
        "I need the weather.", [WEATHER],
    ),
    ("internlm", INTERPRETER, INTERPRETER, []),
    ("internlm", NOT_JSON, NOT_JSON, []),
]


@pytest.mark.parametrize("name, text, content, calls", CASES)
def test_typical_outputs_give_the_right_calls(name, text, content, calls):
    assert extract_tools(tool_parser(name, None), text) == (content, calls)


@pytest.mark.parametrize("name, text, content, calls", CASES)
def test_every_streaming_split_matches_extract(name, text, content, calls):
    assert_streaming_matches_extract(tool_parser(name, None), text)


@pytest.mark.parametrize("name", ["hermes", "qwen3"])
def test_content_streams_before_a_call_and_the_call_arrives_whole(name):
    stream = tool_parser(name, None).stream()
    assert stream.feed("Sure.<tool_").content == "Sure."
    assert stream.feed('call>{"name": "f", ').content == ""
    delta = stream.feed('"arguments": {"x": [1]}}</tool_call>\nBye')
    assert [(d.index, d.name, json.loads(d.arguments)) for d in delta.tool_calls] == [(0, "f", {"x": [1]})]
    assert delta.tool_calls[0].id.startswith("call_")
    assert delta.content == "Bye"


def test_mistral_ids_are_nine_alphanumerics():
    (call,) = tool_parser("mistral", None).extract('[TOOL_CALLS][{"name": "f", "arguments": {}}]').tool_calls
    assert len(call.id) == 9 and call.id.isalnum()


def test_registered_names():
    assert {"hermes", "llama3_json", "mistral", "internlm", "qwen3"} <= set(registry.names("tool_parsers"))


class LlamaTokenizer:
    all_special_tokens = ["<|begin_of_text|>", "<|python_tag|>", "<|eot_id|>"]


def test_requires_special_tokens_follows_the_tokenizer():
    assert tool_parser("llama3_json", LlamaTokenizer()).requires_special_tokens
    assert not tool_parser("hermes", LlamaTokenizer()).requires_special_tokens
