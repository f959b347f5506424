"""Tensor-parallel steps whose sums over the ranks run behind compute.

A large prefill step under tensor parallelism sums every layer's activations over the ranks
twice, and the GPU's arithmetic waits for each sum. Cut between rows into two micro-batches,
the step runs both a layer at a time, interleaved by the host, each on its own stream: while
one micro-batch's partial sums travel, the other's GEMMs run. The sums travel by copy engine
(``platforms.copy_engine_sums``), which takes no SM from those GEMMs. The micro-batches read no
keys the other writes (the cut is between rows), so their attention needs no ordering. Every
rank cuts the same step the same way and issues the sums in the same order. On the CPU the
micro-batches still interleave, one kernel after another, with the usual all-reduces, which
keeps the path under test.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, ContextManager, Optional

import torch

from fastllm.attention.metadata import ForwardContext, forward_context
from fastllm.config import EngineConfig
from fastllm.distributed.parallel_state import ep_size, partial_sums_by_copy, pp_size, tp_group, tp_size
from fastllm.platforms.copy_engine_sums import CopyEngineSums, copy_engine_sums
from fastllm.worker.micro_batches import MicroBatch

MIN_SHARE = 0.25  # of the step's tokens in the smaller micro-batch: a lopsided cut hides little


class OverlappedSteps:
    """The micro-batches' streams and the copy-engine sums (None on the CPU), made once per runner."""

    def __init__(self, device: torch.device, sums: Optional[CopyEngineSums]):
        self.sums = sums
        # the first micro-batch's kernels go first wherever both are ready: started together at equal
        # priority, the two would compute side by side and then both wait for their sums; this way
        # the second fills the SMs while the first's sums travel, and the other way round
        self.streams = ([torch.cuda.Stream(device, priority=-10), torch.cuda.Stream(device)]
                        if sums is not None else None)

    def run(self, model: Any, input_ids: torch.Tensor, positions: torch.Tensor, parts: list[MicroBatch],
            contexts: list[ForwardContext]) -> torch.Tensor:
        """The step's hidden states (``parts`` in order) from ``model.layer_steps`` of each part
        under its own ``contexts`` entry."""
        runs = [model.layer_steps(input_ids[part.tokens].clone(), positions[..., part.tokens].clone())
                for part in parts]
        caller = torch.accelerator.current_stream(input_ids.device) if self.streams else None
        for stream in self.streams or ():
            stream.wait_stream(caller)
        outputs: list[Optional[torch.Tensor]] = [None] * len(parts)
        while outputs[0] is None:  # the parts run the same layers: they finish in the same round
            for index, (steps, context, part) in enumerate(zip(runs, contexts, parts)):
                with self._on(index), forward_context(context), partial_sums_by_copy(self.sums, index, part.tokens):
                    outputs[index] = next(steps)
        for index, output in enumerate(outputs):
            if caller is not None:
                caller.wait_stream(self.streams[index])
                output.record_stream(caller)
        return torch.cat(outputs)

    def _on(self, index: int) -> ContextManager[Any]:
        return self.streams[index] if self.streams else nullcontext()


def overlapped_steps(config: EngineConfig, hf_config: Any, model: Any, device: torch.device,
                     dtype: torch.dtype) -> Optional[OverlappedSteps]:
    """Overlapped steps for this rank's model, or None where they do not apply: one GPU, turned off,
    pipeline or expert parallelism (whose collectives are not sums of the layer's rows), multimodal
    models (their forward prepares per-step state), or a GPU without copy-engine sums. Every
    tensor-parallel rank calls it (the buffers' rendezvous is collective)."""
    if (tp_size() == 1 or not config.tp_overlap_min_tokens or pp_size() > 1 or ep_size() > 1
            or hasattr(model, "encode_multimodal") or not hasattr(model, "layer_steps")):
        return None
    if device.type == "cpu":
        return OverlappedSteps(device, None)
    sums = copy_engine_sums(tp_group(), device, config.max_num_batched_tokens, hf_config.hidden_size, dtype)
    return None if sums is None else OverlappedSteps(device, sums)
