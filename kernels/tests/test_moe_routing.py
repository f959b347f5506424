import pytest
import torch

from fastllm_kernels.moe_routing import bfloat16_terms, router_topk, topk_softmax
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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("features,experts,top_k,renormalize,norm_min,with_bias,float32_weight", [
    (64, 8, 2, True, 0.0, False, False),      # Mixtral-like
    (96, 128, 8, True, 0.0, False, False),    # Qwen3-MoE; features not a power of two
    (80, 60, 4, False, 0.0, False, False),    # experts not a power of two, raw softmax weights
    (160, 64, 6, True, 1e-12, True, True),    # ERNIE-4.5: float32 router, bias-corrected choice
])
def test_router_topk_routes_one_token_as_router_then_topk_softmax(dtype, features, experts, top_k, renormalize,
                                                                  norm_min, with_bias, float32_weight):
    torch.manual_seed(experts)
    hidden = randn(1, features, dtype=dtype)
    weight = randn(experts, features, dtype=torch.float32 if float32_weight else dtype) / 4
    bias = torch.rand(experts, device=DEVICE) / 4 if with_bias else None

    for _ in range(2):  # the arrival counter resets itself: a second call routes alike
        weights, ids = router_topk(hidden, weight, top_k, renormalize, norm_min, bias, round_logits=not float32_weight)

    logits = hidden.double() @ weight.double().t()
    if not float32_weight:  # a 16-bit router's logits are 16-bit
        logits = logits.to(dtype).double()
    ref_weights, ref_ids = routing_ref(logits, top_k, renormalize, norm_min, bias)
    probs = torch.softmax(logits, dim=-1)
    scores = probs if bias is None else probs + bias.double()
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64 and ids.shape == (1, top_k)
    assert torch.equal(scores.gather(-1, ids), scores.gather(-1, ref_ids))  # ties: any tied expert is right
    assert torch.allclose(weights.double(), ref_weights, rtol=1e-4, atol=1e-6)


def test_router_topk_takes_one_row_only():
    with pytest.raises(ValueError, match="one row"):
        router_topk(randn(2, 64, dtype=torch.float32), randn(8, 64, dtype=torch.float32), 2)
