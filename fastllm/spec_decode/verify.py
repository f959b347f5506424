"""Verification of draft tokens against the target model, exact for greedy and sampled requests.

Drafts come from a deterministic proposer (a point mass q), so speculative sampling
reduces to: accept draft x with probability p(x); on rejection sample from p with x
removed. The output distribution equals sampling from p one token at a time.
"""

from __future__ import annotations

from typing import Optional

import torch


def verify_drafts(probs: torch.Tensor, drafts: list[int], greedy: bool,
                  generator: Optional[torch.Generator]) -> list[int]:
    """``probs [len(drafts)+1, vocab]`` -> accepted drafts followed by one new token."""
    out: list[int] = []
    for j, draft in enumerate(drafts):
        p = probs[j]
        if greedy:
            best = int(p.argmax())
            if best != draft:
                return out + [best]
            out.append(draft)
            continue
        u = torch.rand((), generator=generator, device=p.device) if generator else torch.rand((), device=p.device)
        if float(u) < float(p[draft]):
            out.append(draft)
            continue
        residual = p.clone()
        residual[draft] = 0.0
        return out + [_draw(residual, generator)]
    last = probs[len(drafts)]
    return out + [int(last.argmax()) if greedy else _draw(last, generator)]


def _draw(p: torch.Tensor, generator: Optional[torch.Generator]) -> int:
    noise = torch.empty_like(p).exponential_(generator=generator)
    return int((p / noise).argmax())
