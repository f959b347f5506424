"""One preallocated token bitmask for the whole batch: filled for the guided rows in one
threaded xgrammar call, applied in one kernel, unguided rows never read or written."""

from __future__ import annotations

import math
import os
import time
from typing import Optional, Sequence

import torch
import xgrammar as xgr


def fill_threads() -> int:
    """Half the cores this process may run on, at most 8: xgrammar's own "auto" halves the
    machine's cores, which in a container can be far more than the process is given."""
    return max(1, min(8, len(os.sched_getaffinity(0)) // 2))


class BatchFiller:
    """xgrammar's batch mask fill, on as many threads as the last fill's time pays for.

    Handing rows to threads costs more than most rows' fill (a few us): on the development
    machine one thread fills 24 such rows in 0.12 ms and two threads take 0.2 ms, and on the
    H100's host eight threads took 0.5 ms a step for ~35 of them. A hard grammar state can take
    a millisecond a row, where threads pay. So a fill uses one thread per ``chunk_s`` that the
    previous fill took (at most ``max_threads``): cheap batches settle on one or two threads, a
    costly one gets them all from its next step on.
    """

    def __init__(self, max_threads: int, chunk_s: float = 2e-4):
        self.max_threads, self.chunk_s = max_threads, chunk_s
        self.threads = 1
        self._fillers: dict[int, xgr.BatchGrammarMatcher] = {}

    def fill(self, matchers: list[xgr.GrammarMatcher], bitmask: torch.Tensor, indices: list[int]) -> None:
        filler = self._fillers.get(self.threads)
        if filler is None:
            filler = self._fillers[self.threads] = xgr.BatchGrammarMatcher(self.threads)
        start = time.perf_counter()
        filler.batch_fill_next_token_bitmask(matchers, bitmask, indices)
        self.threads = max(1, min(self.max_threads, math.ceil((time.perf_counter() - start) / self.chunk_s)))


class TokenBitmask:
    """Host bitmask ``[capacity, ceil(vocab/32)]`` int32 that xgrammar fills, and the guided
    row indices beside it, plus device copies of both when the logits live on an accelerator.

    Buffers grow by doubling and are never freed, so a steady batch allocates nothing per
    step. For accelerator logits the host buffers are pinned and go up with non-blocking
    copies, so masking never waits for the forward pass queued before it (a pageable upload
    would). An event after the uploads guards the host buffers: the next fill waits only
    until the previous step's uploads have left them.
    """

    def __init__(self, vocab_size: int, capacity: int = 64, max_threads: Optional[int] = None):
        self.vocab_size = vocab_size
        self.filler = BatchFiller(max_threads or fill_threads())
        self.host = xgr.allocate_token_bitmask(capacity, vocab_size)
        self.host_rows = torch.empty(capacity, dtype=torch.int32)
        self.device_mask: Optional[torch.Tensor] = None
        self.device_rows: Optional[torch.Tensor] = None
        self._uploaded: Optional[torch.cuda.Event] = None

    def apply(self, logits: torch.Tensor, matchers: Sequence[Optional[xgr.GrammarMatcher]]) -> None:
        """Mask ``logits [rows, vocab]`` in place by each row's matcher (None: untouched)."""
        indices = [i for i, matcher in enumerate(matchers) if matcher is not None]
        if not indices:
            return
        self._reserve(len(matchers), logits.device)
        if self._uploaded is not None:
            self._uploaded.synchronize()
        self.filler.fill([matchers[i] for i in indices], self.host, indices)
        if logits.device.type == "cpu":
            xgr.apply_token_bitmask_inplace(logits, self.host, indices=indices)
            return
        count, rows = len(indices), indices[-1] + 1
        self.host_rows[:count] = torch.as_tensor(indices, dtype=torch.int32)
        self.device_mask[:rows].copy_(self.host[:rows], non_blocking=True)
        self.device_rows[:count].copy_(self.host_rows[:count], non_blocking=True)
        if logits.device.type == "cuda":
            self._uploaded = torch.cuda.Event()
            self._uploaded.record()
        xgr.apply_token_bitmask_inplace(logits, self.device_mask, indices=self.device_rows[:count])

    def _reserve(self, rows: int, device: torch.device) -> None:
        """Grow (doubling) to hold ``rows`` and keep the device copies on ``device``."""
        capacity = self.host.shape[0]
        while capacity < rows:
            capacity *= 2
        on_device = device.type != "cpu"
        if capacity != self.host.shape[0] or (on_device and not self.host.is_pinned()):
            if self._uploaded is not None:
                self._uploaded.synchronize()
                self._uploaded = None
            self.host = xgr.allocate_token_bitmask(capacity, self.vocab_size)
            self.host_rows = torch.empty(capacity, dtype=torch.int32)
            if on_device:
                self.host, self.host_rows = self.host.pin_memory(), self.host_rows.pin_memory()
        if on_device and (self.device_mask is None or self.device_mask.device != device
                          or self.device_mask.shape[0] != capacity):
            self.device_mask = torch.empty_like(self.host, device=device)
            self.device_rows = torch.empty_like(self.host_rows, device=device)
