"""ChoiceStream on hand-made engine outputs: deltas sum to the message, reasoning and tool calls land right."""

from __future__ import annotations

import json

from fastllm.chat import tool_parser
from fastllm.entrypoints.openai.chat_choice import ChoiceStream
from fastllm.entrypoints.openai.protocol_chat import NamedFunction, NamedToolChoice
from fastllm.outputs import CompletionOutput

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def outputs(reasoning: str, content: str, step: int = 3) -> list[CompletionOutput]:
    """Cumulative outputs growing ``step`` characters at a time, the last one finished."""
    total = reasoning + content
    cuts = list(range(step, len(total), step)) + [len(total)]
    result = []
    for cut in cuts:
        shown_reasoning = reasoning[:cut]
        shown_content = content[:max(0, cut - len(reasoning))]
        result.append(CompletionOutput(index=0, text=shown_content, reasoning_content=shown_reasoning,
                                       finish_reason="stop" if cut == len(total) else None))
    return result


def hermes():
    return tool_parser("hermes", tokenizer=None)


def test_deltas_carry_reasoning_then_content():
    stream = ChoiceStream("none")
    deltas = [stream.delta(o) for o in outputs("thinking about it", "Paris.")]
    assert "".join(d.reasoning_content or "" for d in deltas) == "thinking about it"
    assert "".join(d.content or "" for d in deltas) == "Paris."
    assert stream.finish_reason(outputs("a", "b")[-1]) == "stop"


def test_auto_tool_calls_streamed_and_whole_agree():
    stream = ChoiceStream("auto", hermes())
    parts = [call for o in outputs("", "Let me check. " + CALL) for call in (stream.delta(o).tool_calls or [])]
    assert parts[0].function.name == "get_weather" and parts[0].id
    assert json.loads("".join(p.function.arguments or "" for p in parts)) == {"city": "Paris"}
    assert stream.finish_reason(CompletionOutput(index=0, finish_reason="stop")) == "tool_calls"

    message = ChoiceStream("auto", hermes()).message(
        CompletionOutput(index=0, text="Let me check. " + CALL, finish_reason="stop"))
    assert message.content.strip() == "Let me check."
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]
    assert json.loads(message.tool_calls[0].function.arguments) == {"city": "Paris"}


def test_named_tool_choice_turns_content_into_arguments():
    named = NamedToolChoice(function=NamedFunction(name="get_weather"))
    stream = ChoiceStream(named)
    deltas = [stream.delta(o) for o in outputs("", '{"city": "Rome"}')]
    calls = [c for d in deltas for c in d.tool_calls or []]
    assert calls[0].function.name == "get_weather" and all(c.function.name is None for c in calls[1:])
    assert json.loads("".join(c.function.arguments for c in calls)) == {"city": "Rome"}
    assert not any(d.content for d in deltas)


def test_required_tool_choice_reads_calls_at_the_end():
    text = json.dumps([{"name": "get_weather", "parameters": {"city": "Rome"}}])
    message = ChoiceStream("required").message(CompletionOutput(index=0, text=text, finish_reason="stop"))
    assert message.tool_calls[0].function.name == "get_weather"
    assert json.loads(message.tool_calls[0].function.arguments) == {"city": "Rome"}
    broken = ChoiceStream("required").message(CompletionOutput(index=0, text="[{", finish_reason="length"))
    assert broken.tool_calls is None and broken.content == "[{"
