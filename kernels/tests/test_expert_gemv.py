"""``expert_gemv``: the one-row GEMV over (token, expert) pairs, every weight format, against float64
products of the dequantized experts.

Gate/up: each pair's gate and up rows (half a program's rows each, a partial column tile) and
their SiLU-and-mul; down: each pair's row weighted, a token's k rows summed like K splits (also with
K itself split, partials in a NaN-poisoned workspace), the counters back at zero, and an addend (the
shared experts' output) joining the sums. Slots of one token on one expert, K past the last whole slice.
"""

from __future__ import annotations

import pytest
import torch

from fastllm_kernels.device import resident_blocks
from fastllm_kernels.quant.dequant import NF4_CODES
from fastllm_kernels.quant import weight_gemm
from fastllm_kernels.quant.weight_gemm import (EXPERT_TILING, FOUR_BIT_EXPERT_TILING, WIDE_EXPERT_TILING, Tiling,
                                               WeightFormat, expert_gemv)
from fastllm_kernels.split_k import scratch
from kernel_testing import DEVICE, four_bit, fp8_per_channel, randn, rel_err

FORMATS = ["float16", "float32", "fp8", "int4", "nf4"]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}


def experts(fmt: str, w: torch.Tensor) -> tuple[torch.Tensor, dict, WeightFormat, torch.Tensor]:
    """``w [E, N, K]`` float32 in ``fmt``: (weights, expert_gemv's scale/zero/book keywords, format,
    the values they stand for in float64)."""
    if fmt.startswith("float"):
        q = w.to(getattr(torch, fmt))
        return q, {"scales": None, "zeros": None, "codebook": None}, WeightFormat(False, dense=True), q.double()
    if fmt == "fp8":
        q, scale = fp8_per_channel(w)
        return (q, {"scales": scale, "zeros": None, "codebook": None}, WeightFormat(False, fp8=True),
                q.double() * scale.double()[..., None])
    book = torch.tensor(NF4_CODES, device=DEVICE) if fmt == "nf4" else None
    q, scale, zero, values = four_bit(w, 32, book)
    return (q, {"scales": scale, "zeros": zero, "codebook": book},
            WeightFormat(True, nf4=fmt == "nf4", has_zero=fmt == "int4", group=32), values)


def pairs_of(tokens: int, top_k: int, num_experts: int) -> torch.Tensor:
    ids = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(tokens)])
    ids[0, 1] = ids[0, 0]  # the first token's two slots on one expert
    return ids.reshape(-1).to(DEVICE)


def checked(fn):
    """``fn()`` with NaN in the split workspace; the arrival counters must end at zero."""
    workspace, counters = scratch(torch.device(DEVICE))
    with torch.inference_mode():
        workspace.fill_(float("nan"))
    out = fn()
    assert not counters.any()
    return out


@pytest.mark.parametrize("fmt,tiling", [(fmt, None) for fmt in FORMATS]
                         + [("fp8", EXPERT_TILING), ("fp8", WIDE_EXPERT_TILING), ("float16", WIDE_EXPERT_TILING)])
def test_gated_rows_give_silu_of_gate_times_up_for_each_pair(fmt, tiling):
    """Default tiles (off the GPU: 32 rows a program) and the GPU's: 4 rows (2 gate, 2 up rows), or
    16 over four warps (a program's last column tile partial)."""
    tokens, top_k, num_experts, inner, hidden = 2, 3, 8, 37, 96
    dtype = torch.float32 if fmt == "float32" else torch.float16
    q, quant, weight_format, values = experts(fmt, randn(num_experts, 2 * inner, hidden, dtype=torch.float32) / 10)
    x = randn(tokens, hidden, dtype=dtype)
    ids = pairs_of(tokens, top_k, num_experts)

    act = checked(lambda: expert_gemv(x, q, **quant, fmt=weight_format, ids=ids, rows_per_x=top_k, gated=True,
                                      tiling=tiling))

    products = torch.einsum("ph,pnh->pn", x.double().repeat_interleave(top_k, 0), values[ids.cpu()].to(DEVICE))
    gate, up = products.split(inner, dim=1)
    assert act.shape == (tokens * top_k, inner) and act.dtype == dtype
    assert rel_err(act, torch.nn.functional.silu(gate) * up) < TOLERANCE[dtype]


SPLIT_K = Tiling(4, 32, num_warps=1, num_stages=1, split_k=2)


ADDEND_CASES = [("fp8", True, None), ("float32", False, None), ("fp8", True, SPLIT_K), ("float16", False, SPLIT_K),
                ("fp8", True, WIDE_EXPERT_TILING), ("float16", False, WIDE_EXPERT_TILING)]


