"""``weight_gemm``'s split-K kernels, every format, against float64 dequantize-then-matmul.

Covers both loops (one row: FMA GEMV; 3 and 16 rows: tensor cores), K cut into several splits
(partials in the workspace, the last split adds them), ragged N, K not a multiple of the slice,
4-bit groups of 16 (two words a GEMV lane) to 128, a NaN-poisoned workspace, and the arrival
counters back at zero afterwards.
"""

from __future__ import annotations

import pytest
import torch

from fastllm_kernels.quant.fp8_gemm import (
    FP8, FP8_WEIGHTS, fp8_gemm, fp8_gemm_ref, quantize_fp8_rows_ref, quantize_fp8_rows_triton,
)
from fastllm_kernels.quant.int4_gemm import (
    NF4_CODES, dequantize_int4, dequantize_nf4, int4_gemm, nf4_gemm, pack_int4, unpack_int4,
)
from fastllm_kernels.linear import DENSE, linear
from fastllm_kernels.quant.int8_gemm import int8_gemm
from fastllm_kernels.quant.weight_gemm import Tiling, plan, weight_gemm
from fastllm_kernels.split_k import scratch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}
ROWS = [1, 3, 16]
SPLITS = [None, 1, 3]  # None: the launch heuristic's choice


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return ((out.double() - ref).norm() / ref.norm()).item()


def tiling(m: int, split: int | None, four_bit: bool) -> Tiling | None:
    """Small slices, so that a few hundred inputs still make several K iterations to split (one
    row: one-warp programs loading a slice ahead, as by default)."""
    if split is None:
        return None
    if m == 1:
        return Tiling(16, 64, num_warps=1, num_stages=2, split_k=split)
    return Tiling(32, 64 if four_bit else 128, split_k=split)


def run_poisoned(fn, *args) -> torch.Tensor:
    """Call with NaN in the partial-sum workspace; the arrival counters must end at zero. (The
    workspace may have been made under inference mode by an engine test run before this one.)"""
    workspace, counters = scratch(torch.device(DEVICE))
    with torch.inference_mode():
        workspace.fill_(float("nan"))
    out = fn(*args)
    assert not counters.any()
    return out


