"""RMSNorm, alone and with the residual add fused in (one read of x and residual, one pass).

Statistics are taken in float32. With a residual, the sum is rounded to the residual's dtype
first and normalised from that rounded value, so ``out`` equals ``rms_norm(new_residual)``
exactly, as in the unfused Hugging Face layers. The fused add also takes ``x`` as several
summands a row (an MoE block's weighted expert rows, ``[rows, S, hidden]`` in float32), added in
order before the residual: at batch-1 decode that sum costs the norm a few loads from L2, where a
launch of its own, or the down GEMM's last-arrival epilogue, costs microseconds a layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastllm_kernels.host_math import next_power_of_2
from fastllm_kernels.pdl import pdl_launch, wait_for_inputs


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr, eps,
    stride_x, stride_summand, stride_residual, stride_out, stride_new_residual, hidden,
    BLOCK: tl.constexpr, SUMMANDS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr,
):
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # a parameter: before the wait
    wait_for_inputs(PDL, RELEASE_FIRST=True)
    row = tl.program_id(0).to(tl.int64)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    for summand in tl.static_range(1, SUMMANDS):
        x += tl.load(x_ptr + row * stride_x + summand * stride_summand + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0).to(tl.float32)
        summed = x.to(new_residual_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + row * stride_new_residual + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, 0) / hidden + eps)
    tl.store(out_ptr + row * stride_out + cols, (x * rstd * weight).to(out_ptr.dtype.element_ty),
             mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
            out: torch.Tensor, new_residual: torch.Tensor | None) -> None:
    """``x [rows, hidden]``, or ``[rows, S, hidden]``: S summands a row."""
    hidden = x.shape[-1]
    block = next_power_of_2(hidden)
    has_residual = residual is not None
    summands = x.shape[1] if x.dim() == 3 else 1
    _rms_norm_kernel[(x.shape[0],)](
        x, residual if has_residual else x, weight, out, new_residual if has_residual else out, eps,
        x.stride(0), x.stride(1) if summands > 1 else 0, residual.stride(0) if has_residual else 0, out.stride(0),
        new_residual.stride(0) if has_residual else 0, hidden,
        BLOCK=block, SUMMANDS=summands, HAS_RESIDUAL=has_residual, num_warps=norm_warps(block, summands),
        **pdl_launch(x.device),
    )


def norm_warps(block: int, summands: int) -> int:
    """Warps of a row's program: more with summands, so that every summand's loads are in flight at once."""
    return min(16, max(1, block // 512) * summands)


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """A 2-D view ``[rows, hidden]`` with a contiguous hidden dimension (no reshape of a 2-D
    tensor: views cost eager steps microseconds each)."""
    if x.dim() != 2:
        x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dimension, output in ``x.dtype``."""
    rows = as_rows(x)
    out = torch.empty_like(rows)
    if rows.shape[0]:
        _launch(rows, None, weight, eps, out, None)
    return out if x.dim() == 2 else out.view(x.shape)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       out: torch.Tensor | None = None,
                       new_residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``; the sum is kept in ``residual.dtype``. ``x``
    may hold one more dimension than ``residual``, its summands (``[rows, S, hidden]`` against
    ``[rows, hidden]``), added in order in float32 first; the norm is then in ``residual.dtype``.
    ``out`` / ``new_residual``: 2-D row views to write the results into (``residual`` itself may
    be ``new_residual``: each row is read before it is written)."""
    residual_rows = as_rows(residual)
    if x.dim() == residual.dim() + 1:
        rows = x.reshape(-1, *x.shape[-2:])
        rows = rows if rows.stride(-1) == 1 else rows.contiguous()
        out = torch.empty_like(residual_rows) if out is None else out
    else:
        rows = as_rows(x)
        out = torch.empty_like(rows) if out is None else out
    new_residual = torch.empty_like(residual_rows) if new_residual is None else new_residual
    if rows.shape[0]:
        _launch(rows, residual_rows, weight, eps, out, new_residual)
    if residual.dim() == 2:
        return out, new_residual
    return out.view(residual.shape), new_residual.view(residual.shape)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain torch RMSNorm in the input's dtype (call it on float64 tensors for a reference)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() == residual.dim() + 1:  # summands
        x = x.sum(-2)
    new_residual = x + residual
    return rms_norm_ref(new_residual, weight, eps), new_residual
