import pytest
import torch

from fastllm_kernels.moe_routing import route, router_topk, topk_softmax
from fastllm_kernels.split_k import scratch
from kernel_testing import DEVICE, DTYPES, TOLERANCE, randn


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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("experts,hidden,top_k,with_bias", [
    (128, 2048, 8, False),  # Qwen3-MoE: 16 x 4 programs
    (60, 1000, 4, True),    # ragged rows and inputs, a bias-corrected choice
    (8, 4096, 2, False),    # Mixtral-like: one row tile, 8 slices
])
def test_router_topk_routes_the_product_in_one_launch(dtype, experts, hidden, top_k, with_bias):
    """One token: the router's product and the routing in one launch choose the experts that the
    float64 product's routing ranks top (ties within rounding aside), with its weights."""
    x = randn(1, hidden, dtype=dtype)
    w = randn(experts, hidden, dtype=dtype) * (4 / hidden ** 0.5)
    bias = torch.rand(experts, device=DEVICE) / 4 if with_bias else None

    weights, ids = router_topk(x, w, top_k, True, 0.0, bias)

    logits = x.double() @ w.double().T
    probs = torch.softmax(logits, dim=-1)
    scores = probs if bias is None else probs + bias.double()
    tol = TOLERANCE[dtype]
    assert torch.allclose(scores.gather(-1, ids), scores.topk(top_k).values, atol=tol)
    chosen = probs.gather(-1, ids)
    assert torch.allclose(weights.double(), chosen / chosen.sum(-1, keepdim=True), atol=tol)
    assert not scratch(torch.device(DEVICE))[1].any()  # the arrival counter reset itself


def test_route_falls_back_to_the_product_then_topk_softmax_for_many_tokens():
    x, w = randn(3, 64, dtype=torch.float32), randn(16, 64, dtype=torch.float32)
    weights, ids = route(x, w, 2)
    ref_weights, ref_ids = topk_softmax(x @ w.T, 2)
    assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_weights)
