import pytest
import torch

from fastllm_kernels.fused_moe import (
    MAX_ALIGN_PAIRS, MoeTiling, _align_torch, default_tilings, fused_experts, max_blocks,
    moe_align_block_size,
)
from fastllm_kernels.quant.dequant import NF4_CODES
from fastllm_kernels.split_k import scratch
from kernel_testing import DEVICE, DTYPES, TOLERANCE, randn, rel_err


def dense_moe(hidden, w13, w2, topk_weights, topk_ids):
    """Every token through every expert in float64, masked by the routing weights."""
    hidden, w13, w2 = hidden.double(), w13.double(), w2.double()
    gate, up = torch.einsum("th,eih->tei", hidden, w13).chunk(2, dim=-1)
    per_expert = torch.einsum("tei,ehi->teh", torch.nn.functional.silu(gate) * up, w2)
    routing = torch.zeros(hidden.shape[0], w13.shape[0], dtype=torch.float64, device=hidden.device)
    routing.scatter_add_(1, topk_ids.long(), topk_weights.double())
    return torch.einsum("te,teh->th", routing, per_expert)


def routing(tokens, experts, top_k, used=None):
    """Random distinct experts a token (from the first ``used`` experts only: the rest get none)."""
    used = used or experts
    ids = torch.stack([torch.randperm(used)[:top_k] for _ in range(tokens)]).to(DEVICE)
    weights = torch.rand(tokens, top_k, device=DEVICE).softmax(-1)
    return weights, ids


def moe_weights(experts, hidden, inner, dtype):
    return (randn(experts, 2 * inner, hidden, dtype=dtype) / hidden ** 0.5,
            randn(experts, hidden, inner, dtype=dtype) / inner ** 0.5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,experts,top_k,used,hidden,inner", [
    (1, 8, 2, 8, 64, 32),      # decode: one token, most experts get nothing
    (2, 32, 2, 32, 64, 32),    # a few pairs, one a block, ungrouped
    (37, 8, 2, 3, 64, 48),     # more tokens than a block, five experts idle, uneven K and N
    (70, 6, 3, 6, 96, 32),     # prefill tiles (64 rows), every expert shared by many tokens
])
def test_fused_experts_matches_dense_reference(dtype, tokens, experts, top_k, used, hidden, inner):
    x = randn(tokens, hidden, dtype=dtype)
    w13, w2 = moe_weights(experts, hidden, inner, dtype)
    topk_weights, topk_ids = routing(tokens, experts, top_k, used)

    out = fused_experts(x, w13, w2, topk_weights, topk_ids)

    assert out.shape == x.shape and out.dtype == dtype
    assert rel_err(out, dense_moe(x, w13, w2, topk_weights, topk_ids)) < TOLERANCE[dtype]


@pytest.mark.parametrize("tilings", [
    (MoeTiling(16, 16, 32), MoeTiling(16, 32, 16)),  # K steps that do not divide K (48)
    (MoeTiling(32, 16, 16, group_m=2), MoeTiling(16, 16, 32, group_m=3)),  # grouped order, two alignments
])
def test_fused_experts_any_tiling(tilings):
    x = randn(21, 40, dtype=torch.float32)
    w13, w2 = moe_weights(5, 40, 48, torch.float32)
    topk_weights, topk_ids = routing(21, 5, 2)

    out = fused_experts(x, w13, w2, topk_weights, topk_ids, tilings=tilings)

    assert rel_err(out, dense_moe(x, w13, w2, topk_weights, topk_ids)) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("experts", [4, 64])  # grouped, and one pair a block
def test_expert_chosen_twice_by_a_token_counts_twice(experts):
    x = randn(3, 32, dtype=torch.float32)
    w13, w2 = moe_weights(experts, 32, 16, torch.float32)
    topk_ids = torch.tensor([[2, 2], [0, 2], [2, 3]], device=DEVICE)
    topk_weights = torch.rand(3, 2, device=DEVICE)

    out = fused_experts(x, w13, w2, topk_weights, topk_ids)

    assert rel_err(out, dense_moe(x, w13, w2, topk_weights, topk_ids)) < TOLERANCE[torch.float32]
    assert not scratch(torch.device(DEVICE))[1].any()  # one pair a block: the pairs' sum reset its counters


