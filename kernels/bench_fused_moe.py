"""Time ``fused_experts`` at the MoE shapes of Qwen3-30B-A3B, ERNIE-4.5-21B-A3B and Mixtral-8x7B on a
CUDA GPU, against the torch loop over experts (``fastllm``'s reference), and sweep the grouped GEMMs' tiles.

    python kernels/bench_fused_moe.py [--sweep] [--csv fused_moe.csv]

A row gives CUDA-graph replay medians (``do_bench_cudagraph``) of the whole layer, the weight
bytes the routed experts hold (each read once: the decode bound), the TFLOP/s of the routed
products, the torch loop's time (``do_bench``; it syncs, so no graph) and the relative error of
the bf16 kernel against the loop in float32 at that size. ``--sweep`` times each GEMM alone over
candidate tiles and prints the fastest per shape. ``--experts fp8|int4|nf4``: the experts
quantized by the quant plugin, the loop dequantizing them.

``--cold`` times the one-pair-a-block (decode) GEMMs as a model runs them: each graph replay walks
``--layers`` layers, each with its own random top-k experts from one of ``--weight-sets`` distinct
sets of every expert's weights (many times L2's size), so no layer finds its experts in L2; the
``--sweep`` above repeats one set and one routing, so it times L2-hot GEMMs. Per variant of the
decode tiles (``COLD_VARIANTS``): gate/up alone, down (its rows unsummed, as in a model) alone and the whole
layer (``fused_experts``), in us a layer and GB/s of the routed experts' bytes, and the layer's
error against the float32 torch loop; one ``L2-hot`` row repeats the default on one layer.
``--experts`` takes several formats here (``model fp8``). Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import csv
import itertools
from dataclasses import dataclass, replace

import torch
import triton

from fastllm.layers.fused_moe import FusedMoE, TopKRouter, fused_experts_reference
from fastllm_kernels.quant import NF4_CODES
from fastllm_quant.experts import quantize_four_bit_experts
from fastllm_quant.fp8 import quantize_fp8_experts
from fastllm_quant.int4 import DEFAULT_GROUP_SIZE, quantize_int4
from fastllm_quant.nf4 import DEFAULT_BLOCK_SIZE, quantize_nf4
from fastllm_kernels.fused_moe import MoeTiling, default_tilings, fused_experts, gemv_format, grouped_gemm
from fastllm_kernels.quant.weight_gemm import Tiling, expert_gemv
from fastllm_kernels.moe_align import moe_align_block_size, one_pair_a_block, one_pair_blocks

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
                                          (128, 256, 64, 8, 8, 3), (32, 64, 128, 4, 4, 4), (128, 128, 64, 8, 8, 4),
                                          (128, 64, 64, 8, 8, 4), (64, 64, 64, 8, 4, 3), (128, 128, 32, 8, 8, 4),
                                          (64, 256, 64, 8, 8, 3), (64, 128, 64, 8, 4, 4)]]
INTERLEAVED_TILES = [MoeTiling(m, n, k, group_m=g, num_warps=w, num_stages=s, interleave=True)
                     for m, n, k, g, w, s in [(128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (128, 64, 64, 8, 8, 3),
                                              (128, 64, 64, 8, 8, 4), (64, 128, 64, 8, 4, 3), (64, 64, 64, 8, 4, 4),
                                              (64, 64, 64, 4, 4, 4)]]
"""Gated GEMM only: gate and up rows in one operand."""
MID_TILES = [MoeTiling(m, n, k, group_m=g, num_warps=w, num_stages=s)
             for m, n, k, g, w, s in [(64, 64, 64, 1, 4, 4), (64, 64, 128, 8, 4, 3), (64, 64, 128, 8, 4, 4),
                                      (64, 32, 64, 8, 4, 4), (64, 32, 128, 8, 4, 3), (32, 64, 128, 8, 4, 3),
                                      (32, 64, 128, 8, 4, 4), (32, 128, 64, 8, 4, 4), (64, 64, 64, 8, 8, 4),
                                      (32, 64, 64, 8, 4, 4), (64, 128, 64, 8, 8, 4), (32, 32, 128, 8, 4, 4)]]
"""A few dozen pairs an expert (decode batches of hundreds): weight streams over thin row blocks."""


def routed(tokens: int, experts: int, top_k: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(tokens, experts, device=device)
    weights, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids


def copy_bandwidth() -> float:
    """GB/s of a device-to-device copy of 1 GiB (read + write), the bound every ratio here uses."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    return 2 * src.numel() / ms / 1e6


