"""What a backend enforces of a JSON schema: a walk over every subschema, a backend's verdict on
each keyword, and the refusal that names what it would not enforce and where.

A backend that compiles a looser grammar than the schema (a keyword it ignores, a ``oneOf`` it
reads as ``anyOf``) would return output that breaks the schema the user gave. So each backend
classifies a schema's keywords before compiling; a strict request with any gap is refused, or
handed by the router to a backend without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Optional

Level = Literal["approximated", "ignored"]

# keyword -> how its value holds subschemas: one schema, a list of them, or a name -> schema map
SUBSCHEMA = ("additionalProperties", "items", "additionalItems", "contains", "propertyNames", "not", "if",
        "then", "else", "unevaluatedProperties", "unevaluatedItems")
SCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
SCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")


@dataclass(frozen=True)
class Gap:
    """One keyword a backend does not enforce as written, at the JSON pointer of its subschema
    (None: somewhere, as a backend's warning told it without a place)."""

    keyword: str
    pointer: Optional[str]
    level: Level

    def __str__(self) -> str:
        where = "" if self.pointer is None else f" at {self.pointer or '/'}"
        return f"'{self.keyword}'{where} ({self.level})"


class InexactSchema(ValueError):
    """A strict request whose schema the backend would enforce only loosely; names every gap."""

    def __init__(self, backend: str, gaps: list[Gap]):
        shown = "; ".join(map(str, gaps[:5])) + (f"; and {len(gaps) - 5} more" if len(gaps) > 5 else "")
        super().__init__(f"{backend} cannot enforce this schema exactly: {shown}")
        self.backend, self.gaps = backend, gaps


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def subschemas(schema: Any, pointer: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object subschema of ``schema`` with its JSON pointer, the root first. Values of data
    keywords (``enum``, ``const``, ``default``, ``examples``) are never entered."""
    if not isinstance(schema, dict):
        return
    yield pointer, schema
    for keyword, value in schema.items():
        here = f"{pointer}/{_escape(keyword)}"
        if keyword in SUBSCHEMA and isinstance(value, dict):
            yield from subschemas(value, here)
        elif keyword in SCHEMA_LIST and isinstance(value, list):
            for index, item in enumerate(value):
                yield from subschemas(item, f"{here}/{index}")
        elif keyword in SCHEMA_MAP and isinstance(value, dict):
            for name, item in value.items():
                yield from subschemas(item, f"{here}/{_escape(name)}")


def ref_siblings_apply(schema: Any) -> bool:
    """Whether keywords beside a ``$ref`` constrain too: from draft 2019-09 on (and for a schema
    that names no draft, read as the latest); drafts 4 to 7 ignore them."""
    declared = schema.get("$schema", "") if isinstance(schema, dict) else ""
    return not any(f"draft-0{n}" in str(declared) for n in (3, 4, 6, 7))


def schema_gaps(schema: Any, classify: Callable[[dict[str, Any], str], Optional[Level]]) -> list[Gap]:
    """The gaps ``classify(subschema, keyword)`` reports over every keyword of every subschema."""
    return [Gap(keyword, pointer, level) for pointer, node in subschemas(schema) for keyword in node
            if (level := classify(node, keyword)) is not None]
