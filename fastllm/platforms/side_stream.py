"""Two independent chains of launches at once: on a CUDA device the first runs on a second
stream beside the second (CUDA graphs capture the fork and the join as parallel branches), so
that two chains of small, latency-bound kernels overlap; elsewhere they run one after the other."""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import torch

Main = TypeVar("Main")


@functools.lru_cache(maxsize=None)
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


def run_beside(side: Callable[[], torch.Tensor], main: Callable[[Callable[[], torch.Tensor]], Main],
               reads: torch.Tensor) -> Main:
    """``main(joined)`` with ``side()`` running beside it; ``joined()`` returns side's output, ready
    for what this stream launches after the call: call it right before the first launch that
    reads it, so that main's launches before that overlap side's. ``reads``: the one tensor
    ``side`` reads that this stream made. ``side`` must return one tensor and run no collective
    (two streams' collectives could interleave)."""
    if not reads.is_cuda:
        side_out = side()
        return main(lambda: side_out)
    this, other = torch.cuda.current_stream(), _side_stream(reads.device)
    other.wait_stream(this)
    with torch.cuda.stream(other):
        side_out = side()
    reads.record_stream(other)  # not reused on this stream while the side stream reads it
    joins: list[bool] = []

    def joined() -> torch.Tensor:
        if not joins:
            this.wait_stream(other)
            side_out.record_stream(this)
            joins.append(True)
        return side_out

    main_out = main(joined)
    joined()  # the streams meet again even where main never asked for side's output
    return main_out
