import pytest
import torch

from fastllm_kernels.moe_routing import bfloat16_terms, topk_softmax
from kernel_testing import DEVICE, DTYPES, randn


def routing_ref(logits, top_k, renormalize, norm_min, bias):
    """transformers' routers in float64: softmax, choice on softmax (+ bias), softmax weights."""
    probs = torch.softmax(logits.double(), dim=-1)
    scores = probs if bias is None else probs + bias.double()
    ids = torch.topk(scores, top_k, dim=-1).indices
    weights = probs.gather(-1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True).clamp(min=norm_min)
    return weights, ids


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,experts,top_k,renormalize,norm_min,with_bias", [
    (1, 8, 2, True, 0.0, False),        # Mixtral-like
    (5, 128, 8, True, 0.0, False),      # Qwen3-MoE
    (9, 60, 4, False, 0.0, False),      # experts not a power of two, raw softmax weights
    (7, 64, 6, True, 1e-12, True),      # ERNIE-4.5: bias-corrected choice
])
def test_topk_softmax_matches_reference(dtype, tokens, experts, top_k, renormalize, norm_min, with_bias):
    logits = 2 * randn(tokens, experts, dtype=dtype)
    bias = torch.rand(1, experts, device=DEVICE) / 4 if with_bias else None

    weights, ids = topk_softmax(logits, top_k, renormalize, norm_min, bias)

    ref_weights, ref_ids = routing_ref(logits, top_k, renormalize, norm_min, bias)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64
    # 16-bit logits tie often: any of the tied experts is right, so compare the scores chosen
    probs = torch.softmax(logits.double(), dim=-1)
    scores = probs if bias is None else probs + bias.double()
    assert torch.equal(scores.gather(-1, ids), scores.gather(-1, ref_ids))
    chosen = probs.gather(-1, ids)
    if renormalize:
        chosen = chosen / chosen.sum(-1, keepdim=True).clamp(min=norm_min)
    assert torch.allclose(weights.double(), chosen, rtol=1e-5, atol=1e-7)
    assert torch.allclose(weights.double(), ref_weights, rtol=1e-5, atol=1e-7)
    if with_bias:  # the bias changed some choice, so the test sees it
        assert not torch.equal(ids.cpu(), routing_ref(logits, top_k, renormalize, norm_min, None)[1].cpu())


def test_partial_logits_are_summed_before_the_softmax():
    """A float32 router's bfloat16 terms arrive as ``[T, 3, E]``: the kernel routes their sum."""
    torch.manual_seed(0)
    parts = randn(6, 3, 64, dtype=torch.float32)
    parts[:, 1:] /= 16  # smaller terms, still large enough to change some choice
    bias = torch.rand(1, 64, device=DEVICE) / 4

    weights, ids = topk_softmax(parts, 6, True, 1e-12, bias)

    summed = parts.double().sum(1)
    ref_weights, ref_ids = routing_ref(summed, 6, True, 1e-12, bias)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(weights.double(), ref_weights, rtol=1e-5, atol=1e-7)
    assert not torch.equal(ids, routing_ref(parts[:, 0].double(), 6, True, 1e-12, bias)[1])  # the terms mattered


def test_bfloat16_terms_sum_to_the_float32_weight():
    weight = torch.randn(64, 256) / 20
    terms = bfloat16_terms(weight)
    assert terms.dtype == torch.bfloat16 and terms.shape == (3 * 64, 256)
    rebuilt = terms.double().view(3, 64, 256).sum(0)
    assert ((rebuilt - weight.double()).abs() <= weight.double().abs() * 2.0**-24).all()
    assert not torch.equal(terms[64:], torch.zeros_like(terms[64:]))  # the smaller terms carry bits
