"""Time ``fused_experts`` at the MoE shapes of Qwen3-30B-A3B, ERNIE-4.5-21B-A3B and Mixtral-8x7B on a
CUDA GPU, against the torch loop over experts (``fastllm``'s reference), and sweep the grouped GEMMs' tiles.

    python kernels/bench_fused_moe.py [--sweep] [--csv fused_moe.csv]

A row gives CUDA-graph replay medians (``do_bench_cudagraph``) of the whole layer, the weight
bytes the routed experts hold (each read once: the decode bound), the TFLOP/s of the routed
products, the torch loop's time (``do_bench``; it syncs, so no graph) and the relative error of
the bf16 kernel against the loop in float32 at that size. ``--sweep`` times each GEMM alone over
candidate tiles and prints the fastest per shape. ``--fp8``: the experts e4m3 with a scale per
output channel (absmax), the loop dequantizing them. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import csv
import itertools

import torch
import triton

from fastllm.layers.fused_moe import fused_experts_reference
from fastllm_kernels.fused_moe import (
    ONE_PAIR_BLOCKS_SHARE, MoeTiling, default_tilings, fused_experts, grouped_gemm, moe_align_block_size,
    one_pair_blocks,
)

MODELS = {  # hidden, moe intermediate, experts, top-k
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "ernie-4.5-21b-a3b": (2560, 1536, 64, 6),
    "mixtral-8x7b": (4096, 14336, 8, 2),
}
TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384]
SWEEP_TOKENS = [1, 16, 128, 256, 512, 4096]
DECODE_TILES = [MoeTiling(16, 16, 256, num_stages=4)] + [
    MoeTiling(m, n, k, num_stages=s) for m, n, k, s in itertools.product([16, 32], [32, 64], [128, 256], [3, 5])]
PREFILL_TILES = [MoeTiling(m, n, k, group_m=g, num_warps=w, num_stages=s)
                 for m, n, k, g, w, s in [(64, 64, 64, 4, 4, 4), (64, 128, 64, 8, 4, 3), (128, 64, 64, 8, 8, 3),
                                          (128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 4, 3), (64, 128, 128, 8, 4, 3),
                                          (128, 256, 64, 8, 8, 3), (32, 64, 128, 4, 4, 4)]]


def routed(tokens: int, experts: int, top_k: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(tokens, experts, device=device)
    weights, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids


def weights_bytes(ids: torch.Tensor, hidden: int, inner: int, elem: int) -> int:
    return ids.unique().numel() * 3 * hidden * inner * elem


def copy_bandwidth() -> float:
    """GB/s of a device-to-device copy of 1 GiB (read + write), the bound every ratio here uses."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    return 2 * src.numel() / ms / 1e6


def graph_time(fn) -> float:
    """Median ms of CUDA-graph replays, or of plain launches where the capture fails."""
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    except RuntimeError as error:
        print(f"no graph ({error}); timing launches", flush=True)
        return triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")


def expert_weights(name: str, dtype: torch.dtype, fp8: bool) -> dict:
    """``w13``/``w2`` (and their scales, e4m3 ones) of one MoE layer of ``name``."""
    hidden, inner, experts, _ = MODELS[name]
    weights = {"w13": torch.randn(experts, 2 * inner, hidden, device="cuda", dtype=dtype) / hidden ** 0.5,
               "w2": torch.randn(experts, hidden, inner, device="cuda", dtype=dtype) / inner ** 0.5}
    if fp8:
        for key in ("w13", "w2"):
            scale = weights[key].float().abs().amax(-1) / torch.finfo(torch.float8_e4m3fn).max
            weights[key] = (weights[key].float() / scale[..., None]).to(torch.float8_e4m3fn)
            weights[f"{key}_scale"] = scale
    return weights


