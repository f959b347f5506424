"""``fastllm bench throughput``: offline throughput on a mixed workload, optionally vs HF."""

from __future__ import annotations

import argparse
import json
import time

from fastllm.bench.datasets import random_requests, sharegpt_requests
from fastllm.bench.hf_baseline import hf_generate_throughput, load_hf_model
from fastllm.entrypoints.cli.engine_args import add_engine_args, engine_config_from_args
from fastllm.llm import LLM
from fastllm.sampling_params import SamplingParams


def run(args: argparse.Namespace) -> int:
    config = engine_config_from_args(args)
    llm = LLM(**config.model_dump(exclude_defaults=True))
    engine = llm.engine
    if args.dataset:
        requests = sharegpt_requests(args.dataset, args.num_prompts, llm.tokenizer, engine.max_model_len,
                                     args.output_len)
    else:
        requests = random_requests(args.num_prompts, args.input_len, args.output_len,
                                   engine.hf_config.vocab_size, args.range_ratio, args.seed)
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    params = [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in requests]
    llm.generate(prompts[: min(4, len(prompts))], params[:4], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=not args.quiet)
    elapsed = time.perf_counter() - start
    in_tokens = sum(len(r.prompt_token_ids) for r in requests)
    out_tokens = sum(len(o.outputs.token_ids) for o in outputs)
    result = {
        "device": engine.platform.device.type, "model": config.model, "requests": len(requests),
        "elapsed_s": round(elapsed, 3), "requests_per_s": round(len(requests) / elapsed, 3),
        "input_tokens": in_tokens, "output_tokens": out_tokens,
        "output_tokens_per_s": round(out_tokens / elapsed, 2),
        "total_tokens_per_s": round((in_tokens + out_tokens) / elapsed, 2),
    }
    print(f"{'fastllm':<10} {len(requests)} requests in {elapsed:.2f}s: "
          f"{result['requests_per_s']:.2f} req/s, {result['output_tokens_per_s']:.1f} output tok/s, "
          f"{result['total_tokens_per_s']:.1f} total tok/s")
    if args.compare == "hf":
        hf_model = load_hf_model(config.model, engine.load_format, engine.dtype, engine.platform.device,
                                 engine.hf_config)
        hf_elapsed, hf_out = hf_generate_throughput(hf_model, requests, args.hf_batch_size,
                                                    engine.hf_config.eos_token_id if isinstance(
                                                        engine.hf_config.eos_token_id, int) else 0)
        hf_rate = hf_out / hf_elapsed
        result.update(hf_elapsed_s=round(hf_elapsed, 3), hf_output_tokens_per_s=round(hf_rate, 2),
                      speedup_vs_hf=round(result["output_tokens_per_s"] / hf_rate, 2))
        print(f"{'hf':<10} {len(requests)} requests in {hf_elapsed:.2f}s: {hf_rate:.1f} output tok/s "
              f"(batch {args.hf_batch_size}, padded)")
        print(f"fastllm / hf output-token throughput: {result['speedup_vs_hf']:.2f}x")
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
    parser.add_argument("--compare", choices=["hf"], default=None)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(func=run)
