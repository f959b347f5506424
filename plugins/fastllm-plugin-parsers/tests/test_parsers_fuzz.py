"""Random texts mixing marker fragments: parsers never raise and lose no characters.

"No characters lost" is stated per parser:

- reasoning parsers: with every marker (and the layout newlines a format puts
  right after ``<think>``, ``</think>`` and ``</response>``, the one after
  ``<response>`` and the one before ``</response>``) removed by ``canon``,
  ``canon(reasoning) + canon(content) == canon(input)``;
- tool parsers: an oracle cuts the input into content, recognised call blocks
  (start tag, body, end tag) and the newlines dropped after a call, and these
  pieces rejoin to exactly the input; the parser's content is the oracle's
  content, its calls are the oracle's blocks in order, and each call's name and
  arguments are what ``json`` reads from its block.

Every random text is also streamed in random chunks, which must agree with
``extract``.
"""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastllm.chat import reasoning_parser, tool_parser
from fastllm.testing.parsers import chunks_at, extract_tools, stream_reasoning, stream_tools

FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

COMMON = ["\n", "\n\n", " ", "a", "é", "{", "}", "[", "]", '"', ":", ",", ";", "<", ">", "/", "|", "x\ny"]


def texts(fragments: list[str]) -> st.SearchStrategy[str]:
    pieces = st.one_of(st.sampled_from(fragments + COMMON), st.text(max_size=4))
    return st.lists(pieces, max_size=24).map("".join)


# Reasoning parsers.

THINK_FRAGMENTS = ["<think>", "</think>", "<think", "</thi", "nk>", "<response>", "</response>", "<resp", "onse>", "</"]
THINK_CANON = re.compile(r"<think>\n*|</think>\n*")
X1_CANON = re.compile(r"<think>\n*|</think>\n*|<response>\n?|\n?</response>\n*")


@FUZZ
@given(
    name=st.sampled_from(["deepseek-r1", "qwen3", "ernie-45-vl", "ernie-x1"]),
    thinking=st.booleans(),
    text=texts(THINK_FRAGMENTS),
    data=st.data(),
)
def test_reasoning_parsers_lose_nothing(name, thinking, text, data):
    parser = reasoning_parser(name, None, enable_thinking=thinking)
    reasoning, content = parser.extract(text)
    canon = (X1_CANON if name == "ernie-x1" else THINK_CANON).sub
    assert canon("", reasoning) + canon("", content) == canon("", text)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=6))
    assert stream_reasoning(parser, chunks_at(text, cuts)) == (reasoning, content)


# Tool parsers with tagged blocks, checked against a regex oracle.

TAGS = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "qwen3": ("<tool_call>", "</tool_call>"),
    "internlm": ("<|action_start|><|plugin|>", "<|action_end|>"),
}
CALL_BODIES = [
    '{"name": "f", "arguments": {"a": 1}}',
    '\n{"name": "g", "parameters": {"s": "<tool_call>"}}\n',
    '{"name": "h", "arguments": "{\\"k\\": [true, null]}"}',
    '{"name": "", "arguments": {}}',
    '{"name": "f", "arguments": [1]}',
    "<function=f>\n<parameter=p>\n1\n</parameter>\n</function>",
    '{"name": ',
]
TAG_FRAGMENTS = CALL_BODIES + [
    "<tool_call>", "</tool_call>", "<tool_", "call>", "</tool",
    "<|action_start|>", "<|plugin|>", "<|action_end|>", "<|action",
]


def tagged_oracle(name: str, text: str) -> tuple[str, list[str]]:
    """The content and the bodies of recognised calls, by plain string search."""
    start, end = TAGS[name]
    decode = tool_parser(name, None).decode
    content, bodies, rejoined, position, after_call = [], [], [], 0, False
    while True:
        begin = text.find(start, position)
        plain = text[position:begin if begin >= 0 else len(text)]
        kept = plain.lstrip("\n") if after_call else plain
        content.append(kept)
        rejoined += [plain[: len(plain) - len(kept)], kept]
        if begin < 0:
            break
        close = text.find(end, begin + len(start))
        stop = close if close >= 0 else len(text)
        body, tail = text[begin + len(start):stop], end if close >= 0 else ""
        block = start + body + tail
        after_call = decode(body) is not None
        if after_call:
            bodies.append(body)
        else:
            content.append(block)
        rejoined.append(block)
        position = stop + len(tail)
        after_call = after_call and close >= 0
    assert "".join(rejoined) == text, "the oracle's pieces rejoin to the input"
    return "".join(content), bodies


@FUZZ
@given(name=st.sampled_from(sorted(TAGS)), text=texts(TAG_FRAGMENTS), data=st.data())
def test_tagged_tool_parsers_match_the_oracle(name, text, data):
    parser = tool_parser(name, None)
    content, calls = extract_tools(parser, text)
    expected_content, bodies = tagged_oracle(name, text)
    assert content == expected_content
    assert len(calls) == len(bodies)
    for (call_name, arguments), body in zip(calls, bodies, strict=True):
        assert call_name == _json_name(body, call_name)
        assert isinstance(json.loads(arguments), dict)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=6))
    assert stream_tools(parser, chunks_at(text, cuts)) == (content, calls)


def _json_name(body: str, fallback: str) -> str:
    """The name a JSON body declares; XML bodies (qwen3) declare theirs in ``<function=...>``."""
    try:
        return json.loads(body)["name"].strip()
    except ValueError:
        return re.match(r"\s*<function=([^>\n]+)>", body)[1].strip() if "<function=" in body else fallback


# Whole-output formats: either everything decodes as calls, or everything is content.

WHOLE_FRAGMENTS = CALL_BODIES + [
    "<|python_tag|>", "<|python", "[TOOL_CALLS]", "[TOOL_", "CALLS]", "[ARGS]", "[CALL_ID]", "f", '{"x": 1}',
    '{"name": "f", "parameters": {"a": 1}}', '[{"name": "f", "arguments": {}}]',
]


def whole_oracle(name: str, text: str) -> tuple[str, str]:
    """``(content, call text)``: where the call part starts, by the format's rule."""
    if name == "llama3_json":
        head = text.lstrip()
        starts_calls = head.startswith(("{", "[", "<|python_tag|>"))
        return ("", text) if starts_calls else (text, "")
    index = text.find("[TOOL_CALLS]")
    return (text, "") if index < 0 else (text[:index], text[index:])


@FUZZ
@given(name=st.sampled_from(["llama3_json", "mistral"]), text=texts(WHOLE_FRAGMENTS), data=st.data())
def test_whole_output_tool_parsers_lose_nothing(name, text, data):
    parser = tool_parser(name, None)
    content, calls = extract_tools(parser, text)
    before, call_text = whole_oracle(name, text)
    if calls:
        assert content == before and call_text
        assert all(isinstance(json.loads(arguments), dict) for _, arguments in calls)
    else:
        assert content == text
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=6))
    assert stream_tools(parser, chunks_at(text, cuts)) == (content, calls)
