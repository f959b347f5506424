"""MoE routing: the router's float32 logits, then softmax, top-k (optionally chosen on scores with
a correction bias, weighted by the softmax alone), renormalisation; one launch instead of the
six torch ops (softmax, add, topk, gather, sum, divide) that cost a batch-1 decode step more in
launches than in work, once per MoE layer.

A float32 router over 16-bit activations (ERNIE-4.5) cost a widened copy of the activations and
a GEMM on the CUDA cores (no tensor cores in float32): 140 us a layer in a step of 8,192 tokens,
more than the layer's attention projections. ``router_logits`` reads the 16-bit rows as they are
(exact in tf32) and multiplies on the tensor cores in three tf32 passes (the weights split into
a high and a low tf32 part), about float32's precision.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastllm_kernels.pdl import pdl_launch, wait_for_inputs


@triton.jit
def _topk_softmax_kernel(logits_ptr, bias_ptr, weights_ptr, ids_ptr, num_experts, stride_row, norm_min,
                         TOP_K: tl.constexpr, SLOTS: tl.constexpr, EXPERTS: tl.constexpr, HAS_BIAS: tl.constexpr,
                         RENORMALIZE: tl.constexpr, PDL: tl.constexpr):
    """One token a program: float32 softmax, then ``TOP_K`` rounds of argmax (the lowest expert
    on ties), each winner masked out of the scores."""
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    expert = tl.arange(0, EXPERTS)
    valid = expert < num_experts
    logits = tl.load(logits_ptr + row * stride_row + expert, mask=valid, other=-float("inf")).to(tl.float32)
    probs = tl.exp(logits - tl.max(logits, 0))
    probs = probs / tl.sum(probs, 0)
    scores = probs
    if HAS_BIAS:
        scores += tl.load(bias_ptr + expert, mask=valid, other=0.0).to(tl.float32)
    scores = tl.where(valid, scores, -float("inf"))
    slot = tl.arange(0, SLOTS)
    chosen = tl.zeros((SLOTS,), dtype=tl.int64)
    weights = tl.zeros((SLOTS,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.min(tl.where(scores == tl.max(scores, 0), expert, EXPERTS), 0)
        chosen = tl.where(slot == j, best, chosen)
        weights = tl.where(slot == j, tl.sum(tl.where(expert == best, probs, 0.0), 0), weights)
        scores = tl.where(expert == best, -float("inf"), scores)
    if RENORMALIZE:
        weights = weights / tl.maximum(tl.sum(weights, 0), norm_min)
    tl.store(weights_ptr + row * TOP_K + slot, weights, mask=slot < TOP_K)
    tl.store(ids_ptr + row * TOP_K + slot, chosen, mask=slot < TOP_K)


def topk_softmax(logits: torch.Tensor, top_k: int, renormalize: bool = True, norm_min: float = 0.0,
                 correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [T, E]`` -> (``topk_weights [T, k]`` float32, ``topk_ids [T, k]`` int64), best first.
    ``correction_bias [E]`` (or ``[1, E]``) shifts the choice, not the weights; renormalised
    weights are divided by ``max(sum, norm_min)``."""
    tokens, num_experts = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int64, device=logits.device)
    if tokens:
        bias = logits if correction_bias is None else correction_bias.reshape(-1)
        _topk_softmax_kernel[(tokens,)](
            logits, bias, weights, ids, num_experts, logits.stride(0), norm_min, TOP_K=top_k,
            SLOTS=triton.next_power_of_2(top_k), EXPERTS=triton.next_power_of_2(num_experts),
            HAS_BIAS=correction_bias is not None, RENORMALIZE=renormalize, num_warps=1 if num_experts <= 256 else 4,
            **pdl_launch(logits.device))
    return weights, ids


@triton.jit
def _router_logits_kernel(x_ptr, w_ptr, out_ptr, tokens, num_experts, K, stride_x, BLOCK_T: tl.constexpr,
                          BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """``out [T, E] = x [T, K] @ w [E, K]^T`` for one tile of tokens and experts, float32 out."""
    wait_for_inputs(PDL)
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    acc = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_x + ks[None, :],
                    mask=(rows < tokens)[:, None] & (ks < K)[None, :], other=0.0)
        w = tl.load(w_ptr + experts[:, None] * K + ks[None, :], mask=(experts < num_experts)[:, None] & (ks < K)[None, :],
                    other=0.0)
        acc = tl.dot(x.to(tl.float32), tl.trans(w), acc, input_precision="tf32x3")
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * num_experts + experts[None, :], acc,
             mask=(rows < tokens)[:, None] & (experts < num_experts)[None, :])


def router_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``hidden [T, H]`` (any float type) by a float32 router ``weight [E, H]`` -> float32 ``[T, E]``."""
    if weight.dtype != torch.float32 or weight.stride(1) != 1 or hidden.stride(1) != 1:
        raise ValueError(f"router_logits takes a contiguous float32 router and rows of contiguous inputs, not "
                         f"{weight.dtype} {tuple(weight.stride())} / {tuple(hidden.stride())}")
    tokens, num_experts = hidden.shape[0], weight.shape[0]
    out = torch.empty((tokens, num_experts), dtype=torch.float32, device=hidden.device)
    # a few tokens: thin tiles, many programs (each a weight stream); a prefill: tensor-core tiles
    block_t, block_e, block_k = (16, 16, 128) if tokens <= 1024 else (64, 64, 32)
    if tokens:
        _router_logits_kernel[(triton.cdiv(tokens, block_t), triton.cdiv(num_experts, block_e))](
            hidden, weight, out, tokens, num_experts, hidden.shape[1], hidden.stride(0), BLOCK_T=block_t,
            BLOCK_E=block_e, BLOCK_K=block_k, **pdl_launch(hidden.device))
    return out
