"""JSONSchemaBench's maskbench test documents, fed token by token (SmolLM2's tokenizer) through
each backend's matcher, every token checked against the mask and the stop token at the end: for a
schema the backend compiles strictly (claims to enforce exactly), each invalid document is
rejected and each valid one accepted. A small fixed subset of the benchmark's sample (drawn with a
seed among its schemas under 1,500 characters; o58906 once caught xgrammar's length rewrite
letting a too-short string through), kept small for the suite's time: the benchmark runs them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fastllm import registry
from fastllm.model_loader.resolve import embedded_model_path, load_tokenizer, resolve_load_format
from fastllm.sampling_params import GuidedDecodingParams

SAMPLE = Path(__file__).parents[2] / "benchmarks" / "data" / "jsonschemabench_sample.jsonl"
SUBSET = ["Github_easy/o42285.json", "Github_easy/o58906.json", "Glaiveai2K/generate_random_password_60146e8c.json",
          "Glaiveai2K/calculate_area_68f705e0.json", "Kubernetes/kb_608_Normalized.json",
          "WashingtonPost/wp_38_Normalized.json"]
BACKENDS = ["xgrammar", "llguidance", "auto"]
VOCAB = 49152


@pytest.fixture(scope="module")
def tokenizer():
    path = embedded_model_path()
    return load_tokenizer(registry.get("load_formats", resolve_load_format(path, "auto"))(), path, None)


@pytest.fixture(scope="module")
def backends(tokenizer):
    pytest.importorskip("fastllm_xgrammar")
    pytest.importorskip("fastllm_llguidance")
    return {name: registry.get("structured_output_backends", name)(tokenizer, VOCAB) for name in BACKENDS}


@pytest.fixture(scope="module")
def records():
    rows = (json.loads(line) for line in SAMPLE.read_text().splitlines() if line)
    return {f"{row['split']}/{row['id']}": row for row in rows}


def accepts(backend, matcher, tokens: list[int]) -> bool:
    logits = torch.zeros(1, VOCAB)
    for token in tokens:
        logits.zero_()
        backend.apply_bitmask(logits, [matcher])
        if torch.isinf(logits[0, token]):
            return False
        backend.accept_tokens([matcher], [token])
    return True


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("record_id", SUBSET)
def test_documents_are_accepted_exactly_when_valid(backends, tokenizer, records, name, record_id):
    record, backend = records[record_id], backends[name]
    try:
        compiled = backend.compile(GuidedDecodingParams(json=record["schema"], strict=True))
    except ValueError as exc:
        assert str(exc).strip()  # refused: no claim made, but never without a reason
        pytest.skip(f"{name} refuses it: {exc}")
    for test in record["tests"]:  # maskbench's labels (which, unlike jsonschema's default, assert formats)
        text = json.dumps(test["data"], ensure_ascii=False)  # the one-line form both backends write
        tokens = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        assert accepts(backend, backend.new_matcher(compiled), tokens) == test["valid"], text
