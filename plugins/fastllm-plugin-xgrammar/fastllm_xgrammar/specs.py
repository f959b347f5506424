"""A guided-decoding request, reduced to the one xgrammar input that compiles it.

The reduced form is hashable, so it doubles as the compile cache's key: two requests with
the same schema (dict or string) or the same choices share one compiled grammar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

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


# Values that are data, not subschemas: a string schema inside them is left as written.
_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))
_LENGTH_KEYWORDS = ("minLength", "maxLength")
UNESCAPED_CHAR = r'[^"\\\x00-\x1f]'  # one character a JSON string holds as itself
# What a rewritten node may hold: the bounds, its type and keywords that assert nothing.
_PLAIN_STRING_KEYS = frozenset(("type", "minLength", "maxLength", "title", "description", "default",
                                "examples", "$comment", "deprecated", "readOnly", "writeOnly"))


def lengths_as_patterns(node: Any) -> Any:
    """``node`` with every plain string schema that bounds its length (``minLength`` /
    ``maxLength``, integers ``0 <= min <= max``, and nothing else that asserts) rewritten as
    ``pattern: ^[^"\\\x00-\x1f]{min,max}$``; every other node is left as written. The backend
    compiles the schema as written when the rewritten one fails to compile.

    Both forms admit the same strings in xgrammar: lengths in code points, no escapes, no raw
    quote, backslash or control character (xgrammar's own length form writes no escapes; a
    pattern's ``.`` would not do: with some bounds xgrammar lets it run past the closing quote).
    But xgrammar compiles a length bound into a counted repetition of a one-character rule,
    whose token masks it must work out token by token while inside the string: 0.4-1.7 ms per
    row and step on SmolLM2's vocabulary, where the pattern's automaton takes 10-20 us. A batch
    step waits for its slowest row's mask.
    """
    if isinstance(node, list):
        return [lengths_as_patterns(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: value if key in _DATA_KEYWORDS else lengths_as_patterns(value) for key, value in node.items()}
    bounds = [node[key] for key in _LENGTH_KEYWORDS if key in node]
    if (node.get("type") == "string" and bounds and all(type(b) is int and b >= 0 for b in bounds)
            and node.get("minLength", 0) <= node.get("maxLength", node.get("minLength", 0))
            and node.keys() <= _PLAIN_STRING_KEYS):
        low, high = out.pop("minLength", 0), out.pop("maxLength", "")
        out["pattern"] = f"^{UNESCAPED_CHAR}{{{low},{high}}}$"
    return out


def choice_grammar(choices: list[str]) -> str:
    """An EBNF root that matches exactly one of ``choices``; JSON string escapes are
    valid EBNF literals, so quotes, backslashes and control characters need no other care
    (``GuidedDecodingParams`` holds at least one)."""
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)
