"""Each exact rewrite (``fastllm.structured_output.rewrite``) accepts exactly what the schema it
replaces accepts: jsonschema judges original and rewritten alike on hand-made edge documents and on
mutants of the maskbench documents of the sample's rewritten schemas; llguidance, which refuses
the original keywords, compiles the rewrites and its matcher agrees with jsonschema on them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from fastllm.structured_output.negation import complement, strings_other_than
from fastllm.structured_output.rewrite import exact_schema

SAMPLE = Path(__file__).parents[2] / "benchmarks" / "data" / "jsonschemabench_sample.jsonl"
SCALARS = [None, True, False, 0, 1, 2.5, "", "a", "radius", [], [1], {}]


def judge(schema, document) -> bool:
    validator = jsonschema.validators.validator_for(schema)
    if validator in (jsonschema.Draft3Validator, jsonschema.Draft4Validator):
        validator = jsonschema.Draft6Validator  # the rewrites write `false` subschemas (draft 6 on)
    return validator(schema).is_valid(document)


def assert_equivalent(schema, documents, gone: str) -> None:
    rewritten = exact_schema(schema)
    assert gone not in json.dumps(rewritten), rewritten
    for document in [*documents, *SCALARS]:
        assert judge(schema, document) == judge(rewritten, document), document


def test_one_of_of_required_sets_gets_the_other_branches_complements():
    schema = {"type": "object", "properties": {"length": {"type": "number"}, "width": {"type": "number"},
                                               "radius": {"type": "number"}},
              "oneOf": [{"required": ["length", "width"]}, {"required": ["radius"]}]}
    documents = [{"length": 1, "width": 2}, {"radius": 1}, {"length": 1, "width": 2, "radius": 3}, {"length": 1},
                 {"length": 1, "radius": 2}, {}, {"radius": "x"}]
    assert_equivalent(schema, documents, "oneOf")
    assert_equivalent({"oneOf": schema["oneOf"]}, documents, "oneOf")  # every non-object matches both


def test_one_of_with_a_branch_written_twice_never_picks_it():
    twice = {"type": "object", "properties": {"kind": {"enum": ["b"]}}, "required": ["kind"]}
    schema = {"type": "object", "oneOf": [
        {"properties": {"kind": {"enum": ["a"]}}, "required": ["kind"]}, twice, twice]}
    assert_equivalent(schema, [{"kind": "a"}, {"kind": "b"}, {"kind": "c"}, {}], "oneOf")
    assert not judge(exact_schema(schema), {"kind": "b"})
    assert_equivalent({"oneOf": [{"const": "a"}, {"const": "a"}]}, ["a", "b"], "oneOf")  # never exactly one


def test_one_of_of_untyped_object_branches_holds_objects_only():
    branch = {"additionalProperties": False, "required": ["op", "path"], "properties": {"path": {"type": "string"}}}
    schema = {"oneOf": [{**branch, "properties": {**branch["properties"], "op": {"enum": ["add"]}, "value": {}},
                         "required": ["op", "path", "value"]},
                        {**branch, "properties": {**branch["properties"], "op": {"enum": ["remove"]}}}]}
    rewritten = exact_schema(schema)
    assert {"type": "object"} in rewritten["allOf"]
    assert_equivalent(schema, [{"op": "add", "path": "/a", "value": 1}, {"op": "remove", "path": "/a"},
                               {"op": "remove", "path": "/a", "value": 1}, {"op": "add", "path": "/a"}], "oneOf")


def test_one_of_within_closed_objects_and_shared_all_of_members():
    closed = [{"type": "object", "additionalProperties": False, "properties": {name: {"type": "string"}}}
              for name in ("a", "b")]
    assert_equivalent({"oneOf": closed}, [{"a": "x"}, {"b": "x"}, {"a": "x", "b": "y"}, {"a": 1}, {"c": 1}], "oneOf")
    base = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    schema = {"definitions": {"base": base}, "oneOf": [
        {"allOf": [{"$ref": "#/definitions/base"}, {"required": ["low"]}, {"not": {"required": ["high"]}}]},
        {"allOf": [{"$ref": "#/definitions/base"}, {"required": ["high"]}, {"not": {"required": ["low"]}}]},
        {"allOf": [{"$ref": "#/definitions/base"}, {"required": ["low", "high"]}]}]}
    documents = [{"name": "n", "low": 1}, {"name": "n", "high": 1}, {"name": "n", "low": 1, "high": 2}, {"name": "n"},
                 {"low": 1}]
    assert_equivalent(schema, documents, "oneOf")


def test_unprovable_one_of_stays_as_written():
    # "some item is not a string" needs `contains`, which llguidance lacks too
    schema = {"oneOf": [{"type": "object", "required": ["a"]},
                        {"type": "object", "required": ["b"], "properties": {"b": {"type": "array",
                                                                                   "items": {"type": "string"}}}}]}
    assert exact_schema(schema) == schema


def test_not_of_required_and_of_types():
    for negated in ({"required": ["a"]}, {"allOf": [{"required": ["a"]}, {"required": ["b"]}]},
                    {"properties": {"a": {}}, "required": ["a"]}, {"type": ["string", "null"]},
                    {"enum": ["x", "xy", True, None]}, {"minLength": 2}, {"maxItems": 1},
                    {"anyOf": [{"type": "string"}, {"required": ["a"]}]}):
        assert_equivalent({"not": negated}, [{"a": 1}, {"a": 1, "b": 2}, {"b": 2}, "x", "xy", "xyz", "y", [1, 2]],
                          '"not"')


def test_if_then_else_on_a_property_value_from_draft_7_on():
    schema = {"type": "object", "properties": {"kind": {"type": "string"}},
              "if": {"properties": {"kind": {"const": "static"}}},
              "then": {"properties": {"routing": {"enum": ["react"]}}},
              "else": {"required": ["port"]}}
    documents = [{"kind": "static", "routing": "react"}, {"kind": "static", "routing": "x"}, {"kind": "statics"},
                 {"kind": "stat", "port": 1}, {"port": 1}, {}, {"routing": "x", "port": 1}]
    assert_equivalent(schema, documents, '"if"')
    draft_6 = {**schema, "$schema": "http://json-schema.org/draft-06/schema#"}  # if/then/else assert nothing yet
    assert exact_schema(draft_6) == draft_6


def test_dependencies_in_array_and_schema_forms():
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "dependencies": {"a": ["b", "c"], "d": {"properties": {"e": {"enum": [1]}}}}}
    documents = [{"a": 1}, {"a": 1, "b": 1}, {"a": 1, "b": 1, "c": 1}, {"d": 1, "e": 2}, {"d": 1, "e": 1}, {"e": 2},
                 {"f": 1}, {"f": 1, "g": 1}]
    assert_equivalent(schema, documents, "depend")
    later = {"type": "object", "dependentRequired": {"f": ["g"]}, "dependentSchemas": {"a": {"required": ["b"]}}}
    assert_equivalent(later, documents, "depend")


def test_property_names():
    strings = {"type": "object", "additionalProperties": {"type": "string"}, "propertyNames": {"type": "string"}}
    assert_equivalent(strings, [{"a": "x"}, {"a": 1}], "propertyNames")
    assert_equivalent({"type": "object", "additionalProperties": {"type": "string"},
                       "propertyNames": {"pattern": "^[a-z]{1,3}$"}},
                      [{"ab": "x"}, {"ab": 1}, {"abcd": "x"}, {"A": "x"}], "propertyNames")
    beside = {"type": "object", "properties": {"Z": {}}, "propertyNames": {"pattern": "^[a-z]+$"}}
    assert exact_schema(beside) == beside


def test_strings_other_than_matches_every_string_but_those():
    excluded = ["su", "sun", "", "a.b", "é\n"]
    pattern = re.compile(strings_other_than(excluded))
    for text in ["s", "sx", "sunny", "suN", "x", "a.b", "a.bc", "axb", "é", "é\n", "é\nx", " ", "\n", *excluded]:
        # fullmatch: ECMA-262's `$` (which JSON Schema and llguidance use) never matches before a final newline
        assert bool(pattern.fullmatch(text)) == (text not in excluded), text
    assert complement({"enum": [1, "a"]}, {}) is None  # "a number other than 1" has no such form
    assert complement({"const": True}, {}, within={"const": 1}) == {"anyOf": [
        {"type": ["array", "null", "number", "object", "string"]}, {"const": False}]}  # 1 is not true


def _mutants(document, names):
    """Each key dropped or retyped, known names added, at every object and array of ``document``."""
    found = []

    def walk(node, put):
        if isinstance(node, dict):
            for key in node:
                found.append(put({k: v for k, v in node.items() if k != key}))
                found.extend(put({**node, key: value}) for value in (None, 0, "x", [], {}))
                walk(node[key], lambda value, key=key: put({**node, key: value}))
            found.extend(put({**node, name: value}) for name in names if name not in node for value in ("x", {}))
        elif isinstance(node, list) and node:
            walk(node[0], lambda value: put([value, *node[1:]]))
            found.append(put(node[1:]))

    walk(document, lambda value: value)
    return found[:120]


def _sample():
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line]
    return [row for row in rows if exact_schema(row["schema"]) != row["schema"]]


def test_sample_rewrites_judge_maskbench_documents_and_their_mutants_alike():
    rows = _sample()
    assert len(rows) >= 40
    for row in rows:
        schema, rewritten = row["schema"], exact_schema(row["schema"])
        names = sorted({name for text in re.findall(r'"required": \[([^\]]*)\]', json.dumps(schema))
                        for name in json.loads(f"[{text}]") if isinstance(name, str)})[:12]
        documents = [test["data"] for test in row["tests"]]
        for document in [*documents[:4], *(m for d in documents[:4] for m in _mutants(d, names))]:
            assert judge(schema, document) == judge(rewritten, document), (row["id"], document)


@pytest.fixture(scope="module")
def llguidance():
    pytest.importorskip("fastllm_llguidance")
    from fastllm import registry
    from fastllm.model_loader.resolve import embedded_model_path, load_tokenizer, resolve_load_format

    path = embedded_model_path()
    tokenizer = load_tokenizer(registry.get("load_formats", resolve_load_format(path, "auto"))(), path, None)
    return registry.get("structured_output_backends", "llguidance")(tokenizer, 49152), tokenizer


@pytest.mark.parametrize("record_id", ["Glaiveai2K/calculate_area_dc810ada.json", "Github_hard/o33131.json",
                                       "JsonSchemaStore/json-patch.json", "WashingtonPost/wp_37_Normalized.json",
                                       "JsonSchemaStore/sourcehut-build-0.65.0.json"])
def test_llguidance_enforces_the_rewrites_exactly(llguidance, record_id):
    from fastllm.sampling_params import GuidedDecodingParams

    backend, tokenizer = llguidance
    rows = map(json.loads, SAMPLE.read_text().splitlines())
    row = next(row for row in rows if f"{row['split']}/{row['id']}" == record_id)
    compiled = backend.compile(GuidedDecodingParams(json=row["schema"], strict=True))
    documents = [test["data"] for test in row["tests"]]
    for document in [*documents, *(m for d in documents[:2] for m in _mutants(d, [])[:25])]:
        tokens = tokenizer.encode(json.dumps(document, ensure_ascii=False), add_special_tokens=False)
        tokens.append(tokenizer.eos_token_id)
        accepted = backend.accept_prefix(backend.new_matcher(compiled), tokens) == len(tokens)
        assert not accepted or judge(row["schema"], document), document  # never an invalid document
