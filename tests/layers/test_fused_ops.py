"""The layers' fused Triton path (CUDA's default) against their plain torch path.

Each layer is built twice, plain and inside ``use_kernels(fastllm_kernels)``; on CPU the kernels
run in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

from fastllm import LLM, SamplingParams
from fastllm.layers.fused import use_kernels
from fastllm.layers.activation import SiluAndMul
from fastllm.layers.fused_moe import FusedMoE, TopKRouter
from fastllm.layers.layernorm import RMSNorm
from fastllm.layers.rotary import RotaryEmbedding

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _both(build, call):
    """``call(build())`` with the layer built for plain torch, then for the kernels."""
    import fastllm_kernels

    outputs = []
    for kernels in (None, fastllm_kernels):
        with use_kernels(kernels):
            layer = build()
        assert layer.kernels is kernels
        outputs.append(call(layer))
    return outputs


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 1e-2)])
def test_layers_match_torch(dtype, tol):
    torch.manual_seed(0)
    gain = torch.randn(96) * 0.2 + 1

    def norm() -> RMSNorm:
        layer = RMSNorm(96, 1e-6)
        layer.weight.data = gain.clone()
        return layer.to(DEVICE, dtype)

    x, residual = torch.randn(7, 96, dtype=dtype, device=DEVICE), torch.randn(7, 96, dtype=dtype, device=DEVICE)
    (out_a, res_a), (out_b, res_b) = _both(norm, lambda layer: layer(x, residual))
    assert _rel_err(out_b, out_a) < tol and _rel_err(res_b, res_a) < tol
    plain, fast = _both(norm, lambda layer: layer(x))
    assert _rel_err(fast, plain) < tol

    gate_up = torch.randn(5, 2 * 80, dtype=dtype, device=DEVICE)
    plain, fast = _both(SiluAndMul, lambda layer: layer(gate_up))
    assert _rel_err(fast, plain) < tol

    def rope() -> RotaryEmbedding:
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64}
        return RotaryEmbedding(32, 256, 10000.0, scaling).to(DEVICE)

    positions = torch.tensor([0, 3, 17, 200, 255], device=DEVICE)
    q, k = torch.randn(5, 4, 32, dtype=dtype, device=DEVICE), torch.randn(5, 2, 32, dtype=dtype, device=DEVICE)
    (qa, ka), (qb, kb) = _both(rope, lambda layer: layer(positions, q.clone(), k.clone()))
    assert _rel_err(qb, qa) < tol and _rel_err(kb, ka) < tol

    expert_weights: dict[str, torch.Tensor] = {}

    def moe() -> FusedMoE:
        layer = FusedMoE(TopKRouter(48, 8, 2, score_correction_bias=True, norm_min=1e-12), 32)
        for name, param in layer.named_parameters():
            param.data = expert_weights.setdefault(name, torch.randn(param.shape) / param.shape[-1] ** 0.5)
        return layer.to(DEVICE, dtype)

    tokens = torch.randn(19, 48, dtype=dtype, device=DEVICE)
    plain, fast = _both(moe, lambda layer: layer(tokens))
    assert _rel_err(fast, plain) < tol


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 1e-2)])
def test_moe_leaves_its_expert_sum_to_the_next_norm(dtype, tol):
    """One token over 32 experts (one pair a block): with the kernels, an MoE block that a norm
    follows returns its expert rows unsummed and the norm adds them, as the plain layers compute."""
    import fastllm_kernels

    torch.manual_seed(0)
    tokens, residual = torch.randn(1, 48, dtype=dtype, device=DEVICE), torch.randn(1, 48, dtype=dtype, device=DEVICE)
    weights: dict[str, torch.Tensor] = {}
    results = []
    for kernels in (None, fastllm_kernels):
        with use_kernels(kernels):
            moe, norm = FusedMoE(TopKRouter(48, 32, 2), 32), RMSNorm(48, 1e-6)
        for name, param in moe.named_parameters():
            param.data = weights.setdefault(name, torch.randn(param.shape) / param.shape[-1] ** 0.5)
        moe.leaves_pair_sum = True
        rows = moe.to(DEVICE, dtype)(tokens)
        results.append((rows.shape, norm.to(DEVICE, dtype)(rows, residual)))
    (plain_shape, (out_a, res_a)), (fast_shape, (out_b, res_b)) = results
    assert plain_shape == (1, 48) and fast_shape == (1, 2, 48)
    assert _rel_err(out_b, out_a) < tol and _rel_err(res_b, res_a) < tol and res_b.dtype == dtype


@pytest.mark.parametrize("mode", ["0", "1"])
def test_platform_chooses_the_kernels_at_construction(monkeypatch, tiny_llama_dir, mode):
    """``FASTLLM_TRITON_OPS`` is read once, when the model is built: every layer keeps that choice."""
    monkeypatch.setenv("FASTLLM_TRITON_OPS", mode)
    llm = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", block_size=16, max_model_len=128,
              num_gpu_blocks_override=32, enforce_eager=True)
    runner = llm.engine.runner.runner
    chosen = {layer.kernels is not None for layer in runner.model.modules() if hasattr(layer, "kernels")}
    assert chosen == {mode == "1"} and (runner.sampler.kernels is not None) == (mode == "1")


def test_greedy_output_unchanged(monkeypatch, tiny_llama_dir):
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (5, 19, 33)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    def greedy(mode: str) -> list[list[int]]:
        monkeypatch.setenv("FASTLLM_TRITON_OPS", mode)
        llm = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", block_size=16, max_model_len=128,
                  num_gpu_blocks_override=32, seed=0)
        return [o.outputs.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    plain = greedy("0")
    assert greedy("1") == plain