@pytest.mark.parametrize("fmt,summed,tiling,with_addend",
                         [(fmt, summed, None, False) for fmt in FORMATS for summed in (True, False)]
                         + [("fp8", True, SPLIT_K, False), ("int4", False, SPLIT_K, False)]
                         + [case + (True,) for case in ADDEND_CASES])
def test_down_rows_are_weighted_and_each_tokens_pairs_summed(fmt, summed, tiling, with_addend):
    """``with_addend``: the shared experts' output joins the float32 sums in the launch (a token's
    summed pairs or each pair's row; as the last K split arrives, or as the one split stores)."""
    tokens, top_k, num_experts, hidden, inner = 2, 3, 8, 38, 64
    dtype = torch.float32 if fmt == "float32" else torch.float16
    q, quant, weight_format, values = experts(fmt, randn(num_experts, hidden, inner, dtype=torch.float32) / 8)
    act = randn(tokens * top_k, inner, dtype=dtype)
    ids = pairs_of(tokens, top_k, num_experts)
    weights = torch.rand(tokens * top_k, device=DEVICE)
    addend = randn(tokens if summed else tokens * top_k, hidden, dtype=dtype) if with_addend else None

    out = checked(lambda: expert_gemv(act, q, **quant, fmt=weight_format, ids=ids, route_weights=weights,
                                      sum_pairs=top_k if summed else 1, ids_ready=True, addend=addend,
                                      out_dtype=None if summed else torch.float32, tiling=tiling))

    rows = torch.einsum("pk,pnk->pn", act.double(), values[ids.cpu()].to(DEVICE)) * weights.double()[:, None]
    expected = rows.view(tokens, top_k, hidden).sum(1) if summed else rows
    if with_addend:
        expected = expected + addend.double()
    assert out.shape == expected.shape and out.dtype == (dtype if summed else torch.float32)
    assert rel_err(out, expected) < TOLERANCE[dtype]


def test_the_addend_must_fit_the_output():
    q = randn(4, 32, 48, dtype=torch.float16)
    act, ids = randn(2, 48, dtype=torch.float16), torch.zeros(2, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="addend"):
        expert_gemv(act, q, None, None, None, WeightFormat(False, dense=True), ids, sum_pairs=2,
                    addend=randn(1, 31, dtype=torch.float16))


def test_weights_must_fit_the_rows():
    x = randn(1, 64, dtype=torch.float16)
    w = randn(4, 32, 48, dtype=torch.float16)
    with pytest.raises(ValueError, match="expert GEMV"):
        expert_gemv(x, w, None, None, None, WeightFormat(False, dense=True), torch.zeros(2, dtype=torch.long,
                                                                                         device=DEVICE))


def test_a_launch_past_one_wave_of_one_warp_programs_takes_four_warp_programs(monkeypatch):
    """On a 132-SM GPU: ERNIE-4.5-21B-A3B's gate/up (6 pairs of 3072 rows: 4608 one-warp programs for
    4224 places) goes wide, its down (3840) and 4-bit experts keep their tiles."""
    monkeypatch.setattr(weight_gemm, "compiled_nvidia", lambda device: True)
    monkeypatch.setattr(weight_gemm, "multiprocessors", lambda device: 132)
    monkeypatch.setattr(weight_gemm, "resident_blocks", lambda device: 32)
    gpu, fp8, int4 = torch.device("cuda"), WeightFormat(False, fp8=True), WeightFormat(True, group=32)
    assert weight_gemm.expert_tiling(fp8, gpu, 6 * 3072) == WIDE_EXPERT_TILING
    assert weight_gemm.expert_tiling(WeightFormat(False, dense=True), gpu, 6 * 3072) == WIDE_EXPERT_TILING
    assert weight_gemm.expert_tiling(fp8, gpu, 6 * 2560) == EXPERT_TILING
    assert weight_gemm.expert_tiling(int4, gpu, 6 * 3072) == FOUR_BIT_EXPERT_TILING


def test_one_wave_is_counted_with_the_devices_resident_blocks(monkeypatch):
    """An Ada SM (8.9) holds 24 blocks, a Hopper one 32: ERNIE's down (3840 programs) overflows 132
    Ada-style SMs (3168 places) but not Hopper's (4224)."""
    monkeypatch.setattr(weight_gemm, "compiled_nvidia", lambda device: True)
    monkeypatch.setattr(weight_gemm, "multiprocessors", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 9) if device.index == 1 else (9, 0))
    resident_blocks.cache_clear()
    try:
        fp8 = WeightFormat(False, fp8=True)
        assert weight_gemm.expert_tiling(fp8, torch.device("cuda", 1), 6 * 2560) == WIDE_EXPERT_TILING
        assert weight_gemm.expert_tiling(fp8, torch.device("cuda", 0), 6 * 2560) == EXPERT_TILING
    finally:
        resident_blocks.cache_clear()
