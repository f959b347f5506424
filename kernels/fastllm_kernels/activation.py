"""SwiGLU gate: ``silu(x[:, :I]) * x[:, I:]`` over the fused gate/up projection output.

Fusing it saves writing and re-reading the ``[T, I]`` silu result; the math is float32 with
one rounding at the end.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fastllm_kernels.host_math import cdiv
from fastllm_kernels.pdl import pdl_launch, wait_for_inputs

_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_out, inner, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inner
    gate = tl.load(x_ptr + token * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + token * stride_x + inner + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + token * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``x [..., 2 * I]`` -> ``[..., I]``."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    inner = rows.shape[1] // 2
    out = rows.new_empty((rows.shape[0], inner))
    if rows.shape[0]:
        _silu_and_mul_kernel[(rows.shape[0], cdiv(inner, _BLOCK))](
            rows, out, rows.stride(0), out.stride(0), inner, BLOCK=_BLOCK, num_warps=4, **pdl_launch(x.device))
    return out.view(*x.shape[:-1], inner)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
