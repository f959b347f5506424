"""A quantized MoE model written by ``save_quantized`` (what ``fastllm quantize`` calls) keeps its
architecture's HF names (Mixtral's ``block_sparse_moe.experts.{e}.w1``), one tensor per expert and
projection, and loads back with no flag into the same model: the same greedy tokens as the
quantized model it was written from."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors import safe_open

from fastllm import LLM, SamplingParams
from fastllm.engine.in_process import engine_model
from fastllm.layers.fused_moe import FusedMoE
from fastllm.quantization.export import save_quantized
from fastllm.registry import registry
from tests.models.test_moe_quantization import PROMPT
from tests.models.tiny_checkpoints import save_tiny_checkpoint

EXPERT_LEAVES = {"fp8": ("weight", "weight_scale"), "weight_only_int4": ("weight", "weight_scale", "weight_zero"),
                 "nf4": ("weight", "weight_scale")}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8) if tensor.element_size() == 1 else tensor


def _greedy(llm: LLM) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    return llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs.token_ids


@pytest.mark.parametrize("model_type, method", [("qwen3_moe", "fp8"), ("ernie4_5_moe", "fp8"), ("mixtral", "fp8"),
                                                ("qwen3_moe", "weight_only_int4"), ("qwen3_moe", "nf4")])
def test_quantized_moe_round_trip(tmp_path, model_type, method):
    folder, _ = save_tiny_checkpoint(model_type, tmp_path / "float")
    online = LLM(folder, dtype="float32", quantization=method, num_gpu_blocks_override=16)
    out = str(tmp_path / "quantized")
    save_quantized(engine_model(online), online.engine.hf_config, None, registry.get("quantizers", method)(None),
                   out, torch.float32)

    with safe_open(f"{out}/model.safetensors", "pt") as f:
        names = set(f.keys())
    with safe_open(f"{folder}/model.safetensors", "pt") as f:
        hf_names = set(f.keys())  # as transformers saved the float model
    layer = 1 if model_type == "ernie4_5_moe" else 0  # the first MoE layer
    expert = [name for name in hf_names if f"layers.{layer}." in name and ".experts.7." in name]
    assert len(expert) == 3  # its gate, up and down projections
    for name in expert:
        for leaf in EXPERT_LEAVES[method]:
            assert name.removesuffix("weight") + leaf in names
    if method == "fp8":  # exactly the HF names, plus a scale beside each quantized weight
        scales = {name for name in names if name.endswith(".weight_scale")}
        assert names - scales == hf_names
        assert {name.removesuffix("_scale") for name in scales} <= hf_names
    assert not [name for name in names if re.search(r"\.(w13|w2)(_scale|_zero)?$", name)]  # no stacked experts

    loaded = LLM(out, dtype="float32", num_gpu_blocks_override=16)
    written, read = engine_model(online).model.layers[layer].mlp, engine_model(loaded).model.layers[layer].mlp
    assert isinstance(read, FusedMoE)
    for name in ("w13", "w2", "w13_scale", "w2_scale", "w13_zero", "w2_zero", "book"):
        expected = getattr(written, name)
        assert (expected is None) == (getattr(read, name) is None)
        if expected is not None:
            assert getattr(read, name).dtype == expected.dtype
            assert torch.equal(_bits(getattr(read, name)), _bits(expected)), name
    assert _greedy(loaded) == _greedy(online)
