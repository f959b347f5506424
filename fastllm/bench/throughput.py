"""``fastllm bench throughput``: offline throughput on a mixed workload, optionally vs HF.

Prints vLLM's benchmark table (TTFT, TPOT and ITL from each request's own timings) and, on CUDA,
model FLOPs utilization against a bf16 matmul rate measured on the same device.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from fastllm.bench.datasets import BenchRequest, random_requests, sharegpt_requests
from fastllm.bench.device_rates import matmul_flops
from fastllm.bench.hf_baseline import hf_generate_throughput, load_hf_model
from fastllm.bench.model_size import local_model, num_parameters
from fastllm.bench.stats import summarize
from fastllm.bench.table import print_summary
from fastllm.bench.timed_run import run_timed
from fastllm.engine.llm_engine import select_platform
from fastllm.entrypoints.cli.engine_args import add_engine_args, engine_config_from_args
from fastllm.llm import LLM


@dataclass
class HFSetup:
    """What the HF baseline needs of the engine, kept so the engine can be freed first."""

    model: str
    load_format: str
    dtype: torch.dtype
    device: torch.device
    hf_config: Any
    max_num_seqs: int
    synchronize: Callable[[], None]


def build_requests(args: argparse.Namespace, llm: LLM) -> list[BenchRequest]:
    engine = llm.engine
    if not args.dataset:
        return random_requests(args.num_prompts, args.input_len, args.output_len, engine.hf_config.vocab_size,
                               args.range_ratio, args.seed)
    if llm.tokenizer is None:
        raise SystemExit("--dataset needs a tokenizer: pass --tokenizer for a model without one")
    return sharegpt_requests(args.dataset, args.num_prompts, llm.tokenizer, engine.max_model_len,
                             args.dataset_output_len, args.seed)


def mfu(llm: LLM, matmul_rate: float | None, summary: dict[str, Any]) -> dict[str, Any]:
    """2 * parameters FLOPs per processed token (attention's own FLOPs left out) over the measured
    rate of one GPU times their number (under tensor parallelism, rank 0's shard times the ranks:
    their replicated norms count that many times, a rounding error)."""
    model, gpus = local_model(llm)
    if matmul_rate is None or model is None:
        return {}
    params = gpus * num_parameters(model)
    flops = 2 * params * (summary["total_input_tokens"] + summary["total_output_tokens"]) / summary["duration"]
    return {"num_parameters": params, "matmul_tflops": gpus * matmul_rate / 1e12, "model_tflops": flops / 1e12,
            "mfu_pct": 100 * flops / (gpus * matmul_rate)}


def compare_hf(args: argparse.Namespace, setup: HFSetup, requests: list[BenchRequest],
               output_throughput: float) -> dict[str, Any]:
    """HF ``generate`` on the first ``--hf-num-prompts`` requests; the ratio compares output tokens/s."""
    subset = requests[: args.hf_num_prompts] if args.hf_num_prompts else requests
    batch = args.hf_batch_size or min(len(subset), setup.max_num_seqs)
    hf_model = load_hf_model(setup.model, setup.load_format, setup.dtype, setup.device, setup.hf_config)
    eos = setup.hf_config.eos_token_id
    pad = eos if isinstance(eos, int) else 0
    hf_generate_throughput(hf_model, [BenchRequest(subset[0].prompt_token_ids, 2)], 1, pad, setup.synchronize)  # warm-up
    elapsed, out_tokens = hf_generate_throughput(hf_model, subset, batch, pad, setup.synchronize)
    rate = out_tokens / elapsed
    result = {"hf_num_prompts": len(subset), "hf_batch_size": batch, "hf_elapsed_s": elapsed,
              "hf_output_tokens": out_tokens, "hf_output_tokens_per_s": rate,
              "speedup_vs_hf": output_throughput / rate}
    print(f"hf: {len(subset)} of {len(requests)} requests in {elapsed:.2f}s, {rate:.1f} output tok/s "
          f"(batch {batch}, left-padded)")
    scope = "the same requests" if len(subset) == len(requests) else (
        f"fastllm on all {len(requests)} requests, hf on the first {len(subset)} only")
    print(f"fastllm / hf output-token throughput: {result['speedup_vs_hf']:.2f}x ({scope})")
    return result


def run(args: argparse.Namespace) -> int:
    config = engine_config_from_args(args)
    platform = select_platform(config.platform)
    matmul_rate = matmul_flops(platform) if platform.measures_rooflines else None
    llm = LLM(**config.model_dump(exclude_defaults=True))
    engine = llm.engine
    requests = build_requests(args, llm)
    if not requests:
        raise SystemExit(f"no usable request in {args.dataset}")
    run_timed(engine, requests[:4])  # warm-up
    start = time.perf_counter()
    results = run_timed(engine, requests, progress=not args.quiet)
    summary = summarize(results, time.perf_counter() - start)
    utilization = mfu(llm, matmul_rate, summary)
    extra = [("Model FLOPs utilization (%):", utilization["mfu_pct"]),
             ("Measured bf16 matmul (TFLOP/s):", utilization["matmul_tflops"])] if utilization else []
    print_summary("Offline Throughput Benchmark Result", summary, extra)
    result = {"device": engine.platform.device.type, "model": config.model, **summary, **utilization}
    setup = HFSetup(config.model, engine.load_format, engine.dtype, engine.platform.device, engine.hf_config,
                    config.max_num_seqs, platform.synchronize)
    engine.shutdown()
    del llm, engine
    gc.collect()
    platform.empty_cache()  # the engine's weights and KV cache, before HF loads its copy
    if args.compare == "hf":
        result.update(compare_hf(args, setup, requests, summary["output_throughput"]))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("throughput", help="offline throughput benchmark")
    add_engine_args(parser)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--range-ratio", type=float, default=0.5, help="spread of random lengths")
    parser.add_argument("--dataset", default=None, help="ShareGPT-format JSON file")
    parser.add_argument("--dataset-output-len", type=int, default=None,
                        help="output length of every --dataset request (default: its recorded answer's)")
    parser.add_argument("--compare", choices=["hf"], default=None)
    parser.add_argument("--hf-batch-size", type=int, default=None,
                        help="default: min(HF's prompts, --max-num-seqs), the batch fastllm may run")
    parser.add_argument("--hf-num-prompts", type=int, default=None,
                        help="run HF on the first K prompts only (its throughput is then per token on those)")
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(func=run)
