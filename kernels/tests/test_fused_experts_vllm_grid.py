"""``fused_experts`` over the case grid of vLLM's own fused-MoE test (``tests/kernels/moe/test_moe.py``,
``test_fused_moe``): its (tokens, intermediate, hidden) triples with odd and large sizes, 8 / 64 / 192
experts, top-2 and top-6 of a softmax over random scores, a quarter of the experts held here (its expert
map, ``ep_size`` 4) and weight rows padded past their end (its ``padding``: a row stride of hidden + 128),
inputs and weights scaled by 1/10 as there, and its bound on bf16 (absolute 2e-2). The whole grid runs on
a GPU; on the CPU (interpreter, float32) a few cases cut to interpreter sizes, with the float32 bound."""

import itertools

import pytest
import torch

from fastllm_kernels.fused_moe import fused_experts
from kernel_testing import DEVICE, TOLERANCE

VLLM_GRID = list(itertools.product(  # (tokens, intermediate, hidden), experts, top-k, ep_size, padding
    [(1, 128, 128), (1, 2048, 128), (33, 2048, 128), (32768, 2048, 511), (40000, 1024, 1024)], [8, 64, 192],
    [2, 6], [1, 4], [False, True]))
CPU_CASES = [  # each expert count, top-k, expert map and padding of the grid, at sizes the interpreter runs in seconds
    ((1, 128, 128), 8, 2, 1, False), ((1, 256, 128), 192, 6, 4, True), ((33, 128, 128), 64, 6, 1, True),
    ((33, 64, 511), 8, 2, 4, False), ((33, 32, 511), 64, 2, 1, True), ((97, 32, 64), 8, 2, 1, True),
    ((97, 32, 64), 64, 6, 4, False),
]
"""(tokens, intermediate, hidden) cut down: vLLM's 1 and 33 tokens, its odd hidden size (511) at a small
intermediate, and 97 tokens for grouped blocks."""
ON_GPU = DEVICE.type == "cuda"


def looped_moe(x, w13, w2, topk_weights, topk_ids, local_ids):
    """The routed experts one at a time in float32 (float64 on CPU); routes to experts not in
    ``local_ids`` (global ids in local order) count nothing, as on an expert-parallel rank."""
    dtype = torch.float32 if ON_GPU else torch.float64
    x, out = x.to(dtype), torch.zeros(x.shape, dtype=dtype, device=x.device)
    for local, expert in enumerate(local_ids.tolist()):
        tokens, slots = torch.nonzero(topk_ids == expert, as_tuple=True)
        if tokens.numel():
            gate, up = (x[tokens] @ w13[local].to(dtype).T).chunk(2, dim=-1)
            rows = (torch.nn.functional.silu(gate) * up) @ w2[local].to(dtype).T
            out.index_add_(0, tokens, rows * topk_weights[tokens, slots, None].to(dtype))
    return out


def padded(w: torch.Tensor) -> torch.Tensor:
    """``w`` as a view whose rows are 128 elements longer than its last dimension (vLLM's ``padding``)."""
    return torch.nn.functional.pad(w, (0, 128))[..., :-128]


@pytest.mark.parametrize("mnk,experts,top_k,ep_size,padding", VLLM_GRID if ON_GPU else CPU_CASES)
def test_fused_experts_on_vllms_grid(mnk, experts, top_k, ep_size, padding):
    m, n, k = mnk
    generator = torch.Generator(device=DEVICE).manual_seed(7)
    dtype = torch.bfloat16 if ON_GPU else torch.float32

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=DEVICE).to(dtype) / 10

    x, w13, w2 = randn(m, k), randn(experts, 2 * n, k), randn(experts, k, n)
    score = torch.randn(m, experts, generator=generator, device=DEVICE).to(dtype)
    topk_weights, topk_ids = score.float().softmax(-1).topk(top_k, dim=-1)
    local_ids = torch.randperm(experts, generator=generator, device=DEVICE)[:experts // ep_size]
    expert_map = torch.full((experts,), -1, dtype=torch.long, device=DEVICE)
    expert_map[local_ids] = torch.arange(local_ids.numel(), device=DEVICE)
    local = expert_map[topk_ids]  # a route elsewhere: local expert 0 at weight 0 (fastllm's local_routes)
    w13, w2 = w13[local_ids], w2[local_ids]
    if padding:
        w13, w2 = padded(w13), padded(w2)

    out = fused_experts(x, w13, w2, topk_weights.masked_fill(local < 0, 0.0), local.clamp(min=0))

    reference = looped_moe(x, w13, w2, topk_weights, topk_ids, local_ids)
    if ON_GPU:
        torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=0)
    else:  # no route may be local (one token, two of eight experts here): compare values, not a norm ratio
        torch.testing.assert_close(out.double(), reference, atol=1e-6, rtol=TOLERANCE[dtype])
