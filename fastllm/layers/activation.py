"""SwiGLU's gate: silu(gate) * up over a fused [gate | up] projection."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from fastllm.layers.fused import current_kernels


class SiluAndMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernels = current_kernels()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
