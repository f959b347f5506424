"""Dequantize-GEMM kernels against a float64 product with the dequantized weights.

Without a GPU they run under ``TRITON_INTERPRET=1`` (set by ``kernels/tests/conftest.py``) at
small sizes; on a GPU the same tests run the compiled kernels.
"""

from __future__ import annotations

import pytest
import torch

from fastllm_kernels.quant.int4_gemm import (
    dequantize_int4, dequantize_nf4, int4_gemm, int4_gemm_ref, nf4_gemm, nf4_gemm_ref, pack_int4,
)
from fastllm_kernels.quant.int8_gemm import int8_gemm, int8_gemm_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2}
SHAPES = [(1, 48, 256), (5, 64, 384), (17, 40, 512)]  # (M, N, K): ragged M and N, several K steps


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return ((out.double() - ref).norm() / ref.norm()).item()


def activations(m: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(m, k, generator=gen).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_int8_gemm(m, n, k, dtype):
    gen = torch.Generator().manual_seed(m * n + k)
    x = activations(m, k, dtype, gen)
    q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8).to(DEVICE)
    s = (torch.rand(n, generator=gen) * 0.02 + 1e-3).to(DEVICE, dtype)
    ref = x.double() @ (q.double() * s.double()[:, None]).T
    assert relative_error(int8_gemm(x, q, s), ref) < TOLERANCE[dtype]
    assert relative_error(int8_gemm_ref(x, q, s), ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_int4_gemm(m, n, k, group, dtype):
    gen = torch.Generator().manual_seed(m + n * k + group)
    x = activations(m, k, dtype, gen)
    codes = torch.randint(0, 16, (n, k), generator=gen)
    s = (torch.rand(n, k // group, generator=gen) * 0.02 + 1e-3).to(DEVICE, dtype)
    z = torch.randint(0, 16, (n, k // group), generator=gen).to(DEVICE, dtype)
    qweight = pack_int4(codes).to(DEVICE)
    w = (codes.double().to(DEVICE) - z.double().repeat_interleave(group, 1)) * s.double().repeat_interleave(group, 1)
    assert torch.allclose(dequantize_int4(qweight, s, z, group, torch.float64), w, rtol=1e-6, atol=0)
    ref = x.double() @ w.T
    assert relative_error(int4_gemm(x, qweight, s, z, group), ref) < TOLERANCE[dtype]
    assert relative_error(int4_gemm_ref(x, qweight, s, z, group), ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_nf4_gemm(m, n, k, dtype):
    gen = torch.Generator().manual_seed(7 * m + n + k)
    x = activations(m, k, dtype, gen)
    qweight = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8).to(DEVICE)
    absmax = (torch.rand(n, k // 64, generator=gen) * 0.1 + 1e-2).to(DEVICE, dtype)
    ref = x.double() @ dequantize_nf4(qweight, absmax.double(), 64, torch.float64).T
    assert relative_error(nf4_gemm(x, qweight, absmax, 64), ref) < TOLERANCE[dtype]
    assert relative_error(nf4_gemm_ref(x, qweight, absmax, 64), ref) < TOLERANCE[dtype]
