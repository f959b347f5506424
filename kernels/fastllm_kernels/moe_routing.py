"""MoE routing after the router's logits: softmax, top-k (optionally chosen on scores with a
correction bias, weighted by the softmax alone), renormalisation; one launch instead of the
six torch ops (softmax, add, topk, gather, sum, divide) that cost a batch-1 decode step more in
launches than in work, once per MoE layer. For one token (batch-1 decode) the router's GEMV
and the routing are one launch (``router_topk``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastllm_kernels.host_math import cdiv, next_power_of_2
from fastllm_kernels.linear import DENSE, gemv_applies
from fastllm_kernels.pdl import pdl_launch, release_dependents, wait_for_inputs, wait_for_inputs_held
from fastllm_kernels.quant.weight_gemm import weight_gemm
from fastllm_kernels.split_k import scratch

ROUTER_ROW_BYTES = 8192  # router weight bytes a program of the one-token routing takes, if more than a row
ROUTER_WARP_BYTES = 16384  # of a row, a warp's registers hold


@triton.jit
def _score_bias(bias_ptr, num_experts, EXPERTS: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The score-correction bias ``[EXPERTS]`` in float32 (zeros without one, unused: Triton 3.6
    returns no None from a function): a parameter, so loaded before the wait."""
    expert = tl.arange(0, EXPERTS)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert, mask=expert < num_experts, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros((EXPERTS,), dtype=tl.float32)
    return bias


