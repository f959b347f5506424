"""One forward step as plain lists: what rank 0 sends its workers instead of Sequence objects.

Lists of ints pickle far faster than small torch tensors (whose pickling goes through
torch.save) and carry no device, so each worker rebuilds the tensors on its own GPU.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, NamedTuple, Optional

import torch

from fastllm.attention.metadata import AttentionMetadata
from fastllm.multimodal.inputs import StepMultimodal


class TensorData(NamedTuple):
    values: list[Any]
    dtype: torch.dtype


Wire = tuple[TensorData, TensorData, tuple[Any, ...], Optional[tuple[TensorData, ...]]]


def _plain(value: Any) -> Any:
    return TensorData(value.tolist(), value.dtype) if isinstance(value, torch.Tensor) else value


def _tensor(value: Any, device: torch.device) -> Any:
    if isinstance(value, TensorData):
        return torch.tensor(value.values, dtype=value.dtype, device=device)
    return value


def encode_forward(input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                   multimodal: Optional[StepMultimodal] = None) -> Wire:
    """The arguments of ``ModelRunner.forward``; every metadata field travels, whatever it holds,
    and so do a multimodal step's positions and encoder outputs (rank 0 runs the encoder)."""
    mm = None if multimodal is None else tuple(_plain(getattr(multimodal, f.name)) for f in fields(multimodal))
    return _plain(input_ids), _plain(positions), tuple(_plain(getattr(meta, f.name)) for f in fields(meta)), mm


def decode_forward(wire: Wire, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, Optional[StepMultimodal]]:
    input_ids, positions, meta, mm = wire
    return (_tensor(input_ids, device), _tensor(positions, device),
            AttentionMetadata(*(_tensor(value, device) for value in meta)),
            None if mm is None else StepMultimodal(*(_tensor(value, device) for value in mm)))
