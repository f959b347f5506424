"""The layers' fused Triton path (CUDA's default) against their plain torch path.

On CPU ``FASTLLM_TRITON_OPS`` is forced on and the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

from fastllm import LLM, SamplingParams
from fastllm.layers import fused
from fastllm.layers.activation import SiluAndMul
from fastllm.layers.fused_moe import FusedMoE, TopKRouter
from fastllm.layers.layernorm import RMSNorm
from fastllm.layers.rotary import RotaryEmbedding

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _both(fn, monkeypatch):
    """``fn()`` through plain torch, then through the kernels."""
    monkeypatch.setattr(fused, "MODE", "0")
    plain = fn()
    monkeypatch.setattr(fused, "MODE", "1")
    assert fused.kernels_for(torch.empty(0)) is not None, "fastllm-kernels is not installed"
    return plain, fn()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 1e-2)])
def test_layers_match_torch(monkeypatch, dtype, tol):
    torch.manual_seed(0)
    norm = RMSNorm(96, 1e-6)
    norm.weight.data = torch.randn(96) * 0.2 + 1
    norm = norm.to(DEVICE, dtype)
    x, residual = torch.randn(7, 96, dtype=dtype, device=DEVICE), torch.randn(7, 96, dtype=dtype, device=DEVICE)
    (out_a, res_a), (out_b, res_b) = _both(lambda: norm(x, residual), monkeypatch)
    assert _rel_err(out_b, out_a) < tol and _rel_err(res_b, res_a) < tol
    plain, fast = _both(lambda: norm(x), monkeypatch)
    assert _rel_err(fast, plain) < tol

    gate_up = torch.randn(5, 2 * 80, dtype=dtype, device=DEVICE)
    plain, fast = _both(lambda: SiluAndMul()(gate_up), monkeypatch)
    assert _rel_err(fast, plain) < tol

    rope = RotaryEmbedding(32, 256, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    rope = rope.to(DEVICE)
    positions = torch.tensor([0, 3, 17, 200, 255], device=DEVICE)
    q, k = torch.randn(5, 4, 32, dtype=dtype, device=DEVICE), torch.randn(5, 2, 32, dtype=dtype, device=DEVICE)
    (qa, ka), (qb, kb) = _both(lambda: rope(positions, q.clone(), k.clone()), monkeypatch)
    assert _rel_err(qb, qa) < tol and _rel_err(kb, ka) < tol

    moe = FusedMoE(TopKRouter(48, 8, 2, score_correction_bias=True, norm_min=1e-12), 32)
    for param in moe.parameters():
        param.data = torch.randn(param.shape) / param.shape[-1] ** 0.5
    moe = moe.to(DEVICE, dtype)
    tokens = torch.randn(19, 48, dtype=dtype, device=DEVICE)
    plain, fast = _both(lambda: moe(tokens), monkeypatch)
    assert _rel_err(fast, plain) < tol


def test_greedy_output_unchanged(monkeypatch, tiny_llama_dir):
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (5, 19, 33)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    def greedy() -> list[list[int]]:
        llm = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", block_size=16, max_model_len=128,
                  num_gpu_blocks_override=32, seed=0)
        return [o.outputs.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    plain, fast = _both(greedy, monkeypatch)
    assert fast == plain