@pytest.mark.parametrize("pairs,experts,block_m", [(1, 4, 16), (45, 7, 16), (300, 64, 32)])
def test_alignment_groups_pairs_by_expert_in_padded_blocks(pairs, experts, block_m):
    ids = torch.randint(0, experts, (pairs,), device=DEVICE)
    ids[ids == 1] = 0  # expert 1 gets nothing

    blocks = moe_align_block_size(ids.view(-1, 1), block_m, experts)

    counts = torch.bincount(ids.cpu(), minlength=experts)
    padded = (counts + block_m - 1) // block_m * block_m
    assert blocks.num_padded.item() == padded.sum().item()
    assert blocks.num_blocks == max_blocks(pairs, experts, block_m)
    sorted_pairs, expert_ids = blocks.sorted_pairs.cpu().long(), blocks.expert_ids.cpu().long()
    slot_expert = expert_ids.repeat_interleave(block_m)
    used = padded.sum().item()
    assert (expert_ids[used // block_m:] == experts).all()
    expected = torch.cat([torch.nonzero(ids.cpu() == e).flatten() for e in range(experts)])
    real = sorted_pairs[:used] < pairs
    assert torch.equal(sorted_pairs[:used][real], expected)  # by expert, in pair order within one
    assert torch.equal(ids.cpu()[sorted_pairs[:used][real]], slot_expert[:used][real])
    assert (sorted_pairs[used:] == pairs).all()
    reference = _align_torch(ids, block_m, experts, blocks.num_blocks)
    assert torch.equal(reference.sorted_pairs.cpu(), blocks.sorted_pairs.cpu())
    assert torch.equal(reference.expert_ids.cpu(), blocks.expert_ids.cpu())
    assert torch.equal(reference.num_padded.cpu(), blocks.num_padded.cpu())


def test_large_batches_align_in_torch_and_pick_prefill_tiles():
    tokens, experts, top_k = MAX_ALIGN_PAIRS // 2 + 1, 4, 2
    ids = torch.randint(0, experts, (tokens, top_k), device=DEVICE)

    blocks = moe_align_block_size(ids, 128, experts)

    counts = torch.bincount(ids.flatten().cpu(), minlength=experts)
    assert blocks.num_padded.item() == ((counts + 127) // 128 * 128).sum().item()
    assert default_tilings(tokens * top_k, experts)[0].block_m == 128
    assert default_tilings(8, 64)[0].block_m == 16
    assert default_tilings(8, 64, element_size=4)[0].block_k == default_tilings(8, 64)[0].block_k // 2


def test_fused_experts_rejects_other_activations():
    x = randn(2, 32, dtype=torch.float32)
    w13, w2 = moe_weights(2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="silu"):
        fused_experts(x, w13, w2, torch.ones(2, 1, device=DEVICE), torch.zeros(2, 1, dtype=torch.long,
                                                                              device=DEVICE), activation="gelu")


def fp8_per_channel(w):
    """e4m3 weights and float32 scales ``[E, rows]``: each row's absmax at the format's top."""
    scale = (w.float().abs().amax(dim=-1) / torch.finfo(torch.float8_e4m3fn).max).clamp(min=1e-12)
    return (w.float() / scale[..., None]).to(torch.float8_e4m3fn), scale


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,experts", [(1, 16), (37, 4), (70, 2)])  # one pair a block, decode, prefill tiles
def test_fp8_experts_match_dense_reference_on_their_dequantized_weights(dtype, tokens, experts):
    x = randn(tokens, 64, dtype=dtype)
    w13, w2 = moe_weights(experts, 64, 48, torch.float32)
    (q13, s13), (q2, s2) = fp8_per_channel(w13), fp8_per_channel(w2)
    topk_weights, topk_ids = routing(tokens, experts, 2)

    out = fused_experts(x, q13, q2, topk_weights, topk_ids, w13_scale=s13, w2_scale=s2)

    dequantized = q13.double() * s13.double()[..., None], q2.double() * s2.double()[..., None]
    assert out.dtype == dtype
    assert rel_err(out, dense_moe(x, *dequantized, topk_weights, topk_ids)) < TOLERANCE[dtype]


def four_bit(w, group, book=None):
    """Codes two a byte (even input low), float32 scales ``[E, rows, K / group]`` and zeros (int4:
    the group's min at code 0, its max at 15), or nf4 codes of ``book`` by absmax (zeros None);
    with the weights they stand for, in float64."""
    groups = w.double().unflatten(-1, (-1, group))
    if book is None:
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp(min=1e-8)
        zero = -low / scale
        codes = (groups / scale[..., None] + zero[..., None]).round().clamp(0, 15)
        values = (codes - zero[..., None]) * scale[..., None]
    else:
        scale = groups.abs().amax(-1)
        codes = (groups / scale[..., None])[..., None].sub(book.double()).abs().argmin(-1).double()
        values = book.double()[codes.long()] * scale[..., None]
        zero = None
    codes = codes.flatten(-2).to(torch.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, scale.float(), None if zero is None else zero.float(), values.flatten(-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nf4", [False, True])
@pytest.mark.parametrize("tokens,experts,used", [(1, 16, 16), (2, 32, 5), (37, 8, 3), (70, 4, 4)])
def test_four_bit_experts_match_dense_reference_on_their_dequantized_weights(dtype, nf4, tokens, experts, used):
    """Decode (one pair a block), grouped with idle experts, prefill tiles; groups of 32 inputs
    under K steps of 64 and more, and of 64 over K steps of 32 (float32 halves them)."""
    book = torch.tensor(NF4_CODES, device=DEVICE) if nf4 else None
    x = randn(tokens, 128, dtype=dtype)
    w13, w2 = moe_weights(experts, 128, 64, torch.float32)
    q13, s13, z13, d13 = four_bit(w13, 32, book)
    q2, s2, z2, d2 = four_bit(w2, 64, book)
    topk_weights, topk_ids = routing(tokens, experts, 2, used)
    topk_ids[0, 1] = topk_ids[0, 0]  # the first token's two slots on one expert

    out = fused_experts(x, q13, q2, topk_weights, topk_ids, w13_scale=s13, w2_scale=s2, w13_zero=z13, w2_zero=z2,
                        book=book)

    assert out.dtype == dtype
    assert rel_err(out, dense_moe(x, d13, d2, topk_weights, topk_ids)) < TOLERANCE[dtype]


def test_four_bit_experts_need_a_zero_or_a_book():
    x = randn(2, 32, dtype=torch.float32)
    w13, w2 = moe_weights(4, 32, 16, torch.float32)
    (q13, s13, z13, _), (q2, s2, _, _) = four_bit(w13, 16), four_bit(w2, 16)
    ids = torch.zeros(2, 1, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="zero"):
        fused_experts(x, q13, q2, torch.ones(2, 1, device=DEVICE), ids, w13_scale=s13, w2_scale=s2, w13_zero=z13)
