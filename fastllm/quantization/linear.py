"""The base of every quantized stand-in for a ``LinearBase``: sharding, loading and output contract.

A quantization method subclasses ``QuantizedLinear``, declares its tensors with ``add_tensor``
and implements ``apply_weights``; bias, tensor-parallel reduction, checkpoint loading shard by
shard and the completeness check are the same for every method and live here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Literal, Optional

import torch
import torch.nn as nn

from fastllm.distributed.parallel_state import all_reduce, settled, tp_rank
from fastllm.layers.linear import LinearBase

# "output": dim 0 follows the layer's output rows (fused shards, column-parallel split).
# "input": a vector over the layer's input channels, one copy shared by every shard.
Layout = Literal["output", "input"]
LayerFactory = Callable[[str, nn.Module], nn.Module]


class CheckpointLayoutError(ValueError):
    """A checkpoint's tensors do not match the layout of the quantization method it declares."""


@dataclass(frozen=True)
class LinearSpec:
    """What a quantized module keeps of the ``LinearBase`` it replaces: shapes and sharding only,
    so the float weight can be freed as soon as the swap is done."""

    input_size: int
    output_size: int
    tp_dim: Optional[int]
    shard_slices: dict[object, tuple[int, int]]
    bias: bool
    dtype: torch.dtype
    device: torch.device
    reduce_results: bool = True

    @classmethod
    def of(cls, layer: LinearBase) -> "LinearSpec":
        return cls(layer.input_size, layer.output_size, layer.tp_dim, layer.shard_slices(),
                   layer.bias is not None, layer.weight.dtype, layer.weight.device, layer.reduce_results)

    def empty(self, *trailing: int, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """An uninitialised ``[output_size, *trailing]`` tensor (model dtype unless given)."""
        return torch.empty(self.output_size, *trailing, dtype=dtype or self.dtype, device=self.device)


class QuantizedLinear(nn.Module, ABC):
    """Replaces one ``LinearBase`` (gpt-fast style): the model code never changes for it."""

    def __init__(self, spec: LinearSpec):
        super().__init__()
        self.spec = spec
        self.input_size, self.output_size, self.tp_dim = spec.input_size, spec.output_size, spec.tp_dim
        self.reduce_results = spec.reduce_results
        self.shard_slices = spec.shard_slices
        self.layouts: dict[str, Layout] = {}
        self.required: set[str] = set()
        self.loaded_shards: dict[str, set[object]] = {}
        if spec.bias:
            self.add_tensor("bias", spec.empty())
        else:
            self.register_parameter("bias", None)

    def copy_bias(self, layer: nn.Module) -> None:
        """Take over the float bias of the layer (or module) this one replaces."""
        if self.bias is not None:
            self.bias.data.copy_(layer.bias.data)

    # ---- tensors ----------------------------------------------------------------------------
    def add_tensor(self, name: str, data: torch.Tensor, layout: Layout = "output",
                   required: bool = True) -> nn.Parameter:
        """Register ``data`` as the parameter ``name`` (the checkpoint's tensor name suffix)."""
        param = nn.Parameter(data, requires_grad=False)
        param.weight_loader = self.weight_loader
        self.register_parameter(name, param)
        self.layouts[name] = layout
        if required:
            self.required.add(name)
        return param

    def param_name(self, param: nn.Parameter) -> str:
        return next(name for name, p in self.named_parameters(recurse=False) if p is param)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        """Copy one checkpoint tensor (one shard of a fused layer) into ``param``."""
        name = self.param_name(param)
        try:
            self._load(name, param, loaded, shard_id)
        except (RuntimeError, IndexError) as exc:
            raise CheckpointLayoutError(f"{name} (shard {shard_id!r}, checkpoint shape {tuple(loaded.shape)}) "
                                        f"does not fit {type(self).__name__}: {exc}") from exc
        self.loaded_shards.setdefault(name, set()).add(shard_id)

    def _load(self, name: str, param: nn.Parameter, loaded: torch.Tensor, shard_id: object) -> None:
        loaded = self.convert_loaded(name, loaded)
        if self.layouts[name] == "input":
            target = param.data
            if self.tp_dim == 1:
                loaded = loaded.narrow(0, tp_rank() * target.shape[0], target.shape[0])
            if name in self.loaded_shards and not torch.equal(target, loaded.to(target.device, target.dtype)):
                raise CheckpointLayoutError(f"the shards of this fused layer disagree on {name}")
        else:
            if shard_id not in self.shard_slices:
                raise CheckpointLayoutError(f"{name}: shard {shard_id!r} is not one of {list(self.shard_slices)}")
            offset, size = self.shard_slices[shard_id]
            target = param.data.narrow(0, offset, size)
            if self.tp_dim == 0:
                loaded = loaded.narrow(0, tp_rank() * size, size)
            elif self.tp_dim == 1 and loaded.dim() > 1:
                loaded = loaded.narrow(1, tp_rank() * target.shape[1], target.shape[1])
        if tuple(loaded.shape) != tuple(target.shape):
            raise CheckpointLayoutError(
                f"{name} (shard {shard_id!r}) has shape {tuple(loaded.shape)} in the checkpoint; "
                f"{type(self).__name__} expects {tuple(target.shape)}")
        target.copy_(loaded)

    def convert_loaded(self, name: str, loaded: torch.Tensor) -> torch.Tensor:
        """One checkpoint tensor, whole, in this module's orientation (output rows first); identity here."""
        return loaded

    def finish_loading(self, prefix: str) -> nn.Module:
        """Check that every required tensor arrived, for every shard; return the module to keep.

        Checkpoint formats whose on-disk layout differs from the kernel's return a repacked module.
        """
        for name in sorted(self.required):
            got = self.loaded_shards.get(name, set())
            absent = set(self.shard_slices) - got if self.layouts[name] == "output" else set()
            if not got or absent:
                shards = f" (shards {sorted(map(str, absent))})" if got else ""
                raise CheckpointLayoutError(f"{prefix}.{name} is missing from the checkpoint{shards}")
        return self

    # ---- forward ----------------------------------------------------------------------------
    @abstractmethod
    def apply_weights(self, x: torch.Tensor) -> torch.Tensor:
        """``x [M, input_size]`` -> ``x W^T [M, output_size]`` in ``x``'s dtype, without bias."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = settled(x)  # a sequence-parallel norm's output, whole
        y = self.apply_weights(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
        row_parallel = self.tp_dim == 1
        if self.bias is not None and (not row_parallel or tp_rank() == 0):
            y = y + self.bias
        return all_reduce(y) if row_parallel and self.reduce_results else y

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}"


def replace_linear_layers(model: nn.Module, make: LayerFactory, kind: type = LinearBase) -> int:
    """Swap every submodule of type ``kind`` for ``make(qualified_name, module)``; returns the count.

    ``make`` may return the module itself to leave it in place.
    """
    names = [name for name, module in model.named_modules() if isinstance(module, kind)]
    for name in names:  # one layer at a time: each float weight is freed as soon as it is replaced
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(name, getattr(parent, child)))
    return len(names)
