"""Decoding one tool call from the JSON a model wrote; anything malformed decodes to ``None``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

INVALID = object()


def new_call_id() -> str:
    """An OpenAI-style call id."""
    return f"call_{uuid.uuid4().hex[:24]}"


def loads(text: str) -> Any:
    """``json.loads`` that returns ``INVALID`` instead of raising, even on absurd nesting."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return INVALID


def dumps(arguments: dict[str, Any]) -> str | None:
    """The arguments as JSON text, or ``None`` if they cannot be written back."""
    try:
        return json.dumps(arguments, ensure_ascii=False)
    except (ValueError, RecursionError):
        return None


def call_from_object(obj: Any, argument_keys: Sequence[str] = ("arguments", "parameters")) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` of ``{"name": ..., "arguments": {...}}``, or ``None``.

    Arguments may be an object or a string holding one (some models quote
    them); a missing arguments key means a call without arguments.
    """
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    arguments = next((obj[key] for key in argument_keys if key in obj), {})
    if isinstance(arguments, str):
        arguments = loads(arguments)
    if not isinstance(arguments, dict):
        return None
    text = dumps(arguments)
    return None if text is None else (name.strip(), text)


def decode_json_call(body: str) -> tuple[str, str] | None:
    """A call written as one JSON object, the body of hermes-style tags."""
    return call_from_object(loads(body))
