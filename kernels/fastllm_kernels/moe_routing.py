"""MoE routing after the router's logits: softmax, top-k (optionally chosen on scores with a
correction bias, weighted by the softmax alone), renormalisation; one launch instead of the
six torch ops (softmax, add, topk, gather, sum, divide) that cost a batch-1 decode step more in
launches than in work, once per MoE layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastllm_kernels.host_math import next_power_of_2
from fastllm_kernels.linear import DENSE, gemv_applies
from fastllm_kernels.pdl import pdl_launch, wait_for_inputs
from fastllm_kernels.quant.weight_gemm import weight_gemm


@triton.jit
def _topk_softmax_kernel(logits_ptr, bias_ptr, weights_ptr, ids_ptr, num_experts, stride_row, stride_term,
                         norm_min, TOP_K: tl.constexpr, SLOTS: tl.constexpr, EXPERTS: tl.constexpr,
                         TERMS: tl.constexpr, HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr, PDL: tl.constexpr):
    """One token a program: its ``TERMS`` partial logits summed, float32 softmax, then ``TOP_K``
    rounds of argmax (the lowest expert on ties), each winner masked out of the scores."""
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    expert = tl.arange(0, EXPERTS)
    valid = expert < num_experts
    logits = tl.load(logits_ptr + row * stride_row + expert, mask=valid, other=-float("inf")).to(tl.float32)
    for term in tl.static_range(1, TERMS):
        logits += tl.load(logits_ptr + row * stride_row + term * stride_term + expert, mask=valid,
                          other=0.0).to(tl.float32)
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
