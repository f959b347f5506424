"""Model outputs the chat tests force on SmolLM2 through a one-string guided choice.

SmolLM2 neither thinks nor calls tools by itself; constraining it to write exactly a
thinking model's or a tool-calling model's text runs the parsers on real engine output,
token by token, offline and in the server.  The prompt also asks for that text, so the
model spells it in its usual tokens rather than in many odd pieces the grammar allows.
"""

from __future__ import annotations

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}

THOUGHT = "Paris.\n"
ANSWER = "Sunny."
CALL_ARGUMENTS = {"city": "Paris"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

THINK_THEN_ANSWER = f"<think>\n{THOUGHT}</think>\n\n{ANSWER}"
THINK_THEN_CALL = f"<think>\n{THOUGHT}</think>\n\n{CALL}"


def asked_to_write(text: str) -> list[dict[str, str]]:
    """A conversation whose answer is ``text``."""
    return [{"role": "user", "content": f"Reply with exactly this text:\n{text}"}]


def forced(text: str) -> dict[str, list[str]]:
    """The guided-decoding spec that makes the model write exactly ``text``."""
    return {"choice": [text]}
