"""Verification of draft tokens against the target model, exact for greedy and sampled requests.

Drafts come from a deterministic proposer (a point mass q), so speculative sampling
reduces to: accept draft x with probability p(x); on rejection sample from p with x
removed. The output distribution equals sampling from p one token at a time.

The whole step is verified at once, with at most three device-to-host copies whatever
the batch size: a copy per draft would stall a GPU step once per draft token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftGroup:
    """One sequence's rows of the step's probabilities: row ``start + j`` follows its first j drafts."""

    start: int
    drafts: list[int]
    greedy: bool
    generator: torch.Generator | None = None


def verify_drafts(probs: torch.Tensor, greedy_tokens: torch.Tensor, groups: list[DraftGroup]) -> list[list[int]]:
    """``probs [rows, vocab]`` and their argmax -> per group, its accepted drafts and one new token."""
    out: list[list[int]] = [[] for _ in groups]
    greedy_ids = greedy_tokens.tolist()
    sampled = []
    for i, group in enumerate(groups):
        if not group.greedy:
            sampled.append(i)
            continue
        row = group.start
        for draft in group.drafts:
            if greedy_ids[row] != draft:
                break
            out[i].append(draft)
            row += 1
        out[i].append(greedy_ids[row])
    if sampled:
        _verify_sampled(probs, [groups[i] for i in sampled], [out[i] for i in sampled])
    return out


def _verify_sampled(probs: torch.Tensor, groups: list[DraftGroup], out: list[list[int]]) -> None:
    """Accept each draft with probability p(draft) until one fails, then draw the next token
    from the residual (p without the rejected draft) or, all accepted, from the last row."""
    device = probs.device
    num_accepted = [0] * len(groups)
    rows = [g.start + j for g in groups for j in range(len(g.drafts))]
    if rows:
        tokens = [d for g in groups for d in g.drafts]
        p_draft = probs[torch.tensor(rows, device=device), torch.tensor(tokens, device=device)]
        uniform = torch.cat([torch.rand(len(g.drafts), generator=g.generator, device=device) for g in groups])
        accept = (uniform < p_draft).tolist()
        first = 0
        for i, group in enumerate(groups):
            while num_accepted[i] < len(group.drafts) and accept[first + num_accepted[i]]:
                num_accepted[i] += 1
            first += len(group.drafts)
    final = probs[torch.tensor([g.start + k for g, k in zip(groups, num_accepted)], device=device)]
    rejected = [(i, g.drafts[k]) for i, (g, k) in enumerate(zip(groups, num_accepted)) if k < len(g.drafts)]
    if rejected:
        final[[i for i, _ in rejected], [token for _, token in rejected]] = 0.0
    noise = torch.empty_like(final)
    for i, group in enumerate(groups):
        noise[i].exponential_(generator=group.generator)
    drawn = (final / noise).argmax(dim=-1).tolist()
    for i, (group, k) in enumerate(zip(groups, num_accepted)):
        out[i].extend(group.drafts[:k])
        out[i].append(drawn[i])
