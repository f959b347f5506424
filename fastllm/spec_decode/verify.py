"""Verification of draft tokens against the target model, exact for greedy and sampled requests.

Drafts come from a deterministic proposer (a point mass q), so speculative sampling
reduces to: accept draft x with probability p(x); on rejection sample from p with x
removed. The output distribution equals sampling from p one token at a time.

Everything runs on the device and nothing is read back here: the host learns the outcome
with the step's other results, in the one device-to-host copy of ``PendingStep``. A read
per step (let alone per draft) would stall the host behind the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from fastllm.platforms.transfer import to_device


@dataclass
class DraftGroup:
    """One sequence's rows of the step's probabilities: row ``start + j`` follows its first j drafts."""

    start: int
    drafts: list[int]
    greedy: bool
    generator: torch.Generator | None = None


@dataclass
class VerifiedDrafts:
    """Still on the device. ``tokens[start + j]`` is what a group yields at its row j: the
    accepted draft for ``j < num_accepted``, the new token at ``j == num_accepted``; later
    rows hold junk. A group's output is ``tokens[start : start + num_accepted + 1]``."""

    tokens: torch.Tensor  # [rows] int64
    num_accepted: torch.Tensor  # [groups] int64


def verify_drafts(probs: Optional[torch.Tensor], greedy_tokens: torch.Tensor,
                  groups: list[DraftGroup]) -> VerifiedDrafts:
    """``greedy_tokens [rows]`` (the argmax of each row) and, where some group samples, the target
    ``probs [rows, vocab]`` -> the tokens and accepted counts, without a device-to-host copy.
    At least one group has drafts.

    A greedy group keeps the longest run of drafts equal to the argmax, and the argmax after
    it: the argmax row by row, so its tokens are ``greedy_tokens`` themselves."""
    device = greedy_tokens.device
    width = max(len(g.drafts) for g in groups)
    padded = [d for g in groups for d in g.drafts + [-1] * (width - len(g.drafts))]
    host = to_device(padded + [g.start for g in groups] + [g.greedy for g in groups], torch.int64, device)
    drafts = host[: len(padded)].view(len(groups), width)
    starts, greedy = host[len(padded):len(padded) + len(groups)], host[len(padded) + len(groups):].bool()
    rows = (starts[:, None] + torch.arange(width, device=device)).clamp(max=greedy_tokens.shape[0] - 1)
    accepted = greedy_tokens[rows] == drafts  # padding (-1) never matches
    sampled = [g for g in groups if not g.greedy]
    if sampled:
        accepted = torch.where(greedy[:, None], accepted, _accept_sampled(probs, groups, rows, drafts))
    num_accepted = accepted.long().cumprod(dim=-1).sum(dim=-1)
    tokens = greedy_tokens
    if sampled:
        tokens = greedy_tokens.clone()
        _write_sampled(tokens, probs, groups, drafts, starts, num_accepted)
    return VerifiedDrafts(tokens, num_accepted)


def _accept_sampled(probs: torch.Tensor, groups: list[DraftGroup], rows: torch.Tensor,
                    drafts: torch.Tensor) -> torch.Tensor:
    """Draft j of a group holds with probability p(draft) under row j; a seeded group draws
    only from its own generator, so its tokens never depend on the rest of the batch."""
    uniform = torch.rand(drafts.shape, device=drafts.device)
    for i, group in enumerate(groups):
        if group.generator is not None and group.drafts and not group.greedy:
            uniform[i, : len(group.drafts)] = torch.rand(len(group.drafts), generator=group.generator,
                                                         device=drafts.device)
    return (uniform < probs[rows, drafts.clamp(min=0)]) & (drafts >= 0)  # padding is never accepted


def _write_sampled(tokens: torch.Tensor, probs: torch.Tensor, groups: list[DraftGroup],
                   drafts: torch.Tensor, starts: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """Each sampled group's accepted drafts, then a token drawn from its first unaccepted row with
    the rejected draft removed (or, all accepted, from its last row), into ``tokens`` at its rows."""
    device, width = drafts.device, drafts.shape[1]
    final = probs[starts + num_accepted].clone()
    column = num_accepted.clamp(max=width - 1)[:, None]
    rejected = drafts.gather(1, column).clamp(min=0)
    was_rejected = num_accepted[:, None] < (drafts >= 0).sum(dim=-1, keepdim=True)
    final.scatter_(1, rejected, torch.where(was_rejected, 0.0, final.gather(1, rejected)))
    noise = torch.empty_like(final).exponential_()
    for i, group in enumerate(groups):
        if group.generator is not None and not group.greedy:
            noise[i].exponential_(generator=group.generator)
    drawn = (final / noise).argmax(dim=-1)
    # Row j of a group: draft j while j < num_accepted, the drawn token at j == num_accepted.
    values = torch.where(torch.arange(width + 1, device=device) < num_accepted[:, None],
                         torch.cat([drafts, drafts[:, :1]], dim=1), drawn[:, None])
    pairs = [(g.start + j, i * (width + 1) + j) for i, g in enumerate(groups) if not g.greedy
             for j in range(len(g.drafts) + 1)]
    index = to_device([t for t, _ in pairs] + [s for _, s in pairs], torch.int64, device)
    tokens[index[: len(pairs)]] = values.flatten()[index[len(pairs):]]
