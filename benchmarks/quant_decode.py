"""Batch-1 decode speed and offline throughput of each quantization method vs bf16, on CUDA.

    python benchmarks/quant_decode.py --model llama-3-8b --load-format dummy --out quant_decode.json
    python benchmarks/quant_decode.py --methods bf16 --throughput-methods --profile -tp 2   # TP=2 step

A method named ``NAME+lm_head`` quantizes the LM head too (``quantize_lm_head``); ``NAME+grouped``
runs a MoE model's batch-1 experts on the grouped GEMMs (``FASTLLM_MOE_GEMV=0``) instead of the
one-row GEMV, so ``--methods bf16 bf16+grouped fp8 fp8+grouped`` is that A/B. Each method
gets a fresh engine; batch-1 decode tok/s is measured over ``--decode-tokens`` generated tokens
after the first, the median of ``--decode-repeats`` requests; the offline run
(``--throughput-methods``, default bf16 vs fp8) over ``--num-prompts`` random prompts. Prints a
table and writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from unittest import mock

import torch

from fastllm import LLM, SamplingParams
from fastllm.engine.in_process import engine_model
from fastllm.quantization import weight_bytes
from fastllm_kernels.fused_moe import EXPERT_GEMV_ENV

METHODS = ["bf16", "weight_only_int8", "fp8", "nf4", "weight_only_int4"]
HEAD = "+lm_head"
GROUPED = "+grouped"


def build(args: argparse.Namespace, method: str, max_num_seqs: int) -> LLM:
    name = method.removesuffix(GROUPED).removesuffix(HEAD)
    return LLM(args.model, load_format=args.load_format, dtype="bfloat16", max_model_len=args.max_model_len,
               max_num_seqs=max_num_seqs, quantization=None if name == "bf16" else name,
               quantize_lm_head=method.removesuffix(GROUPED).endswith(HEAD), gpu_memory_utilization=0.85,
               attention_backend=args.attention_backend, tensor_parallel_size=args.tensor_parallel_size)


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(10, vocab - 10, (length,), generator=gen).tolist()}
            for _ in range(count)]


def decode_tokens_per_s(llm: LLM, args: argparse.Namespace) -> list[float]:
    """Batch-1 decode speed of ``--decode-repeats`` requests, one after another (after a warm-up)."""
    vocab = llm.engine.hf_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens + 1, ignore_eos=True)
    llm.generate(random_prompts(1, args.prompt_len, vocab, 0), params, use_tqdm=False)  # warm-up
    speeds = []
    for seed in range(1, args.decode_repeats + 1):
        m = llm.generate(random_prompts(1, args.prompt_len, vocab, seed), params, use_tqdm=False)[0].metrics
        speeds.append(round(args.decode_tokens / (m.finished_time - m.first_token_time), 1))
    return speeds


def decode_profile(llm: LLM, args: argparse.Namespace) -> dict:
    """One more batch-1 decode under torch.profiler: device microseconds per decode step by
    kernel (CUDA-graph replays included) and the device's busy share of the wall time, so a
    method's step splits into its GEMVs and the kernels no weight format shrinks; then what each
    kernel (and grid: one per layer shape) adds to the step (``critical_path``)."""
    from torch.profiler import ProfilerActivity, profile

    vocab = llm.engine.hf_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens + 1, ignore_eos=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        llm.generate(random_prompts(1, args.prompt_len, vocab, args.decode_repeats + 1), params, use_tqdm=False)
        wall_us = 1e6 * (time.perf_counter() - start)
    added = critical_path(prof, args.decode_tokens)
    per_kernel: dict[str, float] = {}
    for event in prof.key_averages():
        if event.self_device_time_total > 0:
            per_kernel[event.key[:80]] = event.self_device_time_total / args.decode_tokens
    busy = sum(per_kernel.values())
    print(f"profile: wall {wall_us / args.decode_tokens:.1f} us/token, device busy {busy:.1f} us/token "
          f"(prefill included, {args.decode_tokens} tokens)")
    for name, us in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:args.profile_rows]:
        print(f"{us:>10.2f} us  {name}")
    print("step time added by each kernel (its end minus the previous kernel's end), us a token:")
    for name, us in sorted(added.items(), key=lambda kv: -kv[1])[:args.profile_rows]:
        print(f"{us:>10.2f} us  {name}")
    return {"wall_us_per_token": round(wall_us / args.decode_tokens, 1), "busy_us_per_token": round(busy, 1),
            "kernels_us_per_token": {k: round(v, 2) for k, v in per_kernel.items()},
            "added_us_per_token": {k: round(v, 2) for k, v in added.items()}}


def critical_path(prof: torch.profiler.profile, tokens: int) -> dict[str, float]:
    """Microseconds per token that each kernel (name and grid) adds to the stream: its end minus
    the end of the kernel before it (idle gaps go to the kernel after them). Launched dependent,
    a kernel starts early and its duration includes the wait for its predecessor, so device
    time per kernel over-counts; these sum to the stream's span."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    added: dict[str, float] = {}
    last_end = kernels[0]["ts"] if kernels else 0.0
    for event in kernels:
        end = event["ts"] + event["dur"]
        key = f"{event['name'][:40]} grid {tuple(event.get('args', {}).get('grid', ()))}"
        added[key] = added.get(key, 0.0) + max(0.0, end - last_end) / tokens
        last_end = max(last_end, end)
    return added


