"""Reasoning parsers on typical model outputs, whole and streamed at every split."""

from __future__ import annotations

import pytest

from fastllm import registry
from fastllm.chat import reasoning_parser
from fastllm.testing.parsers import assert_streaming_matches_extract

# (parser, enable_thinking, model output, expected reasoning, expected content)
CASES = [
    ("deepseek-r1", True, "<think>\nLet me add.\n2+2=4\n</think>\n\nIt is 4.", "Let me add.\n2+2=4\n", "It is 4."),
    ("deepseek-r1", True, "Let me add.\n</think>\n\nFour.", "Let me add.\n", "Four."),
    ("deepseek-r1", True, "<think>\nStill working on it", "Still working on it", ""),
    ("deepseek-r1", False, "Thinking anyway</think>Done", "Thinking anyway", "Done"),
    ("qwen3", True, "<think>\nThe user greets me.\n</think>\n\nHello!", "The user greets me.\n", "Hello!"),
    ("qwen3", True, "<think>\n\n</think>\n\nHi", "", "Hi"),
    ("qwen3", True, "No opening tag (2507 template)\n</think>\n\nAnswer", "No opening tag (2507 template)\n", "Answer"),
    ("qwen3", False, "Hi <think>literal</think> there", "", "Hi <think>literal</think> there"),
    (
        "qwen3", True,
        '<think>\nNeed weather.\n</think>\n\n<tool_call>\n{"name": "w", "arguments": {}}\n</tool_call>',
        "Need weather.\n", '<tool_call>\n{"name": "w", "arguments": {}}\n</tool_call>',
    ),
    ("ernie-45-vl", True, "The vase is celadon.\n</think>\n\nSong dynasty.", "The vase is celadon.\n", "Song dynasty."),
    ("ernie-45-vl", False, "Song dynasty.", "", "Song dynasty."),
    ("ernie-x1", True, "abc\n</think>\n\n<response>\ndef\n</response>\n", "abc\n", "def"),
    ("ernie-x1", True, "abc\n</think>\ndef", "abc\n", "def"),
    ("ernie-x1", True, "abc</think><response>multi\nline\n\n</response>", "abc", "multi\nline\n"),
    (
        "ernie-x1", True,
        'plan\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n',
        "plan\n", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n',
    ),
    ("ernie-x1", False, "<response>\nhi\n</response>\n", "", "hi"),
    ("ernie-x1", True, "cut off while thin", "cut off while thin", ""),
]


@pytest.mark.parametrize("name, thinking, text, reasoning, content", CASES)
def test_typical_outputs_split_as_the_model_means(name, thinking, text, reasoning, content):
    assert reasoning_parser(name, None, enable_thinking=thinking).extract(text) == (reasoning, content)


@pytest.mark.parametrize("name, thinking, text, reasoning, content", CASES)
def test_every_streaming_split_matches_extract(name, thinking, text, reasoning, content):
    assert_streaming_matches_extract(reasoning_parser(name, None, enable_thinking=thinking), text)


def test_stream_holds_back_only_a_possible_marker():
    stream = reasoning_parser("qwen3", None).stream()
    assert stream.feed("<think>\nabc</th").reasoning_content == "abc"
    assert stream.feed("x").reasoning_content == "</thx"
    assert stream.feed("</think>\n\nHel").content == "Hel"
    assert stream.feed("lo<").content == "lo<"
    assert not stream.finish()


def test_stream_emits_reasoning_before_the_thought_closes():
    stream = reasoning_parser("deepseek-r1", None).stream()
    assert stream.feed("Hmm, ").reasoning_content == "Hmm, "
    assert stream.feed("okay").reasoning_content == "okay"


def test_registered_names():
    assert {"ernie-45-vl", "ernie-x1", "qwen3", "deepseek-r1"} <= set(registry.names("reasoning_parsers"))


class SpecialTokenizer:
    all_special_tokens = ["<|im_end|>", "</think>"]


def test_requires_special_tokens_when_a_marker_is_special():
    assert reasoning_parser("qwen3", SpecialTokenizer()).requires_special_tokens
    assert not reasoning_parser("qwen3", object()).requires_special_tokens