@triton.jit
def _route(logits, expert, valid, bias, weights_ptr, ids_ptr, row, norm_min, TOP_K: tl.constexpr,
           SLOTS: tl.constexpr, EXPERTS: tl.constexpr, HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr):
    """One token's float32 ``logits [EXPERTS]`` (``-inf`` where not ``valid``): softmax, then
    ``TOP_K`` rounds of argmax (the lowest expert on ties), each winner masked out of the scores
    (``bias``, from ``_score_bias``, added to them); stores the weights and ids of row ``row``.
    Without a bias the winning score is the weight: no third reduction a round."""
    probs = tl.exp(logits - tl.max(logits, 0))
    probs = probs / tl.sum(probs, 0)
    scores = probs
    if HAS_BIAS:
        scores += bias
    scores = tl.where(valid, scores, -float("inf"))
    slot = tl.arange(0, SLOTS)
    chosen = tl.zeros((SLOTS,), dtype=tl.int64)
    weights = tl.zeros((SLOTS,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        top = tl.max(scores, 0)
        best = tl.min(tl.where(scores == top, expert, EXPERTS), 0)
        chosen = tl.where(slot == j, best, chosen)
        if HAS_BIAS:
            weight = tl.sum(tl.where(expert == best, probs, 0.0), 0)  # its probability, not its score
        else:
            weight = top  # the scores are the probabilities
        weights = tl.where(slot == j, weight, weights)
        scores = tl.where(expert == best, -float("inf"), scores)
    if RENORMALIZE:
        weights = weights / tl.maximum(tl.sum(weights, 0), norm_min)
    tl.store(weights_ptr + row * TOP_K + slot, weights, mask=slot < TOP_K)
    tl.store(ids_ptr + row * TOP_K + slot, chosen, mask=slot < TOP_K)


@triton.jit
def _topk_softmax_kernel(logits_ptr, bias_ptr, weights_ptr, ids_ptr, num_experts, stride_row, stride_term,
                         norm_min, TOP_K: tl.constexpr, SLOTS: tl.constexpr, EXPERTS: tl.constexpr,
                         TERMS: tl.constexpr, HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr, PDL: tl.constexpr):
    """One token a program: its ``TERMS`` partial logits summed, then routed."""
    bias = _score_bias(bias_ptr, num_experts, EXPERTS, HAS_BIAS)
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    expert = tl.arange(0, EXPERTS)
    valid = expert < num_experts
    logits = tl.load(logits_ptr + row * stride_row + expert, mask=valid, other=-float("inf")).to(tl.float32)
    for term in tl.static_range(1, TERMS):
        logits += tl.load(logits_ptr + row * stride_row + term * stride_term + expert, mask=valid,
                          other=0.0).to(tl.float32)
    _route(logits, expert, valid, bias, weights_ptr, ids_ptr, row, norm_min, TOP_K, SLOTS, EXPERTS, HAS_BIAS,
           RENORMALIZE)


@triton.jit
def _router_topk_kernel(x_ptr, w_ptr, bias_ptr, logits_ptr, lock_ptr, weights_ptr, ids_ptr, num_experts, K,
                        norm_min, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, ROUND: tl.constexpr,
                        TOP_K: tl.constexpr, SLOTS: tl.constexpr, EXPERTS: tl.constexpr, HAS_BIAS: tl.constexpr,
                        RENORMALIZE: tl.constexpr, PDL: tl.constexpr):
    """One token: a program takes ``ROWS`` experts' logits (their weight rows, loaded before the
    wait: no kernel writes them), parks them in float32 and bumps an arrival counter; the last
    program to arrive routes the token (as ``split_k``'s GEMMs meet). ``ROUND``: the logits round
    to x's dtype first, as a 16-bit router's output does."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ks = tl.arange(0, BLOCK_K)
    inside = (rows[:, None] < num_experts) & (ks[None, :] < K)
    w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + ks[None, :], mask=inside, other=0.0)
    bias = _score_bias(bias_ptr, num_experts, EXPERTS, HAS_BIAS)  # for the last program, which routes
    wait_for_inputs_held(PDL)  # the experts' GEMV launches when the last program routes
    x = tl.load(x_ptr + ks, mask=ks < K, other=0.0)
    logits = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
    if ROUND:
        logits = logits.to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(logits_ptr + rows, logits, mask=rows < num_experts)
    tl.debug_barrier()  # the logits are out before the release below
    arrived = tl.atomic_add(lock_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == tl.num_programs(0) - 1:
        release_dependents(PDL)
        expert = tl.arange(0, EXPERTS)
        valid = expert < num_experts
        every = tl.load(logits_ptr + expert, mask=valid, other=-float("inf"), cache_modifier=".cg")
        _route(every, expert, valid, bias, weights_ptr, ids_ptr, 0, norm_min, TOP_K, SLOTS, EXPERTS, HAS_BIAS,
               RENORMALIZE)
        tl.atomic_xchg(lock_ptr, 0)


def topk_softmax(logits: torch.Tensor, top_k: int, renormalize: bool = True, norm_min: float = 0.0,
                 correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [T, E]`` -> (``topk_weights [T, k]`` float32, ``topk_ids [T, k]`` int64), best first.
    ``logits [T, S, E]``: S partial logits a token, summed first (a float32 router's bfloat16
    terms). ``correction_bias [E]`` (or ``[1, E]``) shifts the choice, not the weights; renormalised
    weights are divided by ``max(sum, norm_min)``."""
    if logits.dim() == 2:
        logits = logits[:, None]
    tokens, terms, num_experts = logits.shape
    if logits.stride(2) != 1:
        logits = logits.contiguous()
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int64, device=logits.device)
    if tokens:
        bias = logits if correction_bias is None else correction_bias.reshape(-1)
        _topk_softmax_kernel[(tokens,)](
            logits, bias, weights, ids, num_experts, logits.stride(0), logits.stride(1), norm_min, TOP_K=top_k,
            SLOTS=next_power_of_2(top_k), EXPERTS=next_power_of_2(num_experts), TERMS=terms,
            HAS_BIAS=correction_bias is not None, RENORMALIZE=renormalize, num_warps=1 if num_experts <= 256 else 4,
            **pdl_launch(logits.device))
    return weights, ids


def router_topk(hidden: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool = True,
                norm_min: float = 0.0, correction_bias: torch.Tensor | None = None,
                round_logits: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's router and routing in one launch (batch-1 decode): ``hidden [1, H]`` against
    ``weight [E, H]`` (hidden's dtype, or float32: ERNIE's router) -> ``topk_softmax(hidden @
    weight.T, ...)``. A decode step's MoE layer otherwise spends two dependent launches here, each
    a few microseconds of latency for a few hundred KiB. ``round_logits``: the logits round to
    hidden's dtype before the softmax, as a 16-bit router's output does."""
    num_experts, features = weight.shape
    if hidden.shape != (1, features) or weight.stride(1) != 1 or weight.stride(0) != features:
        raise ValueError(f"router_topk takes one row of {features} features and a contiguous weight, "
                         f"got {tuple(hidden.shape)} and {tuple(weight.shape)}")
    hidden = hidden.contiguous()
    workspace, counters = scratch(hidden.device)
    weights = torch.empty((1, top_k), dtype=torch.float32, device=hidden.device)
    ids = torch.empty((1, top_k), dtype=torch.int64, device=hidden.device)
    bias = weight if correction_bias is None else correction_bias.reshape(-1)
    rows, block_k, num_warps = router_tiling(num_experts, features, weight.element_size())
    _router_topk_kernel[(cdiv(num_experts, rows),)](
        hidden, weight, bias, workspace, counters, weights, ids, num_experts, features, norm_min, ROWS=rows,
        BLOCK_K=block_k, ROUND=round_logits, TOP_K=top_k, SLOTS=next_power_of_2(top_k),
        EXPERTS=next_power_of_2(num_experts), HAS_BIAS=correction_bias is not None, RENORMALIZE=renormalize,
        num_warps=num_warps, **pdl_launch(hidden.device))
    return weights, ids


def router_tiling(num_experts: int, features: int, weight_bytes: int) -> tuple[int, int, int]:
    """``router_topk``'s (experts a program, BLOCK_K, warps): a few rows a program, so that fewer
    programs meet on the one counter; one warp while a row fits its registers, so that the last
    program's argmax rounds stay in shuffles."""
    block_k = next_power_of_2(features)
    row_bytes = block_k * weight_bytes
    rows = min(max(1, ROUTER_ROW_BYTES // row_bytes), next_power_of_2(num_experts))
    return rows, block_k, max(1, min(8, row_bytes // ROUTER_WARP_BYTES))


def bfloat16_terms(weight: torch.Tensor) -> torch.Tensor:
    """``weight [E, H]`` (float32) as three bfloat16 matrices stacked ``[3E, H]`` whose sum is the
    weight to float32 precision (8 significant bits each)."""
    terms, rest = [], weight.float()
    for _ in range(3):
        term = rest.to(torch.bfloat16)
        terms.append(term)
        rest = rest - term.float()
    return torch.cat(terms)


def float32_router_logits(hidden: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
    """A float32 router's partial logits ``[T, 3, E]`` for bfloat16 ``hidden [T, H]``, against its
    weight's ``bfloat16_terms``: one 16-bit GEMM with float32 output, no widened copy of the rows and
    no float32 GEMM. A bfloat16 row widens to float32 exactly and the tensor cores multiply 16-bit
    operands exactly into float32, so the terms' sum (``topk_softmax`` adds them) is the float32
    product up to the order of the additions. One row (batch-1 decode) takes the dependent-launch
    GEMV with float32 output (its FMAs are float32 too) instead of a BLAS call that cannot start
    before the norm ends. CPU tensors (the interpreter's) take a float32 GEMM."""
    if gemv_applies(hidden, terms, None):
        logits = weight_gemm(hidden.reshape(1, -1), terms, None, None, None, DENSE, out_dtype=torch.float32)
    elif hidden.is_cuda:
        logits = torch.mm(hidden, terms.t(), out_dtype=torch.float32)
    else:
        logits = hidden.float() @ terms.float().t()
    return logits.view(len(hidden), 3, -1)
