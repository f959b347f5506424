"""``quantization="fp8"`` on an MoE model: the routed experts become e4m3 with per-channel scales
(beside every linear layer), the router stays float, and the model still predicts its prompt."""

from __future__ import annotations

import torch

from fastllm import LLM
from fastllm.engine.in_process import engine_model
from fastllm.layers.fused_moe import FusedMoE
from tests.models.test_moe_quantization import _prompt_logprobs
from tests.models.tiny_checkpoints import save_tiny_checkpoint


def test_fp8_quantizes_the_routed_experts(tmp_path):
    folder, _ = save_tiny_checkpoint("qwen3_moe", tmp_path)
    expected = _prompt_logprobs(LLM(folder, dtype="float32", num_gpu_blocks_override=16))
    llm = LLM(folder, dtype="float32", quantization="fp8", num_gpu_blocks_override=16)

    moe = engine_model(llm).model.layers[0].mlp
    assert isinstance(moe, FusedMoE) and moe.w13.dtype == moe.w2.dtype == torch.float8_e4m3fn
    assert moe.w13_scale.shape == moe.w13.shape[:2] and moe.w2_scale.shape == moe.w2.shape[:2]
    assert moe.gate.weight.dtype == torch.float32
    # mean |logprob error| per prompt token: twice what these loud random weights measured (the CPU
    # path rounds the activations of the linear layers to e4m3 too)
    assert (_prompt_logprobs(llm) - expected).abs().mean().item() < 0.3
