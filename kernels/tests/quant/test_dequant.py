"""Every code at every position of a 32-bit word (or byte) dequantizes exactly.

The kernels turn codes into floats with magic numbers, a different mask, shift and exponent
per position, so each position is checked with every code: weights cycle through the codes
along N, x is 0/1, unit scales and an integer zero make every partial sum an exact integer,
and the kernel's output must equal the float64 reference exactly (NF4 and e4m3 values: to
float32 rounding). One row goes through the GEMV, three through the tensor-core kernel.
"""

from __future__ import annotations

import pytest
import torch

from fastllm_kernels.quant.fp8_gemm import FP8, fp8_gemm
from fastllm_kernels.quant.int4_gemm import dequantize_nf4, int4_gemm, nf4_gemm, pack_int4
from fastllm_kernels.quant.int8_gemm import int8_gemm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N, K = 256, 64  # N: every 8-bit value at each position; K: every position of several words


def ones_and_zeros(m: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(m)
    return torch.randint(0, 2, (m, K), generator=gen).to(DEVICE, dtype)


def cycled(period: int, step: int) -> torch.Tensor:
    """``[N, K]`` codes ``(n + step * k) % period``: each column (position) holds every code."""
    return (torch.arange(N)[:, None] + step * torch.arange(K)[None, :]) % period


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m", [1, 3])
def test_int4_codes(m, dtype):
    codes = cycled(16, 1)
    x = ones_and_zeros(m, dtype)
    scales = torch.ones(N, K // 16, device=DEVICE, dtype=dtype)
    zeros = torch.full((N, K // 16), 8.0, device=DEVICE, dtype=dtype)
    out = int4_gemm(x, pack_int4(codes).to(DEVICE), scales, zeros, 16)
    assert torch.equal(out.double(), x.double() @ (codes.double().to(DEVICE) - 8).T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m", [1, 3])
def test_int8_codes(m, dtype):
    codes = (cycled(256, 3) - 128).to(torch.int8)
    x = ones_and_zeros(m, dtype)
    out = int8_gemm(x, codes.to(DEVICE), torch.ones(N, device=DEVICE, dtype=dtype))
    assert torch.equal(out.double(), x.double() @ codes.double().to(DEVICE).T)


@pytest.mark.parametrize("m", [1, 3])
def test_nf4_codes(m):
    qweight = pack_int4(cycled(16, 1)).to(DEVICE)
    x = ones_and_zeros(m, torch.float32)
    absmax = torch.ones(N, K // 64, device=DEVICE)
    ref = x.double() @ dequantize_nf4(qweight, absmax.double(), 64, torch.float64).T
    assert torch.allclose(nf4_gemm(x, qweight, absmax, 64).double(), ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("m", [1, 3])
def test_e4m3_codes(m):
    bits = cycled(256, 7).to(torch.uint8)
    bits[(bits & 0x7F) == 0x7F] = 0  # the two NaN patterns
    weight = bits.view(FP8).to(DEVICE)
    x = ones_and_zeros(m, torch.float32)
    ref = x.double() @ weight.double().T
    out = fp8_gemm(x, weight, torch.ones(N, device=DEVICE)).double()
    assert torch.allclose(out, ref, rtol=1e-6, atol=1e-6)
