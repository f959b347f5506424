"""All-to-all dispatch and combine over two gloo ranks against one process running every expert,
with uneven routing: every token of both ranks goes to rank 0's experts, so rank 1 receives none."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastllm.distributed.expert_dispatch import all_gather_rows, dispatch_combine, token_share
from fastllm.layers.fused_moe import fused_experts_reference

EXPERTS, HIDDEN, INTER, K, TOKENS = 4, 8, 6, 2, 7


def _problem(skewed: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen, dtype=torch.float64)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen, dtype=torch.float64) / 3
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen, dtype=torch.float64) / 3
    weights = torch.rand(TOKENS, K, generator=gen, dtype=torch.float64).float()
    if skewed:  # experts 0 and 1: rank 0's
        ids = torch.stack([torch.randperm(2, generator=gen) for _ in range(TOKENS)])
    else:
        ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:K] for _ in range(TOKENS)])
    return hidden, w13, w2, weights, ids


def _rank(rank: int, init: str, skewed: bool, results: dict) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        hidden, w13, w2, weights, ids = _problem(skewed)
        per_rank = EXPERTS // 2
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        share = token_share(TOKENS, rank, 2)
        received = []

        def run(rows, w, local_ids):
            received.append(rows.shape[0])
            return fused_experts_reference(rows, w13[mine], w2[mine], w, local_ids)

        out = dispatch_combine(hidden[share], weights[share], ids[share], per_rank, run)
        results[rank] = (all_gather_rows(out, TOKENS), sum(received))  # run skips an empty batch
    finally:
        dist.destroy_process_group()


def _run(skewed: bool, tmp_path) -> dict:
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(f"file://{tmp_path}/rendezvous", skewed, results), nprocs=2)
    return dict(results)


def test_dispatch_combine_matches_one_process(tmp_path):
    hidden, w13, w2, weights, ids = _problem(skewed=False)
    expected = fused_experts_reference(hidden, w13, w2, weights, ids)
    results = _run(False, tmp_path)
    for rank in (0, 1):
        torch.testing.assert_close(results[rank][0], expected, rtol=1e-12, atol=1e-12)


def test_dispatch_combine_with_a_rank_receiving_nothing(tmp_path):
    hidden, w13, w2, weights, ids = _problem(skewed=True)
    expected = fused_experts_reference(hidden, w13, w2, weights, ids)
    results = _run(True, tmp_path)
    assert results[0][1] == TOKENS and results[1][1] == 0  # every token went to rank 0 only
    for rank in (0, 1):
        torch.testing.assert_close(results[rank][0], expected, rtol=1e-12, atol=1e-12)
