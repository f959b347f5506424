"""``quantize_lm_head``: the LM head in weight-only int8 beside any method (or none), tied or not."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from fastllm.engine.in_process import engine_model
from fastllm.quantization import QuantizedLinear, weight_bytes

from quant_helpers import TINY_LLAMA, prompt_logprobs, random_float_weights, tiny_llm, tiny_prompts, write_checkpoint

# the head is int8 per channel whatever the body: ||head(x) - x W^T|| / ||x W^T|| stays under this
HEAD_ERROR = 0.01


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory) -> str:
    return write_checkpoint(str(tmp_path_factory.mktemp("float")), random_float_weights())


@pytest.mark.parametrize("method", [None, "weight_only_int8", "fp8", "nf4", "weight_only_int4"])
def test_quantized_head_computes_the_float_head(float_dir, method):
    float_head = random_float_weights()["lm_head.weight"]
    body_only = tiny_llm(float_dir, quantization=method)
    llm = tiny_llm(float_dir, quantization=method, quantize_lm_head=True)
    head = engine_model(llm).lm_head
    assert isinstance(head.quantized, QuantizedLinear) and head.weight is None
    head_bytes = float_head.numel() * float_head.element_size()
    assert weight_bytes(engine_model(llm)) < weight_bytes(engine_model(body_only)) - head_bytes / 2
    hidden = torch.randn(32, float_head.shape[1], generator=torch.Generator().manual_seed(3))
    reference = F.linear(hidden.double(), float_head.double())
    error = (head(hidden).double() - reference).norm() / reference.norm()
    assert 0 < error < HEAD_ERROR
    # end to end: the same prompts score about the same with and without the quantized head
    prompts = tiny_prompts()
    drift = (prompt_logprobs(llm, prompts) - prompt_logprobs(body_only, prompts)).abs().mean()
    assert 0 < drift < 4 * HEAD_ERROR


def test_tied_head_keeps_the_embedding(tmp_path):
    weights = random_float_weights()
    del weights["lm_head.weight"]
    folder = write_checkpoint(str(tmp_path), weights)
    config_path = f"{folder}/config.json"
    with open(config_path, "w") as f:
        json.dump(dict(TINY_LLAMA, tie_word_embeddings=True), f)
    model = engine_model(tiny_llm(folder, quantization="weight_only_int8", quantize_lm_head=True))
    assert isinstance(model.lm_head.quantized, QuantizedLinear)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.model.embed_tokens.weight, weights["model.embed_tokens.weight"])

