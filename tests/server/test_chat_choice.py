"""ChoiceStream on hand-made engine outputs: deltas sum to the message, reasoning and tool calls land right."""

from __future__ import annotations

import json

from fastllm.chat import ToolCall
from fastllm.entrypoints.openai.chat_choice import ChoiceStream
from fastllm.entrypoints.openai.protocol_chat import NamedFunction, NamedToolChoice
from fastllm.outputs import CompletionOutput


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


def test_deltas_carry_reasoning_then_content():
    stream = ChoiceStream("none")
    deltas = [stream.delta(o) for o in outputs("thinking about it", "Paris.")]
    assert "".join(d.reasoning_content or "" for d in deltas) == "thinking about it"
    assert "".join(d.content or "" for d in deltas) == "Paris."
    assert stream.finish_reason(outputs("a", "b")[-1]) == "stop"


def test_auto_tool_calls_streamed_and_whole_agree():
    """The engine's parsed calls (cumulative, arguments growing) become OpenAI deltas: the first
    names the call, later ones only extend its arguments; the whole output gives one message."""
    whole = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    steps = [CompletionOutput(index=0, text="Let me check. ", tool_calls=[]),
             CompletionOutput(index=0, text="Let me check. ", tool_calls=[ToolCall("call_1", "get_weather", '{"ci')]),
             CompletionOutput(index=0, text="Let me check. ", tool_calls=[whole], finish_reason="stop")]
    stream = ChoiceStream("auto")
    deltas = [stream.delta(o) for o in steps]
    parts = [call for d in deltas for call in d.tool_calls or []]
    assert (parts[0].id, parts[0].type, parts[0].function.name) == ("call_1", "function", "get_weather")
    assert all((p.id, p.type, p.function.name) == (None, None, None) for p in parts[1:])
    assert json.loads("".join(p.function.arguments or "" for p in parts)) == {"city": "Paris"}
    assert "".join(d.content or "" for d in deltas) == "Let me check. "
    assert stream.finish_reason(steps[-1]) == "tool_calls"

    message = ChoiceStream("auto").message(steps[-1])
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
