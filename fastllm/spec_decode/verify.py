"""Verification of draft tokens against the target model, exact for greedy and sampled requests.

Every row of a step is sampled on its own (``Sampler.sample``): row j of a sequence, which
follows its first j drafts, draws the token at output position p + j. A draft holds while it
equals the token its row drew; the first row that disagrees yields its own token, and the rows
after it are dropped. A row's noise is independent of the tokens before it (fresh, or Philox
keyed by the seed and the output position), so each kept token is an exact draw from the
target given the tokens before it, and a draft holds with probability p(draft), as in
speculative sampling with a deterministic proposer. A seeded request draws the same token at
each position as it would without drafts, so its output is the same token for token.

Everything runs on the device and nothing is read back here: the host learns the outcome
with the step's other results, in the one device-to-host copy of ``PendingStep``. A read
per step (let alone per draft) would stall the host behind the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastllm.platforms.transfer import to_device


@dataclass
class DraftGroup:
    """One sequence's rows of the step: row ``start + j`` follows its first j drafts."""

    start: int
    drafts: list[int]


def verify_drafts(tokens: torch.Tensor, groups: list[DraftGroup]) -> torch.Tensor:
    """``tokens [rows]`` (what each row drew) -> how many drafts each group keeps, ``[groups]``
    int64, without a device-to-host copy. At least one group has drafts. A group's output is
    ``tokens[start : start + num_accepted + 1]``: its kept drafts and the token after them."""
    device = tokens.device
    width = max(len(g.drafts) for g in groups)
    padded = [d for g in groups for d in g.drafts + [-1] * (width - len(g.drafts))]
    host = to_device(padded + [g.start for g in groups], torch.int64, device)
    drafts, starts = host[: len(padded)].view(len(groups), width), host[len(padded):]
    rows = (starts[:, None] + torch.arange(width, device=device)).clamp(max=tokens.shape[0] - 1)
    accepted = tokens[rows] == drafts  # padding (-1) never matches
    return accepted.long().cumprod(dim=-1).sum(dim=-1)
