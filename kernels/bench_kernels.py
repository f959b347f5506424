"""Time every kernel at Llama-3-8B shapes on a CUDA GPU and print achieved bandwidth.

    python kernels/bench_kernels.py [--dtype bfloat16] [--csv bench_kernels.csv]

Each row gives the median of ``triton.testing.do_bench`` (which flushes L2 between runs but
includes the Python launch cost, which dominates the smallest kernels), the median of
CUDA-graph replays (``do_bench_cudagraph``: no launch cost, as the engine's decode graphs
run them, but L2 stays warm), the fewest bytes the kernel must move (each input read once,
each output written once) and the GB/s each time implies; attention rows also give TFLOP/s
(from the graph time). Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools
from typing import Callable

import torch
import triton

from fastllm_kernels.decode_attention import DecodeTiling, default_decode_tiling
from fastllm_kernels.extend_attention import ExtendTiling, default_extend_tiling
from fastllm_kernels import (fused_add_rms_norm, paged_decode_attention, paged_extend_attention,
                             rms_norm, rotary_embedding, sample_top_k_top_p, silu_and_mul,
                             write_kv_cache)

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
HIDDEN, INTERMEDIATE, VOCAB = 4096, 14336, 128256
BLOCK_SIZE = 64


def timed(name: str, shape: str, fn: Callable[[], object], bytes_moved: float,
          flops: float = 0.0) -> dict:
    ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    graph_ms = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    return {"kernel": name, "shape": shape, "us": round(ms * 1e3, 1),
            "graph us": round(graph_ms * 1e3, 1), "MB": round(bytes_moved / 1e6, 2),
            "GB/s": round(bytes_moved / ms / 1e6), "graph GB/s": round(bytes_moved / graph_ms / 1e6),
            "TFLOP/s": round(flops / graph_ms / 1e9, 1) if flops else ""}


def paged_cache(seq_lens: list[int], dtype: torch.dtype, kv_heads: int = KV_HEADS) -> tuple[torch.Tensor, ...]:
    """Caches just big enough for the batch, blocks handed out in shuffled order."""
    per_seq = [triton.cdiv(n, BLOCK_SIZE) for n in seq_lens]
    num_blocks = sum(per_seq)
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, HEAD_DIM, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    ids = torch.randperm(num_blocks, device="cuda", dtype=torch.int32)
    tables = torch.zeros(len(seq_lens), max(per_seq), dtype=torch.int32, device="cuda")
    start = 0
    for row, n in enumerate(per_seq):
        tables[row, :n] = ids[start:start + n]
        start += n
    lens = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    return k_cache, v_cache, tables, lens


def bench_decode(dtype: torch.dtype, elem: int) -> list[dict]:
    rows = []
    for batch, context in [(1, 32768), (8, 8192), (64, 2048), (256, 1024)]:
        k_cache, v_cache, tables, lens = paged_cache([context] * batch, dtype)
        q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=dtype)
        kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * elem
        rows.append(timed("paged_decode_attention", f"B={batch} ctx={context}",
                          lambda: paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.088),
                          kv_bytes + 2 * q.numel() * elem, 4 * batch * context * HEADS * HEAD_DIM))
    return rows


def bench_extend(dtype: torch.dtype, elem: int) -> list[dict]:
    rows = []
    for label, prefix, q_len, seqs in [("prefill", 0, 8192, 1), ("prefill", 0, 1024, 8),
                                       ("extend", 3072, 1024, 4), ("verify", 2048, 4, 64)]:
        k_cache, v_cache, tables, lens = paged_cache([prefix + q_len] * seqs, dtype)
        starts = torch.arange(seqs + 1, device="cuda", dtype=torch.int32) * q_len
        q = torch.randn(seqs * q_len, HEADS, HEAD_DIM, device="cuda", dtype=dtype)
        visible = seqs * (q_len * prefix + q_len * (q_len + 1) / 2)
        kv_bytes = 2 * seqs * (prefix + q_len) * KV_HEADS * HEAD_DIM * elem
        rows.append(timed("paged_extend_attention", f"{label} {seqs}x{q_len} prefix={prefix}",
                          lambda: paged_extend_attention(q, k_cache, v_cache, tables, starts, lens,
                                                         q_len, 0.088),
                          kv_bytes + 2 * q.numel() * elem, 4 * visible * HEADS * HEAD_DIM))
    return rows


def sweep_decode(dtype: torch.dtype) -> list[dict]:
    """``paged_decode_attention`` over its tile choices: offline decode batches of ERNIE-4.5-21B-A3B
    (370 sequences of ~1150 tokens, 20 / 4 heads) and Llama-3-8B (256 of 1024, 32 / 8), batch 1
    (split context); the default's time beside each."""
    rows = []
    for batch, context, heads, kv_heads in [(370, 1152, 20, 4), (256, 1024, HEADS, KV_HEADS), (1, 1024, 20, 4)]:
        k_cache, v_cache, tables, lens = paged_cache([context] * batch, dtype, kv_heads)
        q = torch.randn(batch, heads, HEAD_DIM, device="cuda", dtype=dtype)
        kv_bytes = 2 * batch * context * kv_heads * HEAD_DIM * q.element_size()
        default = default_decode_tiling(HEAD_DIM)
        for tiling in dict.fromkeys([default] + [DecodeTiling(n, w, s) for n, w, s in itertools.product(
                [32, 64, 128], [2, 4, 8], [2, 3, 4])]):
            run = functools.partial(paged_decode_attention, q, k_cache, v_cache, tables, lens, 0.088, tiling=tiling)
            try:
                us = triton.testing.do_bench_cudagraph(run, rep=50, return_mode="median") * 1e3
            except Exception as error:  # tiles that do not fit shared memory
                print(f"skip {tiling}: {type(error).__name__}", flush=True)
                continue
            rows.append({"shape": f"B={batch} ctx={context} {heads}/{kv_heads}", "tiling": str(tiling),
                         "default": tiling == default, "us": round(us, 1), "GB/s": round(kv_bytes / us / 1e3)})
            print(rows[-1], flush=True)
    return rows


