"""One forward step as rank 0 sends it to its workers: the packed step's two host buffers as raw bytes.

Raw bytes pickle as one copy each, where lists of ints or small tensors would be walked value
by value (or go through torch.save), and they carry no device: each worker puts them on its
own GPU with one copy per buffer and reads the same fields out of them that rank 0 does. The
token ids are overwritten on arrival: they may hold tokens the previous step sampled on the
device, which rank 0 broadcasts device to device (``broadcast_input_ids``) instead of waiting
for them on the host, so that steps overlap under tensor parallelism too. A multimodal step's
positions and encoder outputs (rank 0 runs the encoder) travel as lists beside them.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, NamedTuple, Optional

import torch

from fastllm.attention.metadata import AttentionMetadata
from fastllm.multimodal.inputs import StepMultimodal
from fastllm.platforms.transfer import host_tensor, to_device
from fastllm.worker.input_batch import PackedStep, step_metadata


class TensorData(NamedTuple):
    values: list[Any]
    dtype: torch.dtype


class Wire(NamedTuple):
    longs: bytes
    ints: bytes
    long_bounds: tuple[tuple[int, int], ...]
    int_bounds: tuple[tuple[int, int], ...]
    multimodal: Optional[tuple[Any, ...]] = None


def encode_forward(step: PackedStep, multimodal: Optional[StepMultimodal] = None) -> Wire:
    mm = None if multimodal is None else tuple(
        TensorData(value.tolist(), value.dtype) if isinstance(value, torch.Tensor) else value
        for value in (getattr(multimodal, f.name) for f in fields(multimodal)))
    return Wire(step.longs.numpy().tobytes(), step.ints.numpy().tobytes(), step.long_bounds, step.int_bounds, mm)


def decode_forward(wire: Wire, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, Optional[StepMultimodal]]:
    """``ModelRunner.forward``'s arguments on ``device``; the token ids for ``broadcast_input_ids`` to fill."""
    step = PackedStep(host_tensor(wire.longs, torch.int64, device), host_tensor(wire.ints, torch.int32, device),
                      wire.long_bounds, wire.int_bounds)
    longs, ints = step.to_device(device)
    mm = None if wire.multimodal is None else StepMultimodal(*(
        to_device(value.values, value.dtype, device) if isinstance(value, TensorData) else value
        for value in wire.multimodal))
    return longs[0], longs[1], step_metadata(longs, ints, *step.lengths()), mm
