"""Weight-only GEMM kernels vs the bf16 matmul on Llama-3-8B's linear shapes, decode-sized batches.

Timed the way decode runs them: one CUDA graph of ``--calls`` back-to-back calls, rotating over
enough copies of the weights that they never sit in the 50 MB L2 (as 32 layers never do), so
there are no launch gaps and no cache flushes between calls; the median over ``--replays``
replays, per call. The table shows microseconds and weight bytes streamed per second (an H100
copies ~3,000 GB/s), and, per format, the four layers' sum times 32 layers: the linear layers'
share of one decode step. ``fp8`` is the W8A16 kernel decode uses, ``fp8_w8a8`` the per-token
activation quantization + ``torch._scaled_mm`` of large batches. ``--sweep`` times launch
settings per kernel with the same graphs instead (the data behind ``default_tiling``), on these
shapes or (``--model``) a bundled config's decode GEMVs besides the routed experts; ``dense`` sweeps the
one-row bf16 kernel.
Prints a table and writes JSON (``--out``); needs a CUDA GPU.

    python benchmarks/quant_gemm.py --out quant_gemm.json
    python benchmarks/quant_gemm.py --sweep --out quant_gemm_sweep.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Callable

import torch
import torch.nn.functional as F

from fastllm_kernels.quant.fp8_gemm import FP8_WEIGHTS, fp8_gemm, quantize_fp8_rows
from fastllm_kernels.quant.int4_gemm import int4_gemm, nf4_gemm, pack_int4
from fastllm_kernels.quant.int8_gemm import INT8, int8_gemm
from fastllm_kernels.linear import DENSE
from fastllm_kernels.quant.weight_gemm import Tiling, WeightFormat, default_tiling, weight_gemm

from fastllm.model_loader.dummy_loader import DummyLoader

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}
LAYERS = 32  # Llama-3-8B
COLD_BYTES = 200 << 20  # weight copies per graph: four times an H100's L2
QUANTIZED = ("int8", "fp8", "int4", "nf4")
Kernel = Callable[[torch.Tensor, "Tiling | None"], torch.Tensor]


def decode_shapes(model: str) -> dict[str, tuple[int, int]]:
    """The (N, K) of a bundled config's GEMVs a batch-1 decode of an MoE model runs besides its
    routed experts (``--model``): attention projections, LM head, and where the config has them
    the shared experts and the dense MLP before the first MoE layer."""
    config = DummyLoader().load_config(model)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    heads, kv_heads, hidden = config.num_attention_heads, config.num_key_value_heads, config.hidden_size
    shapes = {"qkv_proj": ((heads + 2 * kv_heads) * head_dim, hidden), "o_proj": (hidden, heads * head_dim),
              "lm_head": (config.vocab_size, hidden)}
    shared = getattr(config, "moe_num_shared_experts", 0) * getattr(config, "moe_intermediate_size", 0)
    if shared:
        shapes.update(shared_gate_up=(2 * shared, hidden), shared_down=(hidden, shared))
    if getattr(config, "moe_layer_start_index", 0):
        shapes.update(dense_gate_up=(2 * config.intermediate_size, hidden), dense_down=(hidden, config.intermediate_size))
    return shapes


def weight_copy(name: str, n: int, k: int) -> tuple[Kernel, int]:
    """One random copy of a layer's weights in format ``name``: (fn(x, tiling), bytes it streams).
    ``dense``: bf16 weights through the one-row kernel that batch-1 decode runs (``bf16``: BLAS)."""
    if name in ("bf16", "dense", "fp8", "fp8_w8a8"):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        if name == "bf16":
            return (lambda x, t: F.linear(x, w)), 2 * n * k
        if name == "dense":
            return (lambda x, t: weight_gemm(x, w, None, None, None, DENSE, t)), 2 * n * k
        w8, ws8 = quantize_fp8_rows(w)
        ws8 = ws8.squeeze(1).contiguous()
        if name == "fp8":
            return (lambda x, t: fp8_gemm(x, w8, ws8, t)), n * k + 4 * n

        def w8a8(x: torch.Tensor, t: Tiling | None) -> torch.Tensor:
            x_fp8, x_scale = quantize_fp8_rows(x)
            return torch._scaled_mm(x_fp8, w8.t(), scale_a=x_scale, scale_b=ws8[None, :], out_dtype=x.dtype)
        return w8a8, n * k + 4 * n
    if name == "int8":
        q8 = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8)
        s8 = torch.rand(n, device="cuda", dtype=torch.bfloat16) * 1e-3
        return (lambda x, t: int8_gemm(x, q8, s8, t)), n * k + 2 * n
    q4 = pack_int4(torch.randint(0, 16, (n, k), device="cuda"))
    if name == "int4":
        s4 = torch.rand(n, k // 128, device="cuda", dtype=torch.bfloat16) * 1e-2
        z4 = torch.randint(0, 16, (n, k // 128), device="cuda").to(torch.bfloat16)
        return (lambda x, t: int4_gemm(x, q4, s4, z4, 128, t)), n * k // 2 + 4 * n * k // 128
    a4 = torch.rand(n, k // 32, device="cuda", dtype=torch.bfloat16) * 1e-2
    return (lambda x, t: nf4_gemm(x, q4, a4, 32, t)), n * k // 2 + 2 * n * k // 32


class ColdWeights:
    """Enough copies of one layer in one format that a pass over them misses L2."""

    def __init__(self, name: str, n: int, k: int):
        first, self.nbytes = weight_copy(name, n, k)
        self.fns = [first] + [weight_copy(name, n, k)[0] for _ in range(max(1, -(-COLD_BYTES // self.nbytes)) - 1)]

    def us_per_call(self, x: torch.Tensor, tiling: Tiling | None, calls: int, replays: int) -> float:
        """Median time of one call within a captured graph of ``calls`` calls over the copies."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for fn in self.fns:  # compile and allocate outside the capture
                fn(x, tiling)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                self.fns[i % len(self.fns)](x, tiling)
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(replays):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / calls)
        del graph
        return statistics.median(times)


