"""``oneOf`` is read as a plain ``anyOf`` only where its branches are proven pairwise disjoint;
where a branch's complement has no form without ``not`` it stays as written."""

from __future__ import annotations

from fastllm.structured_output.rewrite import exact_schema


def test_disjoint_types_values_and_required_properties_become_any_of():
    by_type = {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}
    by_value = {"oneOf": [{"const": 1.0}, {"enum": [2, "1"]}]}
    by_property = {"definitions": {"ok": {"type": "object", "properties": {"status": {"const": "ok"}},
                                          "required": ["status"]}},
                   "oneOf": [{"$ref": "#/definitions/ok"},
                             {"type": "object", "properties": {"status": {"enum": ["fail", "error"]}},
                              "required": ["status", "data"]}]}
    closed = {"type": "object", "oneOf": [{"required": ["a"], "additionalProperties": False,
                                           "properties": {"a": {}}}, {"required": ["b"]}]}
    for schema in (by_type, by_value, by_property, closed):
        rewritten = exact_schema(schema)
        assert "oneOf" not in rewritten and rewritten["anyOf"] == schema["oneOf"]


def test_overlapping_or_unprovable_branches_stay_one_of():
    overlapping = [
        {"oneOf": [{"type": "number"}, {"type": "integer"}]},  # 1 is both
        {"oneOf": [{"type": "object", "properties": {"k": {"const": 1}}},
                   {"type": "object", "properties": {"k": {"const": 2}}}]},  # {} (k not required)
        {"oneOf": [{"$ref": "https://example.com/elsewhere"}, {"type": "string"}]},
    ]
    for schema in overlapping:
        assert exact_schema(schema) == schema


def test_a_one_of_beside_an_any_of_joins_it_in_all_of_and_data_is_left_alone():
    schema = {"anyOf": [{"minimum": 0}], "oneOf": [{"type": "integer"}, {"type": "string"}],
              "default": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}
    rewritten = exact_schema(schema)
    assert rewritten["anyOf"] == [{"minimum": 0}]
    assert rewritten["allOf"] == [{"anyOf": [{"type": "integer"}, {"type": "string"}]}]
    assert rewritten["default"] == schema["default"]
