"""RMSNorm with the residual add fused in, as every Llama-family block uses it."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from fastllm.layers.fused import current_kernels


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.kernels = current_kernels()

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        """Without ``residual``: norm(x). With it: (norm(x + residual), x + residual)."""
        kernels = self.kernels
        if kernels is not None:
            if residual is None:
                return kernels.rms_norm(x, self.weight, self.eps)
            return kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
