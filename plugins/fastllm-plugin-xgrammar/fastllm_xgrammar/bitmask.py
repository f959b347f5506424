"""One preallocated token bitmask for the whole batch: filled for the guided rows in one
threaded xgrammar call, started on a worker thread as soon as the matchers advance, applied in
one kernel, unguided rows never read or written."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional, Sequence

import torch
import xgrammar as xgr

HANDOFF_S = 1e-3
"""How long ``fill_ahead`` blocks for its worker to start. A thread that asks for the GIL while
another runs Python waits out the 5 ms switch interval, so the host lets go of it until the
worker is inside xgrammar (about 0.1 ms), but no longer than this where no core is free."""


def fill_threads() -> int:
    """Half the cores this process may run on, at most 8: xgrammar's own "auto" halves the
    machine's cores, which in a container can be far more than the process is given."""
    return max(1, min(8, len(os.sched_getaffinity(0)) // 2))


class TokenBitmask:
    """Host bitmask ``[capacity, ceil(vocab/32)]`` int32 that xgrammar fills, and the guided
    row indices beside it, plus device copies of both when the logits live on an accelerator.

    Buffers grow by doubling and are never freed, so a steady batch allocates nothing per
    step. For accelerator logits the host buffers are pinned and go up with non-blocking
    copies, so masking never waits for the forward pass queued before it (a pageable upload
    would). An event after the uploads guards the host buffers: the next fill waits only
    until the previous step's uploads have left them.

    ``fill_ahead`` starts filling the next masks of matchers that just advanced, on a worker
    thread (xgrammar drops the GIL while it fills), into a staging buffer in their own order,
    because the rows they will take are not known yet; the host meanwhile detokenizes and
    builds the next batch. ``apply`` waits for that fill, copies each row that was filled
    ahead into place and fills the others (a matcher's first mask) itself. Between the two no
    matcher may advance: the backend's ``accept_tokens``, where they do, waits for the fill first.
    """

    def __init__(self, vocab_size: int, capacity: int = 64, max_threads: Optional[int] = None):
        self.vocab_size = vocab_size
        self.filler = xgr.BatchGrammarMatcher(max_threads or fill_threads())
        self.host = xgr.allocate_token_bitmask(capacity, vocab_size)
        self.host_rows = torch.empty(capacity, dtype=torch.int32)
        self.device_mask: Optional[torch.Tensor] = None
        self.device_rows: Optional[torch.Tensor] = None
        self._uploaded: Optional[torch.cuda.Event] = None
        self.staging = xgr.allocate_token_bitmask(capacity, vocab_size)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xgrammar-fill")
        self._ahead: Optional[Future] = None
        self._ahead_matchers: list[xgr.GrammarMatcher] = []

    def fill_ahead(self, matchers: Sequence[xgr.GrammarMatcher]) -> None:
        """Start filling the masks ``matchers`` allow next; an earlier fill ahead is dropped."""
        self.wait_ahead()
        if not matchers:
            return
        if len(matchers) > self.staging.shape[0]:
            self.staging = xgr.allocate_token_bitmask(2 * len(matchers), self.vocab_size)
        self._ahead_matchers = list(matchers)
        started = threading.Event()

        def fill(matchers: list[xgr.GrammarMatcher], staging: torch.Tensor) -> None:
            started.set()
            self.filler.batch_fill_next_token_bitmask(matchers, staging)

        self._ahead = self._worker.submit(fill, self._ahead_matchers, self.staging)
        started.wait(HANDOFF_S)

    def wait_ahead(self) -> dict[int, int]:
        """Wait for the fill ahead, if any, and forget it; return each of its matchers' staging
        row, keyed by ``id(matcher)`` (valid until the next ``fill_ahead``)."""
        if self._ahead is None:
            return {}
        future, matchers, self._ahead, self._ahead_matchers = self._ahead, self._ahead_matchers, None, []
        future.result()
        return {id(matcher): row for row, matcher in enumerate(matchers)}

    def apply(self, logits: torch.Tensor, matchers: Sequence[Optional[xgr.GrammarMatcher]]) -> None:
        """Mask ``logits [rows, vocab]`` in place by each row's matcher (None: untouched)."""
        staged = self.wait_ahead()
        indices = [i for i, matcher in enumerate(matchers) if matcher is not None]
        if not indices:
            return
        self._reserve(len(matchers), logits.device)
        if self._uploaded is not None:
            self._uploaded.synchronize()
        self._fill(matchers, indices, staged)
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

    def _fill(self, matchers: Sequence[Optional[xgr.GrammarMatcher]], indices: list[int],
              staged: dict[int, int]) -> None:
        """Row ``i`` of ``host`` gets ``matchers[i]``'s mask: copied from staging if it was filled ahead."""
        ready = [(i, staged[id(matchers[i])]) for i in indices if id(matchers[i]) in staged]
        if ready:
            rows, staging_rows = (torch.tensor(column) for column in zip(*ready))
            self.host.index_copy_(0, rows, self.staging.index_select(0, staging_rows))
        late = [i for i in indices if id(matchers[i]) not in staged]
        if late:
            self.filler.batch_fill_next_token_bitmask([matchers[i] for i in late], self.host, late)

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