def activations(m: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(m, k, generator=gen).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("k", [400, 404])
def test_eight_bit(k, m, split, dtype):
    """K: three 128-slices and a ragged tail, which ends on a GEMV lane's 16 codes (400: the
    lane's loads masked as one) or within one (404: code by code)."""
    n = 37
    gen = torch.Generator().manual_seed(k + m * 10 + (split or 0))
    x = activations(m, k, dtype, gen)
    scales = (torch.rand(n, generator=gen) * 0.02 + 1e-3).to(DEVICE, dtype)
    q8 = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8).to(DEVICE)
    ref = x.double() @ (q8.double() * scales.double()[:, None]).T
    assert relative_error(run_poisoned(int8_gemm, x, q8, scales, tiling(m, split, False)), ref) < TOLERANCE[dtype]
    w8 = (torch.randn(n, k, generator=gen) * 40).clamp(-448, 448).to(FP8).to(DEVICE)
    ref = x.double() @ (w8.double() * scales.double()[:, None]).T
    assert relative_error(run_poisoned(fp8_gemm, x, w8, scales, tiling(m, split, False)), ref) < TOLERANCE[dtype]
    assert relative_error(fp8_gemm_ref(x, w8, scales), ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("group", [16, 32, 64, 128])
def test_four_bit(group, m, split, dtype):
    n, k = 29, 384
    gen = torch.Generator().manual_seed(group + m * 10 + (split or 0))
    x = activations(m, k, dtype, gen)
    qweight = pack_int4(torch.randint(0, 16, (n, k), generator=gen)).to(DEVICE)
    scales = (torch.rand(n, k // group, generator=gen) * 0.02 + 1e-3).to(DEVICE, dtype)
    zeros = torch.randint(0, 16, (n, k // group), generator=gen).to(DEVICE, dtype)
    ref = x.double() @ dequantize_int4(qweight, scales.double(), zeros.double(), group, torch.float64).T
    out = run_poisoned(int4_gemm, x, qweight, scales, zeros, group, tiling(m, split, True))
    assert relative_error(out, ref) < TOLERANCE[dtype]
    ref = x.double() @ dequantize_nf4(qweight, scales.double(), group, torch.float64).T
    out = run_poisoned(nf4_gemm, x, qweight, scales, group, tiling(m, split, True))
    assert relative_error(out, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("tiling_", [None, Tiling(8, 4096, 4, 2), Tiling(16, 4096, 4, 1, split_k=2),
                                     Tiling(8, 2048, 2, 2, split_k=3)])
@pytest.mark.parametrize("k", [2560, 4096])
def test_nf4_programs_of_several_warps(k, tiling_):
    """One row, programs of 2-4 warps whose lanes span K (the default from 2048 inputs): on the
    GPU, with 16-bit activations, they share the float16 pair table of ``nf4_pairs``; elsewhere
    they gather from the code book. The reference rounds the code book to float16 as the table
    does. K = 2560 leaves a ragged last slice."""
    n = 40
    gen = torch.Generator().manual_seed(k)
    x = activations(1, k, torch.float16, gen)
    qweight = pack_int4(torch.randint(0, 16, (n, k), generator=gen)).to(DEVICE)
    absmax = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).to(DEVICE, torch.float16)
    book = torch.tensor(NF4_CODES).half().double().to(DEVICE)
    weights = book[unpack_int4(qweight).long()].unflatten(1, (-1, 32)) * absmax.double()[..., None]
    ref = x.double() @ weights.flatten(1).T
    assert relative_error(run_poisoned(nf4_gemm, x, qweight, absmax, 32, tiling_), ref) < 2e-3


@pytest.mark.parametrize("slices", [2, 3, 4])
def test_one_row_share_loaded_before_the_wait(slices):
    """A one-row program of 2-4 slices of 8-bit codes loads them all before the wait (``PRELOAD``); K
    ends in a ragged slice."""
    n, k = 21, 64 * 4 * slices - 48
    tiling_ = Tiling(8, 64, num_warps=1, num_stages=2, split_k=4)
    fp8_plan = plan(1, n, k, FP8_WEIGHTS, tiling_, torch.float16, torch.device(DEVICE))
    assert fp8_plan.constexprs["PRELOAD"] and fp8_plan.constexprs["ITERS"] == slices
    gen = torch.Generator().manual_seed(slices)
    x = activations(1, k, torch.float16, gen)
    scales = (torch.rand(n, generator=gen) * 0.02 + 1e-3).to(DEVICE, torch.float16)
    w8 = (torch.randn(n, k, generator=gen) * 40).clamp(-448, 448).to(FP8).to(DEVICE)
    ref = x.double() @ (w8.double() * scales.double()[:, None]).T
    assert relative_error(run_poisoned(fp8_gemm, x, w8, scales, tiling_), ref) < 1e-2
    q8 = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8).to(DEVICE)
    ref = x.double() @ (q8.double() * scales.double()[:, None]).T
    assert relative_error(run_poisoned(int8_gemm, x, q8, scales, tiling_), ref) < 1e-2


def test_group_wider_than_slice():
    """A scale group spanning several K slices (one group for the whole row)."""
    gen = torch.Generator().manual_seed(5)
    n, k = 24, 256
    x = activations(1, k, torch.float32, gen)
    qweight = pack_int4(torch.randint(0, 16, (n, k), generator=gen)).to(DEVICE)
    scales = (torch.rand(n, 1, generator=gen) + 0.1).to(DEVICE)
    zeros = torch.randint(0, 16, (n, 1), generator=gen).float().to(DEVICE)
    ref = x.double() @ dequantize_int4(qweight, scales.double(), zeros.double(), k, torch.float64).T
    out = int4_gemm(x, qweight, scales, zeros, k, Tiling(16, 64, split_k=2))
    assert relative_error(out, ref) < TOLERANCE[torch.float32]


def test_whole_words_only():
    """The kernels read 32-bit words: K must fill them (the ``*_linear`` wrappers fall back)."""
    x = torch.randn(1, 18, device=DEVICE)
    q8 = torch.zeros(4, 18, dtype=torch.int8, device=DEVICE)
    with pytest.raises(ValueError, match="whole 32-bit words"):
        int8_gemm(x, q8, torch.ones(4, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else []))
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("k", [400, 404])
def test_dense(k, m, split, dtype):
    """Unquantized weights of x's dtype: K of three 128-slices (GEMV: one 512-slice) and a ragged tail
    ending on a GEMV lane's 8 inputs (400) or within one (404)."""
    n = 37
    gen = torch.Generator().manual_seed(k + m * 10 + (split or 0))
    x = activations(m, k, dtype, gen)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(DEVICE, dtype)
    ref = x.double() @ w.double().T
    out = run_poisoned(weight_gemm, x, w, None, None, None, DENSE, tiling(m, split, False))
    assert relative_error(out, ref) < TOLERANCE.get(dtype, 1e-2)


@pytest.mark.parametrize("split", [1, 3])
def test_dense_float32_output(split):
    """16-bit rows and weights, float32 output (ERNIE's float32 router at batch 1): the products are
    exact and summed in float32, so the result is float32-close, far closer than a 16-bit store."""
    gen = torch.Generator().manual_seed(11 + split)
    x = activations(1, 400, torch.float16, gen)
    w = (torch.randn(37, 400, generator=gen) * 0.05).to(DEVICE, torch.float16)
    out = run_poisoned(weight_gemm, x, w, None, None, None, DENSE, tiling(1, split, False), torch.float32)
    assert out.dtype == torch.float32
    assert relative_error(out, x.double() @ w.double().T) < 1e-6


@pytest.mark.skipif(DEVICE != "cuda", reason="two streams at once need a GPU")
def test_split_k_on_two_streams_at_once():
    """Split-K GEMVs on two branches of one CUDA graph (shared experts beside the routed ones), so
    that they run at once: each stream parks its partials and counts arrivals in its own scratch."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 4096, generator=gen).to(DEVICE, torch.bfloat16)
    weights = [(torch.randn(2048, 4096, generator=gen) * 0.02).to(DEVICE, torch.bfloat16) for _ in range(2)]
    refs = [x.double() @ w.double().T for w in weights]
    tiling = Tiling(8, 256, 1, 1, split_k=8)
    main, side = torch.cuda.Stream(), torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    for capture in (False, True):  # compile outside the capture, then capture the fork and join
        outs: list[list[torch.Tensor]] = [[], []]
        main.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(graph, stream=main) if capture else torch.cuda.stream(main):
            side.wait_stream(main)
            for _ in range(20):
                outs[0].append(weight_gemm(x, weights[0], None, None, None, DENSE, tiling))
                with torch.cuda.stream(side):
                    outs[1].append(weight_gemm(x, weights[1], None, None, None, DENSE, tiling))
            main.wait_stream(side)
        torch.cuda.current_stream().wait_stream(main)
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        for ref, results in zip(refs, outs):
            assert max(relative_error(out, ref) for out in results) < 1e-2


@pytest.mark.skipif(DEVICE != "cuda", reason="the GEMV path is taken on CUDA only")
@pytest.mark.parametrize("shape", [(1, 4096), (1, 1, 4096), (2, 4096)])
def test_linear_matches_blas(shape):
    """``linear`` (the GEMV at one row, BLAS otherwise) against ``F.linear`` in float64."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(shape, generator=gen).to(DEVICE, torch.bfloat16)
    w = (torch.randn(1000, 4096, generator=gen) * 0.02).to(DEVICE, torch.bfloat16)
    out = linear(x, w)
    assert out.shape == (*shape[:-1], 1000)
    assert relative_error(out, x.double() @ w.double().T) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_quantize_fp8_rows(dtype):
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(6, 300, generator=gen) * torch.rand(6, 1, generator=gen) * 10).to(DEVICE, dtype)
    q, scale = quantize_fp8_rows_triton(x)
    q_ref, scale_ref = quantize_fp8_rows_ref(x)
    assert torch.allclose(scale, scale_ref, rtol=1e-6, atol=0)
    if DEVICE == "cuda":
        assert (q.float() - q_ref.float()).abs().le(q_ref.float().abs() * 2 ** -3).all()  # one e4m3 step at most
    # Triton's interpreter drops the carry when e4m3 rounding overflows the mantissa, so on the
    # CPU only the reconstruction is checked, at e4m3 precision.
    assert relative_error(q.float() * scale, x.double()) < 0.1
