"""MoE routing after the router's logits: softmax, top-k (optionally chosen on scores with a
correction bias, weighted by the softmax alone), renormalisation; one launch instead of the
six torch ops (softmax, add, topk, gather, sum, divide) that cost a batch-1 decode step more in
launches than in work, once per MoE layer.

At batch 1 the router's product is a 0.5 MB GEMV and the routing a few warp reductions: two
kernel boundaries cost more than both. ``route`` runs them as one launch there: each program
multiplies a tile of the router's rows by a slice of the token, parks its partial logits, and
the last to arrive (``fastllm_kernels.split_k``'s arrival) adds them in slice order and routes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastllm_kernels.linear import linear
from fastllm_kernels.pdl import pdl_launch, wait_for_inputs
from fastllm_kernels.split_k import scratch


@triton.jit
def _select(logits, bias_ptr, expert, valid, norm_min, TOP_K: tl.constexpr, SLOTS: tl.constexpr,
            EXPERTS: tl.constexpr, HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr):
    """One token's float32 ``logits [EXPERTS]`` (-inf where not ``valid``) -> (weights, ids) ``[SLOTS]``:
    softmax, then ``TOP_K`` rounds of argmax (the lowest expert on ties), each winner masked out."""
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
    return weights, chosen


@triton.jit
def _topk_softmax_kernel(logits_ptr, bias_ptr, weights_ptr, ids_ptr, num_experts, stride_row, norm_min,
                         TOP_K: tl.constexpr, SLOTS: tl.constexpr, EXPERTS: tl.constexpr, HAS_BIAS: tl.constexpr,
                         RENORMALIZE: tl.constexpr, PDL: tl.constexpr):
    """One token a program."""
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    expert = tl.arange(0, EXPERTS)
    valid = expert < num_experts
    logits = tl.load(logits_ptr + row * stride_row + expert, mask=valid, other=-float("inf")).to(tl.float32)
    weights, chosen = _select(logits, bias_ptr, expert, valid, norm_min, TOP_K, SLOTS, EXPERTS, HAS_BIAS, RENORMALIZE)
    slot = tl.arange(0, SLOTS)
    tl.store(weights_ptr + row * TOP_K + slot, weights, mask=slot < TOP_K)
    tl.store(ids_ptr + row * TOP_K + slot, chosen, mask=slot < TOP_K)


@triton.jit
def _router_topk_kernel(x_ptr, w_ptr, bias_ptr, ws_ptr, lock_ptr, weights_ptr, ids_ptr, num_experts, K, norm_min,
                        BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, TOP_K: tl.constexpr, SLOTS: tl.constexpr,
                        EXPERTS: tl.constexpr, HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr, PDL: tl.constexpr):
    """One token: program (e, s) multiplies router rows ``e * BLOCK_E ..`` by inputs ``s * BLOCK_K ..``
    (its weight tile loaded before the wait: no kernel writes them); the last program to arrive
    sums the slices' partial logits in order, rounds them to x's dtype (as the product's output
    would be) and routes."""
    pid_e, pid_k = tl.program_id(0), tl.program_id(1)
    rows = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    ks = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok, k_ok = rows < num_experts, ks < K
    w = tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
    wait_for_inputs(PDL)
    x = tl.load(x_ptr + ks, mask=k_ok, other=0.0)
    tl.store(ws_ptr + pid_k * EXPERTS + rows, tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1), mask=row_ok)
    tl.debug_barrier()  # every thread's partials are out before the release below
    arrived = tl.atomic_add(lock_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == tl.num_programs(0) * tl.num_programs(1) - 1:
        expert = tl.arange(0, EXPERTS)
        valid = expert < num_experts
        logits = tl.zeros((EXPERTS,), dtype=tl.float32)
        for split in range(tl.num_programs(1)):
            logits += tl.load(ws_ptr + split * EXPERTS + expert, mask=valid, other=0.0, cache_modifier=".cg")
        logits = tl.where(valid, logits.to(x_ptr.dtype.element_ty).to(tl.float32), -float("inf"))
        weights, chosen = _select(logits, bias_ptr, expert, valid, norm_min, TOP_K, SLOTS, EXPERTS, HAS_BIAS,
                                  RENORMALIZE)
        slot = tl.arange(0, SLOTS)
        tl.store(weights_ptr + slot, weights, mask=slot < TOP_K)
        tl.store(ids_ptr + slot, chosen, mask=slot < TOP_K)
        tl.atomic_xchg(lock_ptr, 0)


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


ROUTER_BLOCK_E, ROUTER_BLOCK_K = 8, 512  # a 8 KB tile of 16-bit router weights a program


def router_topk(hidden: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool = True,
                norm_min: float = 0.0, correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk_softmax(hidden @ weight^T, ...)`` of one token ``hidden [1, H]`` (``weight [E, H]``,
    contiguous) in one launch."""
    num_experts, k = weight.shape
    if hidden.shape != (1, k) or weight.stride(1) != 1 or weight.stride(0) != k:
        raise ValueError(f"router_topk takes one token [1, {k}] and contiguous rows, not {tuple(hidden.shape)}")
    experts = triton.next_power_of_2(num_experts)
    grid = (triton.cdiv(num_experts, ROUTER_BLOCK_E), triton.cdiv(k, ROUTER_BLOCK_K))
    weights = torch.empty((1, top_k), dtype=torch.float32, device=hidden.device)
    ids = torch.empty((1, top_k), dtype=torch.int64, device=hidden.device)
    workspace, counters = scratch(hidden.device)
    bias = hidden if correction_bias is None else correction_bias.reshape(-1)
    _router_topk_kernel[grid](
        hidden.contiguous(), weight, bias, workspace, counters, weights, ids, num_experts, k, norm_min,
        BLOCK_E=ROUTER_BLOCK_E, BLOCK_K=ROUTER_BLOCK_K, TOP_K=top_k, SLOTS=triton.next_power_of_2(top_k),
        EXPERTS=experts, HAS_BIAS=correction_bias is not None, RENORMALIZE=renormalize, num_warps=2,
        **pdl_launch(hidden.device))
    return weights, ids


def route(hidden: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool = True, norm_min: float = 0.0,
          correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's logits ``hidden [T, H] @ weight [E, H]^T`` in hidden's dtype, then ``topk_softmax``:
    one launch for one token on a GPU (``router_topk``), the GEMV or BLAS and the routing kernel otherwise."""
    if hidden.is_cuda and hidden.shape[0] == 1 and weight.dtype == hidden.dtype and weight.is_contiguous():
        return router_topk(hidden, weight, top_k, renormalize, norm_min, correction_bias)
    return topk_softmax(linear(hidden, weight), top_k, renormalize, norm_min, correction_bias)
