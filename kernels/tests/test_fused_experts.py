import pytest
import torch

from fastllm_kernels.fused_moe import (
    MoeTiling, default_tilings, fused_experts, grouped_gemm, sum_pairs,
)
from fastllm_kernels.moe_align import ALIGN_CHUNK, max_blocks, moe_align_block_size, one_pair_blocks
from fastllm_kernels.quant.dequant import NF4_CODES
from fastllm_kernels.split_k import scratch
from kernel_testing import DEVICE, DTYPES, TOLERANCE, four_bit, fp8_per_channel, nan_like, randn, rel_err


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
    (300, 4, 2, 4, 64, 96),    # prefill tiles of 128 rows, gate and up interleaved, a partial column tile
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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,experts", [(1, 64), (2, 32), (9, 8)])  # one pair a block twice, then grouped
def test_pair_rows_left_unsummed_at_one_pair_a_block(dtype, tokens, experts):
    """``pair_rows``: at one pair a block each token's k weighted rows come back in float32, slot by
    slot (the consumer sums them); grouped blocks still return the sum."""
    x = randn(tokens, 64, dtype=dtype)
    w13, w2 = moe_weights(experts, 64, 48, dtype)
    topk_weights, topk_ids = routing(tokens, experts, 2)
    topk_ids[0, 1] = topk_ids[0, 0]  # one token's two slots on one expert

    out = fused_experts(x, w13, w2, topk_weights, topk_ids, pair_rows=True)

    if tokens * 2 * 8 <= experts:
        assert out.shape == (tokens, 2, 64) and out.dtype == torch.float32
        for slot in range(2):
            slot_ids, slot_weights = topk_ids[:, slot:slot + 1], topk_weights[:, slot:slot + 1]
            assert rel_err(out[:, slot], dense_moe(x, w13, w2, slot_weights, slot_ids)) < TOLERANCE[dtype]
    else:
        assert out.shape == x.shape and out.dtype == dtype
        assert rel_err(out, dense_moe(x, w13, w2, topk_weights, topk_ids)) < TOLERANCE[dtype]


@pytest.mark.parametrize("experts", [4, 64])  # grouped, and one pair a block
def test_expert_chosen_twice_by_a_token_counts_twice(experts):
    x = randn(3, 32, dtype=torch.float32)
    w13, w2 = moe_weights(experts, 32, 16, torch.float32)
    topk_ids = torch.tensor([[2, 2], [0, 2], [2, 3]], device=DEVICE)
    topk_weights = torch.rand(3, 2, device=DEVICE)

    out = fused_experts(x, w13, w2, topk_weights, topk_ids)

    assert rel_err(out, dense_moe(x, w13, w2, topk_weights, topk_ids)) < TOLERANCE[torch.float32]
    assert not scratch(torch.device(DEVICE))[1].any()  # one pair a block: the pairs' sum reset its counters


