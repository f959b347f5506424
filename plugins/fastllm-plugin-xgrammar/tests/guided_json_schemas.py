"""Twenty JSON schemas, each with a prompt, covering the keywords guided decoding must honour.

Strings, arrays and numbers are bounded so that even greedy decoding of a small model ends
within a few dozen tokens.
"""

from __future__ import annotations

from typing import Any

NAME = {"type": "string", "minLength": 1, "maxLength": 12}
SMALL_INT = {"type": "integer", "minimum": 0, "maximum": 100}

SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("Describe a person as JSON.", {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"]}),
    ("Give a point on a grid.", {
        "type": "object",
        "properties": {"x": {"type": "integer", "minimum": -100, "maximum": 100},
                       "y": {"type": "integer", "minimum": -100, "maximum": 100}},
        "required": ["x", "y"]}),
    ("What colour is grass?", {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"]}),
    ("Is the task done and is it urgent?", {
        "type": "object",
        "properties": {"done": {"type": "boolean"}, "urgent": {"type": "boolean"}},
        "required": ["done", "urgent"]}),
    ("List a few digits.", {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2, "maxItems": 4}),
    ("Describe a user account.", {
        "type": "object",
        "properties": {
            "user": {"type": "object", "properties": {"name": NAME, "id": SMALL_INT},
                     "required": ["name", "id"]},
            "active": {"type": "boolean"}},
        "required": ["user", "active"]}),
    ("Tag this article about cooking.", {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                "minItems": 1, "maxItems": 3}},
        "required": ["tags"]}),
    ("How much does a bike cost?", {
        "type": "object",
        "properties": {"price": {"type": "number", "minimum": 0, "maximum": 1000}},
        "required": ["price"]}),
    ("Give a title and, if you like, a subtitle.", {
        "type": "object",
        "properties": {"title": NAME, "subtitle": NAME},
        "required": ["title"]}),
    ("What size is an elephant?", {"enum": ["small", "medium", "large"]}),
    ("Report the API version.", {
        "type": "object",
        "properties": {"version": {"const": 2}, "name": NAME},
        "required": ["version", "name"]}),
    ("Give a small number or a short word.", {
        "anyOf": [{"type": "integer", "minimum": 0, "maximum": 10}, {"type": "string", "maxLength": 5}]}),
    ("Write a short shopping list.", {
        "type": "object",
        "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
            "type": "object", "properties": {"name": NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
            "required": ["name", "qty"]}}},
        "required": ["items"]}),
    ("Give an airport code and a gate.", {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["code"]}),
    ("Say one word of three to eight letters.", {
        "type": "object",
        "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 8}},
        "required": ["word"]}),
    ("Leave a note, or null.", {
        "type": "object",
        "properties": {"note": {"type": ["string", "null"], "maxLength": 10}},
        "required": ["note"]}),
    ("Give the start and end of a line segment.", {
        "$defs": {"point": {"type": "object", "properties": {"x": SMALL_INT, "y": SMALL_INT},
                            "required": ["x", "y"]}},
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"]}),
    ("Score the movie strictly between 0 and 10.", {
        "type": "object",
        "properties": {"score": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}},
        "required": ["score"]}),
    ("Fill in the nested value.", {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
            "c": {"type": "integer", "minimum": 0, "maximum": 5}}, "required": ["c"]}}, "required": ["b"]}},
        "required": ["a"]}),
    ("Answer three yes/no questions as booleans.", {
        "type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3}),
]
