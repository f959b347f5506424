"""One forward step as plain lists: the packed form of a SchedulerOutput that rank 0 sends its workers.

Lists of ints pickle far faster than small torch tensors (whose pickling goes through
torch.save) and carry no device, so each worker rebuilds the tensors on its own GPU. The
token ids travel as a shape only: they may hold tokens the previous step sampled on the
device, which rank 0 broadcasts device to device (``broadcast_input_ids``) instead of
waiting for them on the host, so that steps overlap under tensor parallelism too.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, NamedTuple, Optional

import torch

from fastllm.attention.metadata import AttentionMetadata
from fastllm.multimodal.inputs import StepMultimodal
from fastllm.platforms.transfer import to_device


class TensorData(NamedTuple):
    values: list[Any]
    dtype: torch.dtype


class Placeholder(NamedTuple):
    numel: int
    dtype: torch.dtype


Wire = tuple[Placeholder, TensorData, tuple[Any, ...], Optional[tuple[TensorData, ...]]]


def _plain(value: Any) -> Any:
    return TensorData(value.tolist(), value.dtype) if isinstance(value, torch.Tensor) else value


def _tensor(value: Any, device: torch.device) -> Any:
    if isinstance(value, TensorData):
        return to_device(value.values, value.dtype, device)
    return value


def encode_forward(input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                   multimodal: Optional[StepMultimodal] = None) -> Wire:
    """The arguments of ``ModelRunner.forward``; every metadata field travels, whatever it holds,
    and so do a multimodal step's positions and encoder outputs (rank 0 runs the encoder)."""
    mm = None if multimodal is None else tuple(_plain(getattr(multimodal, f.name)) for f in fields(multimodal))
    return (Placeholder(input_ids.numel(), input_ids.dtype), _plain(positions),
            tuple(_plain(getattr(meta, f.name)) for f in fields(meta)), mm)


def decode_forward(wire: Wire, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, Optional[StepMultimodal]]:
    """The forward's arguments; the token ids are an empty tensor for ``broadcast_input_ids`` to fill."""
    input_ids, positions, meta, mm = wire
    return (torch.empty(input_ids.numel, dtype=input_ids.dtype, device=device), _tensor(positions, device),
            AttentionMetadata(*(_tensor(value, device) for value in meta)),
            None if mm is None else StepMultimodal(*(_tensor(value, device) for value in mm)))
