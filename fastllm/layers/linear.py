"""Linear layers that shard themselves for tensor parallelism and load HF weights into the shard.

Quantizers swap these modules (gpt-fast style); model code never changes for them.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from fastllm.distributed.parallel_state import all_reduce, large_sums, tp_rank, tp_size
from fastllm.layers.fused import current_kernels


class LinearBase(nn.Module):
    """``y = x W^T + b`` over this rank's shard; ``tp_dim`` is the sharded weight dimension."""

    tp_dim: Optional[int] = None
    reduce_results = True  # row-parallel only; False: return this rank's partial sum, a later layer sums it

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        self.kernels = current_kernels()

    def shard_slices(self) -> dict[object, tuple[int, int]]:
        """Where each checkpoint shard lands in this rank's output rows: ``shard_id -> (offset, size)``.

        Fused layers have one entry per HF tensor they merge; quantized stand-ins reuse it to
        load and export their own tensors shard by shard.
        """
        return {None: (0, self.output_size)}

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        if self.tp_dim is not None and self.tp_dim < loaded.dim():
            size = param.shape[self.tp_dim]
            loaded = loaded.narrow(self.tp_dim, tp_rank() * size, size)
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x, self.bias)

    def product_into(self, x: torch.Tensor, weight_t: torch.Tensor, bias: Optional[torch.Tensor],
                     out: torch.Tensor) -> None:
        """``x W^T + bias`` into ``out`` (rows of a larger tensor), ``weight_t`` being ``W^T``."""
        torch.matmul(x, weight_t, out=out)
        if bias is not None:
            out += bias

    def product(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """``x W^T + bias`` through the platform's kernel (a dependent-launch GEMV at batch 1), or torch."""
        if self.kernels is None:
            return F.linear(x, self.weight, bias)
        return self.kernels.linear(x, self.weight, bias)


class ReplicatedLinear(LinearBase):
    pass


class ColumnParallelLinear(LinearBase):
    """Splits output features across ranks; each rank's output is a slice. An input whose rows a
    sequence-parallel norm is still gathering (``platforms.copy_engine_sums``) is multiplied in
    two parts: the rows already here while the others land, then those."""

    tp_dim = 0

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        _check_divisible(output_size, "output features")
        super().__init__(input_size, output_size // tp_size(), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sums = large_sums()
        here = None if sums is None else sums.rows_in_flight(x)
        if here is None:
            return self.product(x, self.bias)
        out = x.new_empty(x.shape[0], self.output_size)
        weight = self.weight.t()
        self.product_into(x[here], weight, self.bias, out[here])
        sums.settle(x)
        for rows in (slice(0, here.start), slice(here.stop, x.shape[0])):
            if rows.start < rows.stop:
                self.product_into(x[rows], weight, self.bias, out[rows])
        return out


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections in one matmul (gate and up of the MLP)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    def shard_slices(self) -> dict[object, tuple[int, int]]:
        return {i: (sum(self.output_sizes[:i]) // tp_size(), size // tp_size())
                for i, size in enumerate(self.output_sizes)}

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        offset, shard = self.shard_slices()[shard_id]
        loaded = loaded.narrow(0, tp_rank() * shard, shard)
        param.data.narrow(0, offset, shard).copy_(loaded)


class QKVParallelLinear(ColumnParallelLinear):
    """Query, key and value projections fused; heads are split across ranks."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False):
        _check_divisible(num_heads, "attention heads")
        _check_divisible(num_kv_heads, "key/value heads")
        self.head_dim = head_dim
        self.num_heads, self.num_kv_heads = num_heads // tp_size(), num_kv_heads // tp_size()
        super().__init__(hidden_size, (num_heads + 2 * num_kv_heads) * head_dim, bias)

    def shard_slices(self) -> dict[object, tuple[int, int]]:
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        offset, size = self.shard_slices()[shard_id]
        loaded = loaded.narrow(0, tp_rank() * size, size)
        param.data.narrow(0, offset, size).copy_(loaded)


class RowParallelLinear(LinearBase):
    """Splits input features across ranks and sums the partial products, or, with
    ``reduce_results=False``, leaves the sum to the norm after it (one kernel for both)."""

    tp_dim = 1

    def __init__(self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True):
        _check_divisible(input_size, "input features")
        super().__init__(input_size // tp_size(), output_size, bias)
        self.reduce_results = reduce_results
        if bias:
            self.bias.weight_loader = LinearBase.weight_loader.__get__(self)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        if loaded.dim() == 1:
            param.data.copy_(loaded)
        else:
            super().weight_loader(param, loaded, shard_id)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if tp_rank() == 0 else None
        sums = None if self.reduce_results or x.dim() != 2 else large_sums()
        out = None if sums is None else sums.partial_out(x.shape[0])
        if out is not None:  # row pieces into the copy engines' buffer, each sent while the next is computed
            weight = self.weight.t()
            for rows, peers in sums.plan(x.shape[0]):
                self.product_into(x[rows], weight, bias, out[rows])
                sums.send(rows, peers)
            return out
        out = self.product(x, bias)
        return all_reduce(out) if self.reduce_results else out


def _check_divisible(size: int, what: str) -> None:
    if size % tp_size():
        raise ValueError(f"{size} {what} cannot be split over tensor_parallel_size={tp_size()}")
