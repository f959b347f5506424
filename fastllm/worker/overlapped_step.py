"""Tensor-parallel steps whose all-reduces run behind compute.

A large prefill step under tensor parallelism sums every layer's activations over the ranks
twice, and the GPU's arithmetic waits for each sum. Cut between rows into two micro-batches,
the step runs both a layer at a time, interleaved by the host, each on its own stream, with
every sum on a third: while one micro-batch's all-reduce runs, the other's GEMMs do. The
micro-batches read no keys the other writes (the cut is between rows), so their attention
needs no ordering. Every rank cuts the same step the same way and issues the sums in the same
order. Where the device has no streams (CPU) the micro-batches still interleave, one kernel
after another, which keeps the path under test.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, ContextManager, Optional

import torch

from fastllm.attention.metadata import ForwardContext, forward_context
from fastllm.distributed.parallel_state import collectives_on
from fastllm.worker.micro_batches import MicroBatch

MIN_SHARE = 0.25  # of the step's tokens in the smaller micro-batch: a lopsided cut hides little


class OverlappedSteps:
    """The streams of the two micro-batches and of their sums, made once per runner."""

    def __init__(self, device: torch.device):
        self.streams: Optional[list[torch.Stream]] = None
        if device.type != "cpu":
            self.streams = [torch.Stream(device) for _ in range(3)]  # two micro-batches, then the sums

    def run(self, model: Any, input_ids: torch.Tensor, positions: torch.Tensor, parts: list[MicroBatch],
            contexts: list[ForwardContext]) -> torch.Tensor:
        """The step's hidden states (``parts`` in order) from ``model.layer_steps`` of each part
        under its own ``contexts`` entry."""
        runs = [model.layer_steps(input_ids[part.tokens].clone(), positions[..., part.tokens].clone())
                for part in parts]
        caller = torch.accelerator.current_stream(input_ids.device) if self.streams else None
        for stream in self.streams[:len(parts)] if self.streams else ():
            stream.wait_stream(caller)
        outputs: list[Optional[torch.Tensor]] = [None] * len(parts)
        with collectives_on(self.streams[-1] if self.streams else None):
            while outputs[0] is None:  # the parts run the same layers: they finish in the same round
                for index, (steps, context) in enumerate(zip(runs, contexts)):
                    with self._on(index), forward_context(context):
                        outputs[index] = next(steps)
        for index, output in enumerate(outputs):
            if caller is not None:
                caller.wait_stream(self.streams[index])
                output.record_stream(caller)
        return torch.cat(outputs)

    def _on(self, index: int) -> ContextManager[Any]:
        return self.streams[index] if self.streams else nullcontext()