def bench_layer(name: str, dtype: torch.dtype, copy_gbs: float, token_counts: list[int], fp8: bool) -> list[dict]:
    hidden, inner, experts, top_k = MODELS[name]
    weights = expert_weights(name, dtype, fp8)
    scales = {key: value for key, value in weights.items() if key.endswith("_scale")}
    w13, w2 = weights["w13"], weights["w2"]
    rows = []
    for tokens in token_counts:
        x = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
        topk_weights, topk_ids = routed(tokens, experts, top_k, "cuda")
        out = fused_experts(x, w13, w2, topk_weights, topk_ids, **scales)
        err = float("nan")
        if tokens <= 4096:  # the float32 loop's memory
            ref = fused_experts_reference(x.float(), w13 if fp8 else w13.float(), w2 if fp8 else w2.float(),
                                          topk_weights, topk_ids, "silu", scales.get("w13_scale"),
                                          scales.get("w2_scale"))
            err = ((out.float() - ref).norm() / ref.norm()).item()
            del ref
        graph_ms = graph_time(lambda: fused_experts(x, w13, w2, topk_weights, topk_ids, **scales))
        loop_ms = triton.testing.do_bench(
            lambda: fused_experts_reference(x, w13, w2, topk_weights, topk_ids, "silu", scales.get("w13_scale"),
                                            scales.get("w2_scale")), warmup=5, rep=50, return_mode="median")
        nbytes = weights_bytes(topk_ids, hidden, inner, w13.element_size())
        flops = 2 * 3 * tokens * top_k * hidden * inner
        rows.append({"model": name, "experts": "fp8" if fp8 else str(dtype).split(".")[-1], "tokens": tokens,
                     "graph us": round(graph_ms * 1e3, 1),
                     "weight MB": round(nbytes / 1e6, 1), "GB/s": round(nbytes / graph_ms / 1e6),
                     "% copy bw": round(100 * nbytes / graph_ms / 1e6 / copy_gbs, 1),
                     "TFLOP/s": round(flops / graph_ms / 1e9, 1), "torch loop us": round(loop_ms * 1e3, 1),
                     "speedup": round(loop_ms / graph_ms, 2), "rel err": f"{err:.1e}"})
        print(rows[-1], flush=True)
    return rows


def fastest(run, default: MoeTiling, candidates: list[MoeTiling]) -> tuple[dict, MoeTiling]:
    """CUDA-graph medians (ms) of ``run(tiling)`` over the default and the candidates, and the best."""
    timings = {}
    for tiling in dict.fromkeys([default, *candidates]):
        try:
            timings[tiling] = triton.testing.do_bench_cudagraph(lambda: run(tiling), rep=50, return_mode="median")
        except Exception as error:  # tiles that do not fit shared memory
            print(f"skip {tiling}: {type(error).__name__}", flush=True)
    return timings, min(timings, key=timings.get)


def sweep(name: str, dtype: torch.dtype, fp8: bool, token_counts: list[int]) -> list[dict]:
    """Each GEMM alone over its candidate tiles; the default's time beside the best."""
    hidden, inner, experts, top_k = MODELS[name]
    weights = expert_weights(name, dtype, fp8)
    w13, w2 = weights["w13"], weights["w2"]
    s13, s2 = weights.get("w13_scale"), weights.get("w2_scale")
    rows = []
    for tokens in token_counts:
        x = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
        topk_weights, topk_ids = routed(tokens, experts, top_k, "cuda")
        act = x.new_empty(tokens * top_k, inner)
        per_pair = x.new_empty(tokens * top_k, hidden)
        defaults = default_tilings(tokens * top_k, experts, x.element_size(), w13.element_size())
        one_pair = tokens * top_k * ONE_PAIR_BLOCKS_SHARE <= experts

        def blocks_for(tiling):
            return one_pair_blocks(topk_ids) if one_pair else moe_align_block_size(topk_ids, tiling.block_m, experts)

        candidates = DECODE_TILES if tokens * top_k / experts <= 32 else PREFILL_TILES
        gemms = {"gate_up": (lambda t: grouped_gemm(x, w13, act, blocks_for(t), t, top_k, gated=True, w_scale=s13),
                             defaults[0]),
                 "down": (lambda t: grouped_gemm(act, w2, per_pair, blocks_for(t), t, 1, False, topk_weights.view(-1),
                                                 w_scale=s2), defaults[1])}
        for gemm, (run, default) in gemms.items():
            timings, best = fastest(run, default, candidates)
            rows.append({"model": name, "experts": "fp8" if fp8 else "bf16", "tokens": tokens, "gemm": gemm,
                         "default us": round(timings[default] * 1e3, 1), "best us": round(timings[best] * 1e3, 1),
                         "best": best})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--tokens", type=int, nargs="*", help=f"default {TOKENS}; sweep: {SWEEP_TOKENS}")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--fp8", action="store_true", help="e4m3 experts with per-channel scales")
    parser.add_argument("--csv")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    if args.sweep:
        rows = [row for name in args.models for row in sweep(name, dtype, args.fp8, args.tokens or SWEEP_TOKENS)]
    else:
        copy_gbs = copy_bandwidth()
        print(f"copy bandwidth {copy_gbs:.0f} GB/s on {torch.cuda.get_device_name()}", flush=True)
        rows = [row for name in args.models for row in bench_layer(name, dtype, copy_gbs, args.tokens or TOKENS,
                                                                    args.fp8)]
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