FORMATS = {"int8": INT8, "fp8": FP8_WEIGHTS, "int4": WeightFormat(True, has_zero=True, group=128),
           "nf4": WeightFormat(True, nf4=True, group=32), "dense": DENSE}  # as the benchmarked weights (nf4: the plugin default)
SWEPT = QUANTIZED + ("dense",)


def sweep_tilings(name: str, m: int) -> list[Tiling]:
    """Launch settings tried by ``--sweep`` (split_k None: the heuristic's). One row: rows per
    one-warp program, loads one slice ahead or not, no split, a slice twice the default's, and
    for nf4 programs of 2 or 4 warps sharing the pair table; more rows: tensor-core tiles."""
    if m == 1:
        lane = 1024 if FORMATS[name].four_bit else 256 if name == "dense" else 512  # one warp's slice
        tilings = ([Tiling(bn, lane, 1, stages) for bn in (4, 8, 16) for stages in (1, 2)]
                   + [Tiling(8, lane, 1, stages, 1) for stages in (1, 2)] + [Tiling(8, 2 * lane, 1, 2)]
                   + [Tiling(4, lane, 1, stages, split) for stages in (1, 2) for split in (2, 4, 8)]
                   + [Tiling(8, 2 * lane, 1, 1), Tiling(16, 2 * lane, 1, 2), Tiling(8, 2 * lane, 1, 2, 4)]
                   + [Tiling(8, 2 * lane, 1, 1, split) for split in (2, 4, 8)]
                   + [Tiling(16, 2 * lane, 1, 1), Tiling(8, 4 * lane, 1, 1)])
        if name == "fp8":  # two-warp programs: twice the bytes in flight a program
            tilings += [Tiling(bn, 2 * lane, 2, stages) for bn in (8, 16) for stages in (1, 2)]
        if name == "nf4":
            tilings += [Tiling(bn, 1024 * warps, warps, stages) for bn in (8, 16) for warps in (2, 4) for stages in (1, 2)]
        return tilings
    return [Tiling(32, 64, 4, 4), Tiling(32, 128, 4, 4), Tiling(64, 128, 4, 4)]


def sweep(args: argparse.Namespace) -> None:
    rows = []
    shapes = decode_shapes(args.model) if args.model else SHAPES
    for layer, (n, k) in shapes.items():
        if args.layers and layer not in args.layers:
            continue
        for name in args.kernels:
            weights = ColdWeights(name, n, k)
            for m in args.batch:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                default = default_tiling(m, n, k, FORMATS[name], x.dtype, x.device)
                timed = {t: weights.us_per_call(x, t, args.calls, args.replays)
                         for t in dict.fromkeys(sweep_tilings(name, m) + [default])}
                ranked = sorted(timed, key=timed.get)
                rows += [dict(layer=layer, m=m, kernel=name, tiling=str(t), default=t == default, us=round(timed[t], 2))
                         for t in ranked]
                print(f"{layer:<13}{m:>4} {name:<5} best {timed[ranked[0]]:>7.1f} us {ranked[0]}  "
                      f"default {timed[default]:>7.1f}  worst {timed[ranked[-1]]:>7.1f}", flush=True)
            del weights
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "calls": args.calls, "sweep": rows}, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--calls", type=int, default=64, help="back-to-back calls in one graph")
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--out", default="quant_gemm.json")
    parser.add_argument("--sweep", action="store_true", help="time launch settings instead")
    parser.add_argument("--kernels", nargs="+", choices=SWEPT, default=QUANTIZED, help="swept kernels")
    parser.add_argument("--model", help="sweep this bundled config's attention and LM-head shapes instead")
    parser.add_argument("--layers", nargs="+", help="sweep only these layers (e.g. lm_head)")
    args = parser.parse_args()
    if args.sweep:
        return sweep(args)
    names = ("bf16",) + QUANTIZED + ("fp8_w8a8",)
    rows = []
    for layer, (n, k) in SHAPES.items():
        for name in names:
            weights = ColdWeights(name, n, k)
            for m in args.batch:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                us = weights.us_per_call(x, None, args.calls, args.replays)
                rows.append(dict(layer=layer, n=n, k=k, m=m, kernel=name, us=round(us, 2),
                                 weight_gb_per_s=round(weights.nbytes / us / 1e3, 1)))
            del weights
    print(f"{'layer':<13}{'M':>4} " + "".join(f"{name:>16}" for name in names) + "   (us / weight GB/s)")
    for layer in SHAPES:
        for m in args.batch:
            cells = {r["kernel"]: r for r in rows if r["layer"] == layer and r["m"] == m}
            print(f"{layer:<13}{m:>4} " + "".join(f"{cells[nm]['us']:>8.1f}/{cells[nm]['weight_gb_per_s']:>6.0f} "
                                                   for nm in names))
    for m in args.batch:
        step = {nm: LAYERS * sum(r["us"] for r in rows if r["kernel"] == nm and r["m"] == m) / 1e3 for nm in names}
        print(f"{'x' + str(LAYERS) + ' layers':<13}{m:>4} " + "".join(f"{step[nm]:>11.2f} ms  " for nm in names)
              + "  (linear layers per decode step)")
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "calls": args.calls, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