def throughput(llm: LLM, args: argparse.Namespace) -> dict[str, float]:
    vocab = llm.engine.hf_config.vocab_size
    prompts = random_prompts(args.num_prompts, args.input_len, vocab, 2)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:4], params, use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    out_tokens = sum(len(o.outputs.token_ids) for o in outputs)
    return {"output_tokens_per_s": round(out_tokens / elapsed, 1),
            "total_tokens_per_s": round((out_tokens + args.num_prompts * args.input_len) / elapsed, 1)}


def measure(args: argparse.Namespace, method: str) -> dict:
    """One engine's numbers; the engine is gone (and its GPU memory free) when this returns."""
    with mock.patch.dict(os.environ, {EXPERT_GEMV_ENV: "0" if method.endswith(GROUPED) else "1"}):
        return measure_engine(args, method)


def measure_engine(args: argparse.Namespace, method: str) -> dict:
    start = time.perf_counter()
    llm = build(args, method, max_num_seqs=args.max_num_seqs)
    row: dict = {"load_s": round(time.perf_counter() - start, 1),  # quantizing included
                 "weight_gib": round(weight_bytes(engine_model(llm)) / 2**30, 2)}
    if method in args.methods:
        speeds = decode_tokens_per_s(llm, args)
        row["decode_tok_per_s_batch1"] = statistics.median(speeds)
        row["decode_tok_per_s_runs"] = speeds
        if args.profile:
            row["profile"] = decode_profile(llm, args)
    if method in args.throughput_methods:
        row.update(throughput(llm, args))
    llm.engine.runner.shutdown()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--throughput-methods", nargs="*", default=["bf16", "fp8"])
    parser.add_argument("--attention-backend", default=None, help="default: the platform's")
    parser.add_argument("-tp", "--tensor-parallel-size", type=int, default=1,
                        help="profiles rank 0's device: its kernels, collectives and waits for the other ranks")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=256,
                        help="fewer: fewer CUDA graphs to capture when only batch 1 is wanted")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--decode-repeats", type=int, default=3,
                        help="decodes timed per method; the median is reported")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--profile", action="store_true", help="then profile one batch-1 decode per method")
    parser.add_argument("--profile-rows", type=int, default=25)
    parser.add_argument("--out", default="quant_decode.json")
    args = parser.parse_args()
    results: dict[str, dict] = {}
    for method in dict.fromkeys(args.methods + args.throughput_methods):
        results[method] = measure(args, method)
        gc.collect()
        torch.cuda.empty_cache()
        print(method, {k: v for k, v in results[method].items() if k != "profile"}, flush=True)
    print(f"\n{'method':<26}{'weights GiB':>12}{'decode tok/s (bs=1)':>22}{'offline out tok/s':>20}"
          f"{'offline total tok/s':>21}")
    for method, row in results.items():
        print(f"{method:<26}{row['weight_gib']:>12}{row.get('decode_tok_per_s_batch1', '-'):>22}"
              f"{row.get('output_tokens_per_s', '-'):>20}{row.get('total_tokens_per_s', '-'):>21}")
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "model": args.model, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