def graph_time(fn, rep: int = 100) -> float:
    """Median ms of CUDA-graph replays (about ``rep`` ms of them), or of plain launches where the capture fails."""
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")
    except RuntimeError as error:
        print(f"no graph ({error}); timing launches", flush=True)
        return triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")


def rel_err(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out.float() - reference).norm() / reference.norm()).item()


def expert_weights(name: str, dtype: torch.dtype, experts_format: str) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(``w13``, ``w2``, their format's keyword arguments) of one MoE layer of ``name``: ``dtype``
    (``model``), or quantized as the quant plugin quantizes experts (``fp8``, ``int4``, ``nf4``)."""
    hidden, inner, experts, _ = MODELS[name]
    moe = FusedMoE(TopKRouter(hidden, experts, 1), inner).cuda()
    moe.w13.data = torch.randn(experts, 2 * inner, hidden, device="cuda", dtype=dtype) / hidden ** 0.5
    moe.w2.data = torch.randn(experts, hidden, inner, device="cuda", dtype=dtype) / inner ** 0.5
    if experts_format == "fp8":
        quantize_fp8_experts(moe)
    elif experts_format == "int4":
        quantize_four_bit_experts(moe, quantize_int4, DEFAULT_GROUP_SIZE)
    elif experts_format == "nf4":
        quantize_four_bit_experts(moe, quantize_nf4, DEFAULT_BLOCK_SIZE, NF4_CODES)
    formats = {key: getattr(moe, key) for key in ("w13_scale", "w2_scale", "w13_zero", "w2_zero", "book")}
    return moe.w13.data, moe.w2.data, {key: value for key, value in formats.items() if value is not None}


def bench_layer(name: str, dtype: torch.dtype, copy_gbs: float, token_counts: list[int],
                experts_format: str) -> list[dict]:
    hidden, inner, experts, top_k = MODELS[name]
    w13, w2, formats = expert_weights(name, dtype, experts_format)
    plain = not formats

    def reference(x):
        return fused_experts_reference(x, w13.to(x.dtype) if plain else w13, w2.to(x.dtype) if plain else w2,
                                       topk_weights, topk_ids, "silu", **formats)

    rows = []
    for tokens in token_counts:
        x = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
        topk_weights, topk_ids = routed(tokens, experts, top_k, "cuda")
        out = fused_experts(x, w13, w2, topk_weights, topk_ids, **formats)
        err = float("nan")
        if tokens <= 4096:  # the float32 loop's memory
            ref = reference(x.float())
            err = rel_err(out, ref)
            del ref
        graph_ms = graph_time(lambda: fused_experts(x, w13, w2, topk_weights, topk_ids, **formats))
        loop_ms = triton.testing.do_bench(lambda: reference(x), warmup=5, rep=50, return_mode="median")
        nbytes = topk_ids.unique().numel() * (w13.nbytes + w2.nbytes) // experts
        flops = 2 * 3 * tokens * top_k * hidden * inner
        rows.append({"model": name, "experts": str(dtype).split(".")[-1] if plain else experts_format,
                     "tokens": tokens, "graph us": round(graph_ms * 1e3, 1),
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


def sweep(name: str, dtype: torch.dtype, experts_format: str, token_counts: list[int]) -> list[dict]:
    """Each GEMM alone over its candidate tiles; the default's time beside the best."""
    hidden, inner, experts, top_k = MODELS[name]
    w13, w2, formats = expert_weights(name, dtype, experts_format)
    gate_up_format, down_format = split_formats(formats)
    rows = []
    for tokens in token_counts:
        x = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
        topk_weights, topk_ids = routed(tokens, experts, top_k, "cuda")
        act = x.new_empty(tokens * top_k, inner)
        one_pair = one_pair_a_block(tokens * top_k, experts)
        defaults = default_tilings(tokens * top_k, experts, x.element_size(), w13.element_size())
        sum_pairs = top_k if one_pair else 1  # one pair a block: the down GEMM sums a token's pairs
        down_out = x.new_empty(tokens * top_k // sum_pairs, hidden)

        def blocks_for(tiling):
            return one_pair_blocks(topk_ids) if one_pair else moe_align_block_size(topk_ids, tiling.block_m, experts)

        per_expert = tokens * top_k / experts
        if per_expert <= 32:
            candidates = DECODE_TILES
        else:
            candidates = PREFILL_TILES + (MID_TILES if per_expert <= 128 else [])
        gemms = {"gate_up": (lambda t: grouped_gemm(x, w13, act, blocks_for(t), t, top_k, gated=True,
                                                    **gate_up_format), defaults[0]),
                 "down": (lambda t: grouped_gemm(act, w2, down_out, blocks_for(t), t, 1, False, topk_weights.view(-1),
                                                 sum_pairs=sum_pairs, **down_format),
                          defaults[1])}
        for gemm, (run, default) in gemms.items():
            timings, best = fastest(run, default, candidates + (INTERLEAVED_TILES if gemm == "gate_up" else []))
            rows.append({"model": name, "experts": experts_format, "tokens": tokens,
                         "gemm": gemm, "default us": round(timings[default] * 1e3, 1),
                         "best us": round(timings[best] * 1e3, 1), "best": best})
            print(rows[-1], flush=True)
    return rows


COLD_VARIANTS = {  # name: changes to the (gate/up, down) decode tiles of default_tilings
    "default": ({}, {}),
    "4 stages": ({"num_stages": 4}, {"num_stages": 4}),
    "gate/up 5 stages": ({"num_stages": 5}, {}),
    "gate/up 16 columns": ({"block_n": 16}, {}),
    "gate/up K/2, 8 stages": ({"k_scale": 0.5, "num_stages": 8}, {}),
    "gate/up 8 warps": ({"num_warps": 8}, {}),
    "down K/2, 6 stages": ({}, {"k_scale": 0.5, "num_stages": 6}),
    "down 128 columns": ({}, {"block_n": 128}),
    "down 32 columns": ({}, {"block_n": 32}),
    "down 8 warps": ({}, {"num_warps": 8}),
    "down 128 columns, 8 warps": ({}, {"block_n": 128, "num_warps": 8}),
    "down 2K": ({}, {"k_scale": 2}),
    "gate/up 64 columns": ({"block_n": 64}, {}),
}
"""Each names tile fields to change (``k_scale`` multiplies block_k). Down programs summing several
of a token's pairs and L2 prefetches of the down weights lost to every default here on the H100
(benchmarks/RESULTS.md) and were taken out of the kernel."""


GEMV_VARIANTS = {  # name: the one-row GEMV's tile over the pairs (``expert_gemv``), None: its default
    "gemv": None,
    "gemv, summed": None,
    "gemv 8 rows 1 warp": Tiling(8, 512, num_warps=1, num_stages=1),
    "gemv 8 rows 2 warps": Tiling(8, 1024, num_warps=2, num_stages=1),
    "gemv 16 rows 2 warps": Tiling(16, 512, num_warps=2, num_stages=1),
    "gemv 4 rows ahead": Tiling(4, 512, num_warps=1, num_stages=2),
    "gemv 4 rows 1024": Tiling(4, 1024, num_warps=1, num_stages=1),
    "gemv 4 rows 1024 ahead": Tiling(4, 1024, num_warps=1, num_stages=2),
    "gemv 4 rows 1024 2 warps": Tiling(4, 1024, num_warps=2, num_stages=1),
    "gemv 16 rows 2 warps 1024": Tiling(16, 1024, num_warps=2, num_stages=1),
    "gemv 16 rows 2 warps ahead": Tiling(16, 512, num_warps=2, num_stages=2),
    "gemv 8 rows 2 warps 512": Tiling(8, 512, num_warps=2, num_stages=1),
    "gemv 16 rows 4 warps": Tiling(16, 512, num_warps=4, num_stages=1),
    "gemv 32 rows 4 warps": Tiling(32, 512, num_warps=4, num_stages=1),
    "gemv 32 rows 4 warps 1024": Tiling(32, 1024, num_warps=4, num_stages=1),
    "gemv 2 rows 1 warp": Tiling(2, 512, num_warps=1, num_stages=1),
    "gemv 4 rows 256": Tiling(4, 256, num_warps=1, num_stages=1),
}
"""Both GEMMs as the one-row GEMV over the pairs (the default tile: 4 rows, 1 warp, ``EXPERT_TILING``);
``summed``: the down launch adds each token's k rows."""


def adjusted(tiling: MoeTiling, changes: dict) -> MoeTiling:
    changes = dict(changes)
    if "k_scale" in changes:
        changes["block_k"] = int(tiling.block_k * changes.pop("k_scale"))
    return replace(tiling, **changes)


def split_formats(formats: dict) -> tuple[dict, dict]:
    """``grouped_gemm``'s format keywords of gate/up and of down from ``fused_experts``' ones."""
    return ({key.replace("w13_", "w_"): value for key, value in formats.items() if "w2_" not in key},
            {key.replace("w2_", "w_"): value for key, value in formats.items() if "w13_" not in key})


def routed_bytes(ids: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None) -> int:
    """Bytes of the experts ``ids`` picks (each once) in ``w`` and its per-channel ``scale``."""
    per_expert = w[0].numel() * w.element_size() + (0 if scale is None else scale[0].numel() * scale.element_size())
    return ids.unique().numel() * per_expert


@dataclass
class ColdLayers:
    """One (model, experts format, tokens) of ``--cold``: ``sets`` distinct expert sets and a
    routing a layer, the inputs, and the float32 loop's output on layer 0."""

    name: str
    experts: str
    tokens: int
    top_k: int
    stacks: list[tuple[torch.Tensor, torch.Tensor, dict]]
    routes: list[tuple[torch.Tensor, torch.Tensor]]
    x: torch.Tensor
    act: torch.Tensor
    defaults: tuple[MoeTiling, MoeTiling]
    gate_up_bytes: float
    down_bytes: float
    reference: torch.Tensor


def cold_layers(name: str, dtype: torch.dtype, experts_format: str, tokens: int, sets: int,
                layers: int) -> ColdLayers:
    hidden, inner, experts, top_k = MODELS[name]
    stacks = [expert_weights(name, dtype, experts_format) for _ in range(sets)]
    routes = [routed(tokens, experts, top_k, "cuda") for _ in range(layers)]
    w13, w2, formats = stacks[0]
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
    plain = not formats
    reference = fused_experts_reference(x.float(), w13.float() if plain else w13, w2.float() if plain else w2,
                                        *routes[0], "silu", **formats)
    return ColdLayers(
        name, str(dtype).split(".")[-1] if plain else experts_format, tokens, top_k, stacks, routes, x,
        torch.randn(tokens * top_k, inner, device="cuda", dtype=dtype) / inner ** 0.5,
        default_tilings(tokens * top_k, experts, x.element_size(), w13.element_size()),
        sum(routed_bytes(ids, stacks[i % sets][0], stacks[i % sets][2].get("w13_scale"))
            for i, (_, ids) in enumerate(routes)) / layers,
        sum(routed_bytes(ids, stacks[i % sets][1], stacks[i % sets][2].get("w2_scale"))
            for i, (_, ids) in enumerate(routes)) / layers,
        reference)


def cold_row(layers: ColdLayers, variant: str, copy_gbs: float) -> dict | None:
    """Time ``variant`` (or ``L2-hot``: the default tiles on layer 0 every time) on ``layers``."""
    gate_up, down = (adjusted(tile, changes)
                     for tile, changes in zip(layers.defaults, COLD_VARIANTS.get(variant, ({}, {}))))
    count = len(layers.routes)
    layer_of = (lambda i: 0) if variant == "L2-hot" else (lambda i: i)
    down_out = layers.x.new_empty((layers.act.shape[0], layers.x.shape[1]), dtype=torch.float32)

    def run_gate_up(i):
        w13, _, formats = layers.stacks[layer_of(i) % len(layers.stacks)]
        grouped_gemm(layers.x, w13, layers.act, one_pair_blocks(layers.routes[layer_of(i)][1]), gate_up,
                     layers.top_k, gated=True, **split_formats(formats)[0])

    def run_down(i):
        _, w2, formats = layers.stacks[layer_of(i) % len(layers.stacks)]
        topk_weights, topk_ids = layers.routes[layer_of(i)]
        grouped_gemm(layers.act, w2, down_out, one_pair_blocks(topk_ids), down, 1, False, topk_weights.view(-1),
                     **split_formats(formats)[1])

    def run_layer(i):  # the expert rows left unsummed, as a model whose next norm adds them runs it
        w13, w2, formats = layers.stacks[layer_of(i) % len(layers.stacks)]
        return fused_experts(layers.x, w13, w2, *layers.routes[layer_of(i)], tilings=(gate_up, down),
                             pair_rows=True, **formats)

    if variant in GEMV_VARIANTS:
        run_gate_up, run_down, run_layer = gemv_runs(layers, GEMV_VARIANTS[variant], variant.endswith("summed"))

    try:
        out = run_layer(0).sum(1)
        us = {part: graph_time(lambda: [run(i) for i in range(count)], rep=10) * 1e3 / count
              for part, run in (("gate/up", run_gate_up), ("down", run_down), ("layer", run_layer))}
    except Exception as error:  # tiles that do not fit shared memory or registers
        print(f"skip {variant} {gate_up} {down}: {type(error).__name__}: {error}", flush=True)
        return None
    both = layers.gate_up_bytes + layers.down_bytes
    return {"model": layers.name, "experts": layers.experts,
            "tokens": layers.tokens, "variant": variant, "gate/up us": round(us["gate/up"], 2),
            "gate/up GB/s": round(layers.gate_up_bytes / us["gate/up"] / 1e3), "down us": round(us["down"], 2),
            "down GB/s": round(layers.down_bytes / us["down"] / 1e3), "layer us": round(us["layer"], 2),
            "layer GB/s": round(both / us["layer"] / 1e3),
            "% copy bw": round(100 * both / us["layer"] / 1e3 / copy_gbs, 1),
            "rel err": f"{rel_err(out, layers.reference):.1e}", "gate/up tile": gate_up, "down tile": down}


def gemv_runs(layers: ColdLayers, tiling: Tiling | None, summed: bool):
    """(gate/up, down, layer) of the cold bench through ``expert_gemv``; the layer returns ``[T, k, H]``."""
    hidden, inner = layers.x.shape[1], layers.act.shape[1]

    def product(i, w, prefix, x, k, **kwargs):
        formats = layers.stacks[i % len(layers.stacks)][2]
        scale, zero = formats.get(prefix + "_scale"), formats.get(prefix + "_zero")
        return expert_gemv(x, w, scale, zero, formats.get("book"), gemv_format(w, scale, zero, k, layers.x.dtype),
                           tiling=tiling, **kwargs)

    def run_gate_up(i):
        return product(i, layers.stacks[i % len(layers.stacks)][0], "w13", layers.x, hidden,
                       ids=layers.routes[i][1].view(-1), rows_per_x=layers.top_k, gated=True)

    def run_down(i, x=None):
        weights, ids = (route.view(-1) for route in layers.routes[i])
        out = product(i, layers.stacks[i % len(layers.stacks)][1], "w2", layers.act if x is None else x, inner,
                      ids=ids, route_weights=weights, sum_pairs=layers.top_k if summed else 1, ids_ready=True,
                      out_dtype=layers.x.dtype if summed else torch.float32)
        return out[:, None] if summed else out.view(layers.tokens, layers.top_k, -1)

    def run_layer(i):
        return run_down(i, run_gate_up(i))

    return run_gate_up, run_down, run_layer


def cold_sweep(names: list[str], dtype: torch.dtype, experts_formats: list[str], token_counts: list[int],
               sets: int, layers: int, variants: list[str], copy_gbs: float,
               csv_path: str | None) -> None:
    """Every variant on every (model, format, tokens) before the next variant: a call cut short
    keeps the first variants of all of them. The CSV is rewritten after each row."""
    contexts = []
    for name, experts_format, tokens in itertools.product(names, experts_formats, token_counts):
        _, _, experts, top_k = MODELS[name]
        if one_pair_a_block(tokens * top_k, experts):
            contexts.append(cold_layers(name, dtype, experts_format, tokens, sets, layers))
        else:
            print(f"{name}: {tokens} tokens are not one pair a block; skipped", flush=True)
    rows = []
    for variant, context in itertools.product(["L2-hot", *variants], contexts):
        row = cold_row(context, variant, copy_gbs)
        if row is not None:
            rows.append(row)
            print({key: value for key, value in row.items() if "tile" not in key}, flush=True)
            write_csv(rows, csv_path)


def write_csv(rows: list[dict], path: str | None) -> None:
    if path and rows:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--tokens", type=int, nargs="*", help=f"default {TOKENS}; sweep: {SWEEP_TOKENS}")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--experts", choices=["model", "fp8", "int4", "nf4"], nargs="+", default=["model"],
                        help="the experts in --dtype, or quantized as the quant plugin does (several: --cold only)")
    parser.add_argument("--cold", action="store_true", help="decode GEMMs over distinct layers (module doc)")
    parser.add_argument("--weight-sets", type=int, default=8, help="--cold: distinct expert sets")
    parser.add_argument("--layers", type=int, default=16, help="--cold: layers a graph replay")
    parser.add_argument("--variants", nargs="*", default=list(COLD_VARIANTS),
                        help="--cold: of COLD_VARIANTS and GEMV_VARIANTS")
    parser.add_argument("--csv")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    if not args.cold and len(args.experts) > 1:
        parser.error("several --experts formats only with --cold")
    if args.sweep:
        rows = [row for name in args.models for row in sweep(name, dtype, args.experts[0],
                                                              args.tokens or SWEEP_TOKENS)]
    else:
        copy_gbs = copy_bandwidth()
        print(f"copy bandwidth {copy_gbs:.0f} GB/s on {torch.cuda.get_device_name()}", flush=True)
        if args.cold:
            cold_sweep(args.models, dtype, args.experts, args.tokens or [1], args.weight_sets, args.layers,
                       args.variants, copy_gbs, args.csv)
            return
        rows = [row for name in args.models for row in bench_layer(name, dtype, copy_gbs, args.tokens or TOKENS,
                                                                    args.experts[0])]
    write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
