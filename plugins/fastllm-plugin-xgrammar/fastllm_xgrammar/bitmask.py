"""One preallocated token bitmask for the whole batch: filled for the guided rows, applied in
one call, unguided rows never read or written."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import xgrammar as xgr


class TokenBitmask:
    """Host bitmask ``[capacity, ceil(vocab/32)]`` int32 that xgrammar fills, plus a device
    copy when the logits live on an accelerator.

    Both buffers grow by doubling and are never freed, so a steady batch size allocates
    nothing per step. The host buffer is pinned for accelerator logits, making the upload
    a plain DMA; only the rows up to the last guided one are copied.
    """

    def __init__(self, vocab_size: int, capacity: int = 64, max_threads: int | str = "auto"):
        self.vocab_size = vocab_size
        self.filler = xgr.BatchGrammarMatcher(max_threads)
        self.host = xgr.allocate_token_bitmask(capacity, vocab_size)
        self.device_mask: Optional[torch.Tensor] = None

    def apply(self, logits: torch.Tensor, matchers: Sequence[Optional[xgr.GrammarMatcher]]) -> None:
        """Mask ``logits [rows, vocab]`` in place by each row's matcher (None: untouched)."""
        indices = [i for i, matcher in enumerate(matchers) if matcher is not None]
        if not indices:
            return
        self._reserve(len(matchers), logits.device)
        self.filler.batch_fill_next_token_bitmask([matchers[i] for i in indices], self.host, indices)
        mask = self.host
        if logits.device.type != "cpu":
            rows = indices[-1] + 1
            self.device_mask[:rows].copy_(self.host[:rows], non_blocking=True)
            mask = self.device_mask
        xgr.apply_token_bitmask_inplace(logits, mask, indices=indices)

    def _reserve(self, rows: int, device: torch.device) -> None:
        """Grow (doubling) to hold ``rows`` and keep the device copy on ``device``."""
        capacity = self.host.shape[0]
        while capacity < rows:
            capacity *= 2
        on_device = device.type != "cpu"
        if capacity != self.host.shape[0] or (on_device and not self.host.is_pinned()):
            host = xgr.allocate_token_bitmask(capacity, self.vocab_size)
            self.host = host.pin_memory() if on_device else host
        if on_device and (self.device_mask is None or self.device_mask.device != device
                          or self.device_mask.shape[0] != capacity):
            self.device_mask = torch.empty_like(self.host, device=device)