@pytest.mark.parametrize("pairs,experts,block_m", [
    (1, 4, 16), (45, 7, 16), (300, 64, 32),
    (3 * ALIGN_CHUNK - 5, 5, 64),    # several chunks, few experts: runs span chunks
    (9 * ALIGN_CHUNK - 84, 64, 64),  # a decode step of 370 tokens at k = 6
    (2 * ALIGN_CHUNK, 128, 16),      # whole chunks, 128 experts (a bin for no pair past them)
])
def test_alignment_groups_pairs_by_expert_in_padded_blocks(pairs, experts, block_m):
    ids = torch.randint(0, experts, (pairs,), device=DEVICE)
    ids[ids == 1] = 0  # expert 1 gets nothing

    blocks = moe_align_block_size(ids.view(-1, 1), block_m, experts)

    counts = torch.bincount(ids.cpu(), minlength=experts)
    padded = (counts + block_m - 1) // block_m * block_m
    used = padded.sum().item()
    assert blocks.num_padded.item() == used
    assert blocks.num_blocks == max_blocks(pairs, experts, block_m)
    sorted_pairs, expert_ids = blocks.sorted_pairs.cpu().long()[:used], blocks.expert_ids.cpu().long()
    assert torch.equal(expert_ids[:used // block_m], torch.arange(experts).repeat_interleave(padded // block_m))
    assert (expert_ids[used // block_m:] == experts).all()
    runs = torch.split(sorted_pairs, padded.tolist())
    for expert, (run, count) in enumerate(zip(runs, counts.tolist())):
        assert torch.equal(run[:count], torch.nonzero(ids.cpu() == expert).flatten())  # in pair order
        assert (run[count:] == pairs).all()  # padding: no pair


def test_alignment_of_no_pairs_uses_no_block():
    blocks = moe_align_block_size(torch.empty(0, 2, dtype=torch.long, device=DEVICE), 16, 8)

    assert blocks.num_padded.item() == 0 and blocks.num_blocks == 0


def test_large_batches_pick_prefill_tiles():
    assert default_tilings(4097 * 2, 4)[0].block_m == 128
    assert default_tilings(8, 64)[0].block_m == 16
    assert default_tilings(20 * 64, 64)[0].block_m == 32  # 16-row blocks would split many experts
    assert default_tilings(8, 64, element_size=4)[0].block_k == default_tilings(8, 64)[0].block_k // 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,top_k,hidden", [(1, 2, 64), (37, 6, 1500), (5, 8, 2048)])
def test_sum_pairs_adds_the_slots_and_the_addend(dtype, tokens, top_k, hidden):
    rows, addend = randn(tokens, top_k, hidden, dtype=dtype), randn(tokens, hidden, dtype=dtype)

    alone, with_addend = sum_pairs(rows), sum_pairs(rows, addend)

    reference = rows.double().sum(1)
    assert rel_err(alone, reference) < TOLERANCE[dtype]
    assert rel_err(with_addend, reference + addend.double()) < TOLERANCE[dtype]
    with pytest.raises(ValueError, match="addend"):
        sum_pairs(rows, addend[:, :-1])


@pytest.mark.parametrize("tokens,experts", [(1, 16), (40, 8)])  # pairs summed in the down GEMM; by sum_pairs
@pytest.mark.parametrize("late", [False, True])
def test_fused_experts_add_the_shared_experts_output(tokens, experts, late):
    """``late``: the output comes from a function, called before the launch that adds it (a
    second stream's result, joined there)."""
    x = randn(tokens, 64, dtype=torch.float32)
    w13, w2 = moe_weights(experts, 64, 32, torch.float32)
    topk_weights, topk_ids = routing(tokens, experts, 2)
    shared = randn(tokens, 64, dtype=torch.float32)

    out = fused_experts(x, w13, w2, topk_weights, topk_ids, addend=(lambda: shared) if late else shared)

    reference = dense_moe(x, w13, w2, topk_weights, topk_ids) + shared.double()
    assert rel_err(out, reference) < TOLERANCE[torch.float32]


def test_fused_experts_rejects_other_activations():
    x = randn(2, 32, dtype=torch.float32)
    w13, w2 = moe_weights(2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="silu"):
        fused_experts(x, w13, w2, torch.ones(2, 1, device=DEVICE), torch.zeros(2, 1, dtype=torch.long,
                                                                              device=DEVICE), activation="gelu")


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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nf4", [False, True])
@pytest.mark.parametrize("tokens,experts,used", [(2, 32, 5), (37, 8, 3), (70, 4, 4)])
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


@pytest.mark.parametrize("fmt", ["dense", "fp8", "int4"])
@pytest.mark.parametrize("tokens,experts", [(1, 16), (37, 4)])  # one pair a block; grouped
def test_interleaved_gate_up_operand_matches_the_dense_reference(fmt, tokens, experts):
    """Gate and up rows in one weight operand (``MoeTiling.interleave``), a partial column tile
    (96 columns in tiles of 64), each weight format's scales following its rows."""
    x = randn(tokens, 128, dtype=torch.float16)
    w13, w2 = moe_weights(experts, 128, 96, torch.float32)
    topk_weights, topk_ids = routing(tokens, experts, 2)
    tilings = MoeTiling(16, 64, 32, interleave=True), MoeTiling(16, 32, 32)
    if fmt == "fp8":
        (q13, s13), (q2, s2) = fp8_per_channel(w13), fp8_per_channel(w2)
        formats, dense = {"w13_scale": s13, "w2_scale": s2}, (q13.double() * s13.double()[..., None],
                                                             q2.double() * s2.double()[..., None])
    elif fmt == "int4":
        q13, s13, z13, d13 = four_bit(w13, 32)
        q2, s2, z2, d2 = four_bit(w2, 32)
        formats, dense = {"w13_scale": s13, "w2_scale": s2, "w13_zero": z13, "w2_zero": z2}, (d13, d2)
    else:
        q13, q2, formats, dense = w13.half(), w2.half(), {}, (w13.half(), w2.half())

    out = fused_experts(x, q13, q2, topk_weights, topk_ids, tilings=tilings, **formats)

    assert rel_err(out, dense_moe(x, *dense, topk_weights, topk_ids)) < TOLERANCE[torch.float16]


@pytest.mark.parametrize("fmt", ["fp8", "int4", "nf4"])
def test_quantized_experts_leave_their_rows_unsummed_too(fmt):
    """``pair_rows`` with quantized experts at one pair a block: float32 rows that add up to the sum
    the layer returns otherwise."""
    x = randn(1, 128, dtype=torch.float16)
    w13, w2 = moe_weights(16, 128, 64, torch.float32)
    if fmt == "fp8":
        (q13, s13), (q2, s2) = fp8_per_channel(w13), fp8_per_channel(w2)
        formats = {"w13_scale": s13, "w2_scale": s2}
    else:
        book = torch.tensor(NF4_CODES, device=DEVICE) if fmt == "nf4" else None
        (q13, s13, z13, _), (q2, s2, z2, _) = four_bit(w13, 32, book), four_bit(w2, 32, book)
        formats = {"w13_scale": s13, "w2_scale": s2, "w13_zero": z13, "w2_zero": z2, "book": book}
    topk_weights, topk_ids = routing(1, 16, 2)

    summed = fused_experts(x, q13, q2, topk_weights, topk_ids, **formats)
    rows = fused_experts(x, q13, q2, topk_weights, topk_ids, pair_rows=True, **formats)

    assert rows.shape == (1, 2, 128) and rows.dtype == torch.float32
    assert rel_err(rows.sum(1), summed) < TOLERANCE[torch.float16]


def test_four_bit_experts_need_a_zero_or_a_book():
    x = randn(2, 32, dtype=torch.float32)
    w13, w2 = moe_weights(4, 32, 16, torch.float32)
    (q13, s13, z13, _), (q2, s2, _, _) = four_bit(w13, 16), four_bit(w2, 16)
    ids = torch.zeros(2, 1, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="zero"):
        fused_experts(x, q13, q2, torch.ones(2, 1, device=DEVICE), ids, w13_scale=s13, w2_scale=s2, w13_zero=z13)
