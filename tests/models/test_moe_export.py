"""``fastllm quantize`` on an MoE model: the routed experts are written under their HF names (one
tensor an expert and projection, with ``.weight_scale`` / ``.weight_zero`` beside), and the
directory loads back with no flag into the same expert codes that online quantization makes."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors import safe_open

from fastllm import LLM
from fastllm.engine.in_process import engine_model
from fastllm.entrypoints.cli.main import main
from fastllm.layers.fused_moe import FusedMoE
from tests.models.test_moe_quantization import _prompt_logprobs
from tests.models.tiny_checkpoints import save_tiny_checkpoint

EXPERT_TENSORS = ("w13", "w2", "w13_scale", "w2_scale", "w13_zero", "w2_zero", "book")


def _tensor_names(folder: str) -> set[str]:
    names: set[str] = set()
    for file in os.listdir(folder):
        if file.endswith(".safetensors"):
            with safe_open(os.path.join(folder, file), "pt") as f:
                names.update(f.keys())
    return names


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory) -> str:
    folder, _ = save_tiny_checkpoint("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"))
    return folder


@pytest.mark.parametrize("method", ["fp8", "weight_only_int4", "nf4"])
def test_quantized_experts_round_trip(tmp_path, qwen3_moe, method):
    out = str(tmp_path / method)
    assert main(["quantize", "-i", qwen3_moe, "-o", out, "-quant_type", method, "-t", "fp16"]) == 0

    hf_experts = {name for name in _tensor_names(qwen3_moe) if ".experts." in name}
    saved_experts = {name for name in _tensor_names(out) if ".experts." in name or ".mlp.w" in name}
    assert hf_experts == {f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight" for layer in (0, 2) for e in range(8)
                          for proj in ("gate_proj", "up_proj", "down_proj")}
    leaves = {"weight", "weight_scale"} | ({"weight_zero"} if method == "weight_only_int4" else set())
    assert saved_experts == {name.replace(".weight", f".{leaf}") for name in hf_experts for leaf in leaves}

    loaded = LLM(out, dtype="float32", num_gpu_blocks_override=16)
    online = LLM(qwen3_moe, dtype="float32", quantization=method, num_gpu_blocks_override=16)
    moes = [(module, engine_model(loaded).get_submodule(name)) for name, module in engine_model(online).named_modules()
            if isinstance(module, FusedMoE)]
    assert len(moes) == 2
    for expected, actual in moes:
        for name in EXPERT_TENSORS:
            want, got = getattr(expected, name), getattr(actual, name)
            assert (want is None) == (got is None), name
            if want is None:
                continue
            assert want.dtype == got.dtype and want.shape == got.shape, name
            if name in ("w13", "w2", "book"):  # the same codes, bit for bit
                assert torch.equal(want, got), name
            else:  # scales and zeros went through fp16 storage
                torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    reference = _prompt_logprobs(LLM(qwen3_moe, dtype="float32", num_gpu_blocks_override=16))
    saved_error = (_prompt_logprobs(loaded) - reference).abs().mean()
    online_error = (_prompt_logprobs(online) - reference).abs().mean()
    assert saved_error <= 1.2 * online_error + 0.01