def sweep_extend(dtype: torch.dtype) -> list[dict]:
    """``paged_extend_attention`` over its tile choices, on prefill chunks of 8 x 1024 tokens at
    the (query heads, kv heads) of Llama-3-8B and ERNIE-4.5-21B-A3B (head_dim 128): the default's
    time beside each."""
    rows = []
    for heads, kv_heads in [(20, 4), (HEADS, KV_HEADS)]:
        seqs, q_len = 8, 1024
        per_seq = triton.cdiv(q_len, BLOCK_SIZE)
        k_cache = torch.randn(seqs * per_seq, BLOCK_SIZE, kv_heads, HEAD_DIM, device="cuda", dtype=dtype)
        v_cache = torch.randn_like(k_cache)
        tables = torch.randperm(seqs * per_seq, device="cuda", dtype=torch.int32).view(seqs, per_seq)
        lens = torch.tensor([q_len] * seqs, dtype=torch.int32, device="cuda")
        starts = torch.arange(seqs + 1, device="cuda", dtype=torch.int32) * q_len
        q = torch.randn(seqs * q_len, heads, HEAD_DIM, device="cuda", dtype=dtype)
        flops = 4 * seqs * q_len * (q_len + 1) / 2 * heads * HEAD_DIM
        default = default_extend_tiling(HEAD_DIM, heads // kv_heads, q_len, q.element_size())
        for tiling in dict.fromkeys([default] + [ExtendTiling(m, n, w, s) for m, n, w, s in itertools.product(
                [64, 128], [32, 64, 128], [4, 8], [2, 3, 4])]):
            run = functools.partial(paged_extend_attention, q, k_cache, v_cache, tables, starts, lens, q_len, 0.088,
                                    tiling=tiling)
            try:
                us = triton.testing.do_bench_cudagraph(run, rep=50, return_mode="median") * 1e3
            except Exception as error:  # tiles that do not fit shared memory
                print(f"skip {tiling}: {type(error).__name__}", flush=True)
                continue
            rows.append({"heads": f"{heads}/{kv_heads}", "tiling": str(tiling), "default": tiling == default,
                         "us": round(us, 1), "TFLOP/s": round(flops / us / 1e6, 1)})
            print(rows[-1], flush=True)
    return rows


def bench_elementwise(dtype: torch.dtype, elem: int) -> list[dict]:
    rows = []
    for tokens in [256, 8192]:
        key = torch.randn(tokens, KV_HEADS, HEAD_DIM, device="cuda", dtype=dtype)
        value = torch.randn_like(key)
        k_cache, v_cache, _, _ = paged_cache([tokens], dtype)
        slots = torch.randperm(k_cache.shape[0] * BLOCK_SIZE, device="cuda")[:tokens]
        rows.append(timed("write_kv_cache", f"T={tokens}",
                          lambda: write_kv_cache(key, value, k_cache, v_cache, slots),
                          4 * key.numel() * elem))

        x, residual = (torch.randn(tokens, HIDDEN, device="cuda", dtype=dtype) for _ in range(2))
        weight = torch.randn(HIDDEN, device="cuda", dtype=dtype)
        rows.append(timed("rms_norm", f"T={tokens}", lambda: rms_norm(x, weight, 1e-5),
                          2 * x.numel() * elem))
        rows.append(timed("fused_add_rms_norm", f"T={tokens}",
                          lambda: fused_add_rms_norm(x, residual, weight, 1e-5), 4 * x.numel() * elem))

        positions = torch.randint(0, 8192, (tokens,), device="cuda")
        cache = torch.randn(8192, HEAD_DIM, device="cuda")
        query = torch.randn(tokens, HEADS * HEAD_DIM, device="cuda", dtype=dtype)
        key_flat = torch.randn(tokens, KV_HEADS * HEAD_DIM, device="cuda", dtype=dtype)
        rows.append(timed("rotary_embedding", f"T={tokens}",
                          lambda: rotary_embedding(positions, query, key_flat, cache, HEAD_DIM),
                          2 * (query.numel() + key_flat.numel()) * elem + tokens * HEAD_DIM * 4))

        gate_up = torch.randn(tokens, 2 * INTERMEDIATE, device="cuda", dtype=dtype)
        rows.append(timed("silu_and_mul", f"T={tokens}", lambda: silu_and_mul(gate_up),
                          1.5 * gate_up.numel() * elem))
    return rows


def bench_sampling() -> list[dict]:
    rows = []
    for batch in [1, 64, 256]:
        logits = 4 * torch.randn(batch, VOCAB, device="cuda")
        for label, temperature, top_k, top_p in [("greedy", 0.0, 0, 1.0), ("T=0.8", 0.8, 0, 1.0),
                                                 ("T=0.8 k=50 p=0.9", 0.8, 50, 0.9),
                                                 ("T=0.8 p=0.95", 0.8, 0, 0.95)]:
            args = (torch.full((batch,), temperature, device="cuda"),
                    torch.full((batch,), top_k, dtype=torch.int32, device="cuda"),
                    torch.full((batch,), top_p, device="cuda"),
                    torch.arange(batch, device="cuda"),
                    torch.zeros(batch, dtype=torch.int64, device="cuda"))
            rows.append(timed("sample_top_k_top_p", f"B={batch} {label}",
                              lambda: sample_top_k_top_p(logits, *args), logits.numel() * 4))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--csv", default="bench_kernels.csv", help="where the table is also written")
    parser.add_argument("--only-attention", action="store_true", help="decode and extend attention only")
    parser.add_argument("--sweep-extend", action="store_true", help="extend attention's tiles alone")
    parser.add_argument("--sweep-decode", action="store_true", help="decode attention's tiles alone")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_kernels.py needs a CUDA GPU")
    dtype = getattr(torch, args.dtype)
    elem = torch.finfo(dtype).bits // 8
    torch.manual_seed(0)
    if args.sweep_extend or args.sweep_decode:
        rows = sweep_extend(dtype) if args.sweep_extend else sweep_decode(dtype)
    else:
        rows = bench_decode(dtype, elem) + bench_extend(dtype, elem)
    if not args.only_attention and not args.sweep_extend and not args.sweep_decode:
        rows += bench_elementwise(dtype, elem) + bench_sampling()
    columns = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print(torch.cuda.get_device_name(), args.dtype, f"triton {triton.__version__}")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(columns, widths)))
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
