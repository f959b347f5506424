"""4-bit GEMMs: ``y = x W^T`` with W stored as two 4-bit codes per byte and a scale per group.

Packing (``pack_int4``): ``qweight [N, K/2]`` uint8, byte ``j`` of a row holds input channel
``2j`` in its low nibble and ``2j + 1`` in its high nibble. Groups run along K.

* int4 (affine, group-wise): ``W[n, k] = (q - zeros[n, g]) * scales[n, g]``, ``g = k // group``.
* nf4 (codebook, block-wise absmax): ``W[n, k] = NF4[q] * absmax[n, g]``.

Both run on ``weight_gemm``'s kernels: codes unpacked in registers (int4 into floats by magic
numbers, no int-to-float conversion), NF4 values looked up two codes a load in a float16 pair
table in shared memory (``nf4_pairs``, the one-row kernel on NVIDIA GPUs with 16-bit
activations) or gathered from the 16-entry code book in registers, the scale applied per group
to partial sums.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from fastllm_kernels.quant.common import fused
from fastllm_kernels.quant.dequant import NF4_CODES
from fastllm_kernels.quant.weight_gemm import Tiling, WeightFormat, weight_gemm


@functools.lru_cache(maxsize=None)
def nf4_codebook(device: torch.device) -> torch.Tensor:
    return torch.tensor(NF4_CODES, dtype=torch.float32, device=device)


def int4_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
              group_size: int, tiling: Tiling | None = None) -> torch.Tensor:
    """Affine int4, Triton: ``scales``/``zeros`` ``[N, K / group_size]`` (zeros integer-valued)."""
    fmt = WeightFormat(four_bit=True, has_zero=True, group=group_size)
    return weight_gemm(x, qweight, scales, zeros, None, fmt, tiling)


def nf4_gemm(x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor, block_size: int,
             tiling: Tiling | None = None) -> torch.Tensor:
    """NF4, Triton: ``absmax [N, K / block_size]``."""
    fmt = WeightFormat(four_bit=True, nf4=True, group=block_size)
    return weight_gemm(x, qweight, absmax, None, nf4_codebook(x.device), fmt, tiling)


# ---- layout and torch references -------------------------------------------------------------
def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` codes in 0..15 -> ``[N, K/2]`` uint8 (even channel low nibble)."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """``[N, K/2]`` uint8 -> ``[N, K]`` uint8 codes."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    group_size: int, dtype: torch.dtype) -> torch.Tensor:
    q = unpack_int4(qweight).float().unflatten(1, (-1, group_size))
    w = (q - zeros.float()[..., None]) * scales.float()[..., None]
    return w.flatten(1).to(dtype)


def dequantize_nf4(qweight: torch.Tensor, absmax: torch.Tensor, block_size: int,
                   dtype: torch.dtype) -> torch.Tensor:
    codes = nf4_codebook(qweight.device)[unpack_int4(qweight).long()].unflatten(1, (-1, block_size))
    return (codes * absmax.float()[..., None]).flatten(1).to(dtype)


def int4_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                  group_size: int) -> torch.Tensor:
    return F.linear(x, dequantize_int4(qweight, scales, zeros, group_size, x.dtype))


def nf4_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor, block_size: int) -> torch.Tensor:
    return F.linear(x, dequantize_nf4(qweight, absmax, block_size, x.dtype))


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                group_size: int) -> torch.Tensor:
    """Fused kernel for decode-sized batches on the GPU, dequantize + matmul elsewhere."""
    if fused(x):
        return int4_gemm(x, qweight, scales, zeros, group_size)
    return int4_gemm_ref(x, qweight, scales, zeros, group_size)


def nf4_linear(x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor, block_size: int) -> torch.Tensor:
    if fused(x):
        return nf4_gemm(x, qweight, absmax, block_size)
    return nf4_gemm_ref(x, qweight, absmax, block_size)
