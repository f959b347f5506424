"""``fastllm bench latency``: end-to-end latency, TTFT and per-sequence decode speed of fixed batches.

On CUDA it also prints batch-1 decode against the memory-bandwidth roofline: each decode step
streams every weight once, so ``copy bandwidth / weight bytes`` bounds batch-1 tokens/s.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from fastllm.bench.datasets import random_requests
from fastllm.bench.device_rates import copy_bandwidth
from fastllm.bench.model_size import local_model, weight_bytes
from fastllm.bench.stats import distribution
from fastllm.bench.table import print_columns
from fastllm.bench.timed_run import run_timed
from fastllm.engine.llm_engine import select_platform
from fastllm.entrypoints.cli.engine_args import add_engine_args, engine_config_from_args
from fastllm.llm import LLM

HEADERS = ("batch", "latency mean (ms)", "median (ms)", "p99 (ms)", "TTFT mean (ms)", "decode tok/s/seq",
           "output tok/s")


def measure_batch(llm: LLM, args: argparse.Namespace, batch_size: int) -> dict[str, Any]:
    """``num_iters`` timed runs of one batch (after ``num_iters_warmup`` untimed ones), fresh prompts each."""
    latencies, ttfts, decode_rates = [], [], []
    for i in range(args.num_iters_warmup + args.num_iters):
        requests = random_requests(batch_size, args.input_len, args.output_len, llm.engine.hf_config.vocab_size,
                                   seed=args.seed + i)
        start = time.perf_counter()
        results = run_timed(llm.engine, requests)
        elapsed = time.perf_counter() - start
        failed = [r.error for r in results if not r.ok]
        if failed:
            raise SystemExit(f"{len(failed)} of {batch_size} requests failed: {failed[0]}")
        if i < args.num_iters_warmup:
            continue
        latencies.append(elapsed)
        ttfts += [r.ttft * 1000 for r in results]
        decode_rates += [1 / r.tpot for r in results]
    latency = distribution(latencies)
    return {"batch_size": batch_size, "latencies_s": latencies,
            **{f"latency_{k}_s": v for k, v in latency.items()},
            **{f"ttft_{k}_ms": v for k, v in distribution(ttfts).items()},
            "decode_tok_s_per_seq": distribution(decode_rates)["mean"],
            "output_tok_s": batch_size * args.output_len / latency["mean"]}


def roofline(llm: LLM, bandwidth: float | None, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Weight bytes (one GPU's, under tensor parallelism), the batch-1 tokens/s they allow at
    ``bandwidth`` (each GPU streaming its shard at once), and our batch-1 share of it."""
    model, gpus = local_model(llm)
    if bandwidth is None or model is None:
        return {}
    nbytes = weight_bytes(model)
    limit = bandwidth / nbytes
    result = {"weight_bytes": nbytes, "copy_bandwidth_gb_s": bandwidth / 1e9, "roofline_batch1_tok_s": limit,
              "num_gpus": gpus}
    batch1 = next((row for row in rows if row["batch_size"] == 1), None)
    if batch1 is not None:
        result["batch1_pct_of_roofline"] = 100 * batch1["decode_tok_s_per_seq"] / limit
    return result


def print_roofline(result: dict[str, Any]) -> None:
    if not result:
        print("roofline: needs CUDA and no pipeline or data parallelism")
        return
    print(f"roofline: {result['weight_bytes'] / 2**30:.2f} GiB of weights a GPU ({result['num_gpus']}) at {result['copy_bandwidth_gb_s']:.0f} GB/s "
          f"(measured copy) -> at most {result['roofline_batch1_tok_s']:.1f} tok/s at batch 1", end="")
    if "batch1_pct_of_roofline" in result:
        print(f"; batch-1 decode reaches {result['batch1_pct_of_roofline']:.1f}% of it", end="")
    print()


def run(args: argparse.Namespace) -> int:
    if args.output_len < 2:
        raise SystemExit("--output-len must be at least 2 (decode speed is measured after the first token)")
    config = engine_config_from_args(args)
    platform = select_platform(config.platform)
    bandwidth = copy_bandwidth(platform) if platform.measures_rooflines else None
    llm = LLM(**config.model_dump(exclude_defaults=True))
    rows = [measure_batch(llm, args, batch_size) for batch_size in args.batch_size]
    print(f"latency: input {args.input_len}, output {args.output_len} tokens, {args.num_iters} iterations "
          f"(+{args.num_iters_warmup} warm-up), greedy, eos ignored")
    print_columns(HEADERS, [(r["batch_size"], *(1000 * r[f"latency_{k}_s"] for k in ("mean", "median", "p99")),
                             r["ttft_mean_ms"], r["decode_tok_s_per_seq"], r["output_tok_s"]) for r in rows])
    limits = roofline(llm, bandwidth, rows)
    print_roofline(limits)
    if args.output_json:
        result = {"device": llm.engine.platform.device.type, "model": config.model, "input_len": args.input_len,
                  "output_len": args.output_len, "num_iters": args.num_iters, "batches": rows, **limits}
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("latency", help="latency of fixed batches (and batch-1 vs the roofline)")
    add_engine_args(parser)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--num-iters", type=int, default=3)
    parser.add_argument("--num-iters-warmup", type=int, default=1)
    parser.add_argument("--output-json", default=None)
    parser.set_defaults(func=run)
