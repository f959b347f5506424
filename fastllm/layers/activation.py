"""SwiGLU's gate: silu(gate) * up over a fused [gate | up] projection."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from fastllm.layers.fused import kernels_for


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = kernels_for(x)
        if kernels is not None:
            return kernels.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
