"""All-to-all dispatch and combine for expert parallelism.

Each rank hands every token it owns only to the ranks that hold one of its top-k experts (once
per rank, whatever the number of its routes there), those ranks run their experts on the rows
they received, and send the weighted results back to the token's rank, which sums them. Split
sizes travel first (one small exchange, read on the host), so the step cannot be captured in a
CUDA graph; ``FusedMoE`` takes this path for steps of many tokens and keeps the all-reduce of
replicated tokens for small ones (``parallel_state.use_expert_all_to_all``).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist

# rows [n, H], weights [n, k] float32, local expert ids [n, k] -> weighted sums [n, H]
ExpertRunner = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def exchange_rows(rows: torch.Tensor, send_counts: list[int], recv_counts: list[int],
                  group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """Rank ``r`` gets the ``send_counts[r]`` rows after the earlier ranks' ones; the result holds
    ``recv_counts[r]`` rows from each rank ``r``, in rank order."""
    received = rows.new_empty((sum(recv_counts),) + tuple(rows.shape[1:]))
    dist.all_to_all_single(received, rows.contiguous(), recv_counts, send_counts, group=group)
    return received


def dispatch_combine(hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                     experts_per_rank: int, run_experts: ExpertRunner,
                     group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """``hidden [t, H]`` (this rank's tokens) through their routes to experts placed
    ``experts_per_rank`` a rank (rank ``r`` holds global experts ``r * experts_per_rank ...``).

    A token sent to a rank carries all ``k`` route slots, those to experts elsewhere with weight 0
    on local expert 0, so the grouped kernel keeps its fixed ``[n, k]`` shape.
    """
    ranks = dist.get_world_size(group)
    owner = topk_ids // experts_per_rank
    sends = torch.zeros(hidden.shape[0], ranks, dtype=torch.bool, device=hidden.device)
    sends.scatter_(1, owner, True)
    dest, token = sends.t().nonzero(as_tuple=True)  # grouped by destination rank, as the exchange wants
    send_counts = sends.sum(0)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
    there = owner[token] == dest[:, None]
    weights = topk_weights[token].float().masked_fill(~there, 0.0)
    local_ids = (topk_ids[token] - dest[:, None] * experts_per_rank).masked_fill(~there, 0)
    rows = exchange_rows(hidden[token], send_splits, recv_splits, group)
    # weights and ids in one float32 exchange (expert ids are far below float32's exact 2**24)
    routes = exchange_rows(torch.cat((weights, local_ids.float()), dim=1), send_splits, recv_splits, group)
    k = topk_ids.shape[1]
    results = run_experts(rows, routes[:, :k], routes[:, k:].long()) if rows.shape[0] else rows
    returned = exchange_rows(results, recv_splits, send_splits, group)
    return torch.zeros_like(hidden).index_add_(0, token, returned.to(hidden.dtype))


def token_share(total: int, rank: int, ranks: int) -> slice:
    """The contiguous rows of ``total`` replicated tokens that ``rank`` dispatches (the last
    ranks' shares may be short or empty)."""
    chunk = -(-total // ranks)
    return slice(min(total, rank * chunk), min(total, (rank + 1) * chunk))


def all_gather_rows(part: torch.Tensor, total: int, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """Every rank's ``token_share`` rows joined back into ``[total, ...]`` on every rank."""
    ranks = dist.get_world_size(group)
    sizes = [token_share(total, rank, ranks) for rank in range(ranks)]
    return _gather_padded(part, [share.stop - share.start for share in sizes], group)


def _gather_padded(part: torch.Tensor, sizes: list[int], group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """Rank ``r``'s ``sizes[r]`` rows joined in rank order on every rank (padded to the largest,
    as all-gather wants equal parts)."""
    padded = part.new_zeros((max(sizes),) + tuple(part.shape[1:]))
    padded[:part.shape[0]] = part
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([rows[:size] for rows, size in zip(parts, sizes)])


def replica_token_counts(num_tokens: int, device: torch.device) -> list[int]:
    """Every data-parallel replica's token count this step, in rank order (one host wait)."""
    count = torch.tensor([num_tokens], dtype=torch.long, device=device)
    counts = [torch.empty_like(count) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, count)
    return torch.cat(counts).tolist()


def gather_replica_tokens(hidden: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, slice]:
    """Every data-parallel replica's step tokens ``[sizes[r], H]`` joined in rank order on every
    rank, and where this replica's rows sit in them (data-parallel attention with expert
    parallelism: eager steps' batches differ in size, so rows go padded)."""
    start = sum(sizes[:dist.get_rank()])
    if len(set(sizes)) == 1:  # every replica padded to one bucket: a fixed-size gather (capturable)
        tokens = hidden.new_empty((len(sizes) * hidden.shape[0],) + tuple(hidden.shape[1:]))
        dist.all_gather_into_tensor(tokens, hidden.contiguous())
    else:
        tokens = _gather_padded(hidden, sizes)
    return tokens, slice(start, start + hidden.shape[0])
