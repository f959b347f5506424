"""RMSNorm with the residual add fused in, as every Llama-family block uses it, and, after a
row-parallel layer that left its sum to it, the sum over the tensor-parallel ranks too."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from fastllm.distributed.parallel_state import (all_reduce, all_reduce_add_rms_norm, exchanged_partials,
                                                sequence_parallel_sums, tp_size)
from fastllm.layers.fused import current_kernels


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, sums_partials: bool = False):
        super().__init__()
        self.eps = eps
        self.sums_partials = sums_partials  # x is this rank's partial sum (``reduce_results=False``)
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.kernels = current_kernels()

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        """Without ``residual``: norm(x). With it: (norm(x + residual), x + residual); ``x`` may
        then be ``[T, S, hidden]``, S summands a row (an MoE block's expert rows), added first."""
        if self.sums_partials and tp_size() > 1:
            sums = sequence_parallel_sums() if residual is not None else None
            scattered = None if sums is None else sums.reduce_scatter(x)
            if scattered is not None:
                return self._norm_own_rows(sums, *scattered, residual)
            summands = exchanged_partials(x) if residual is not None else None
            fused = None if residual is None or summands is not None else all_reduce_add_rms_norm(
                x, residual, self.weight, self.eps)
            if fused is not None:
                return fused
            x = all_reduce(x) if summands is None else summands  # the ranks' partials, added with the residual
        kernels = self.kernels
        if kernels is not None:
            if residual is None:
                return kernels.rms_norm(x, self.weight, self.eps)
            return kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)
        if residual is None:
            return self._norm(x)
        if x.dim() > residual.dim():
            x = x.sum(-2).to(residual.dtype)
        x = x + residual
        return self._norm(x), x

    def _norm_own_rows(self, sums, summands: torch.Tensor, rows: slice, residual: torch.Tensor):
        """Sequence parallel: add the ranks' partials of this rank's ``rows`` (``summands``) to
        those rows of ``residual`` (in place) and normalise them into the gather buffer, whose
        other rows the peers send. Returns the gathered output, still in flight (``settled``),
        and ``residual``, whose other rows this rank neither updates nor reads again."""
        out = sums.gather_out(residual.shape[0])
        own_out, own_residual = out[rows], residual[rows]
        if self.kernels is not None:
            self.kernels.fused_add_rms_norm(summands, own_residual, self.weight, self.eps, out=own_out,
                                            new_residual=own_residual)
        else:
            own_residual += summands.sum(-2).to(residual.dtype)
            own_out.copy_(self._norm(own_residual))
        return sums.start_gather(out), residual
