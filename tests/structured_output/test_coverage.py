"""The schema walk: every subschema with its JSON pointer, data never entered, gaps named."""

from __future__ import annotations

from fastllm.structured_output.coverage import Gap, InexactSchema, ref_siblings_apply, schema_gaps, subschemas

SCHEMA = {
    "type": "object",
    "properties": {"a/b": {"type": "string"}, "c~d": {"items": [{"not": {}}]}},
    "$defs": {"x": {"anyOf": [{"const": {"not": 1}}, {"type": "null"}]}},
    "additionalProperties": {"if": {"type": "integer"}},
    "enum": [{"properties": {"hidden": {}}}],
}


def test_every_subschema_with_its_escaped_pointer_and_no_data():
    assert [pointer for pointer, _ in subschemas(SCHEMA)] == [
        "", "/properties/a~1b", "/properties/c~0d", "/properties/c~0d/items/0", "/properties/c~0d/items/0/not",
        "/$defs/x", "/$defs/x/anyOf/0", "/$defs/x/anyOf/1", "/additionalProperties",
        "/additionalProperties/if"]


def test_gaps_name_keyword_pointer_and_level():
    gaps = schema_gaps(SCHEMA, lambda node, keyword: "ignored" if keyword in ("not", "if") else None)
    assert gaps == [Gap("not", "/properties/c~0d/items/0", "ignored"), Gap("if", "/additionalProperties", "ignored")]
    message = str(InexactSchema("somebackend", gaps))
    assert message == ("somebackend cannot enforce this schema exactly: 'not' at /properties/c~0d/items/0 "
                       "(ignored); 'if' at /additionalProperties (ignored)")
    assert str(Gap("oneOf", None, "approximated")) == "'oneOf' (approximated)"
    assert str(Gap("not", "", "ignored")) == "'not' at / (ignored)"


def test_ref_siblings_apply_from_draft_2019_on():
    assert not ref_siblings_apply({"$schema": "http://json-schema.org/draft-07/schema#"})
    assert not ref_siblings_apply({"$schema": "http://json-schema.org/draft-04/schema"})
    assert ref_siblings_apply({"$schema": "https://json-schema.org/draft/2020-12/schema"})
    assert ref_siblings_apply({})
