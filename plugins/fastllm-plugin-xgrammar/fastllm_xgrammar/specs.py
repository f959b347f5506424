"""A guided-decoding request, reduced to the one xgrammar input that compiles it.

The reduced form is hashable, so it doubles as the compile cache's key: two requests with
the same schema (dict or string) or the same choices share one compiled grammar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from fastllm.sampling_params import GuidedDecodingParams

GrammarKind = Literal["json_schema", "json_object", "regex", "ebnf"]


@dataclass(frozen=True)
class GrammarSpec:
    """``source`` is a JSON schema text, a regex or an EBNF grammar (empty for json_object)."""

    kind: GrammarKind
    source: str


def grammar_spec(params: GuidedDecodingParams) -> GrammarSpec:
    """Raises ValueError for what is malformed before xgrammar sees it (schema text that is
    not JSON, an empty choice list)."""
    if params.json_schema is not None:
        return GrammarSpec("json_schema", _schema_text(params.json_schema))
    if params.json_object:
        return GrammarSpec("json_object", "")
    if params.regex is not None:
        return GrammarSpec("regex", params.regex)
    if params.grammar is not None:
        return GrammarSpec("ebnf", params.grammar)
    return GrammarSpec("ebnf", choice_grammar(params.choice or []))


def _schema_text(schema: dict | str) -> str:
    """One text per schema: a string is parsed and re-serialised so whitespace does not
    split the cache. Keys keep their order, since xgrammar emits properties in that order."""
    try:
        if isinstance(schema, str):
            schema = json.loads(schema)
        return json.dumps(schema, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None


def choice_grammar(choices: list[str]) -> str:
    """An EBNF root that matches exactly one of ``choices``; JSON string escapes are
    valid EBNF literals, so quotes, backslashes and control characters need no other care."""
    if not choices:
        raise ValueError("choice needs at least one string")
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)
