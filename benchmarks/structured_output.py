"""Throughput with structured outputs vs without, on the same prompts and the same output lengths.

The guided run goes first; its per-request output lengths then become the unguided runs'
``max_tokens`` (with ``ignore_eos``), so every mode decodes the same tokens in the same batch
shape and the difference is the grammar's cost alone: bitmask fill and apply, token accept.
The mixed mode guides every other request, to show what a few grammars cost a batch.
Process CPU time is printed beside wall time: on a shared CPU host it is the steadier measure.

A second table splits the host time of an engine step: waiting for the device (reading a
step's tokens), xgrammar's mask fill, the whole masking call (fill, upload and apply), the
token accept, and the rest (scheduling, launching, detokenizing, outputs). On a GPU the step
time is the larger of the forward pass and the host work, so a step that is nearly all host time
is bound by the host. ``--profile`` adds the device's idle time, split by the host range that ran
meanwhile.

    python benchmarks/structured_output.py                      # SmolLM2 on CPU
    python benchmarks/structured_output.py --model llama-3-8b --load-format dummy \
        --tokenizer SMOLLM2.gguf --num-prompts 64                 # an 8B-sized step, random weights

With ``--tokenizer`` the model's vocabulary is resized to the tokenizer's, so a dummy model
of any size decodes (random, but grammar-valid) text in that tokenizer's vocabulary.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import tempfile
import time
from collections import defaultdict
from typing import Any, Optional

from torch.profiler import record_function
from fastllm import LLM, SamplingParams
from fastllm.model_loader.resolve import embedded_model_path
from fastllm.platforms.transfer import HostCopy
from fastllm_xgrammar.bitmask import BatchFiller, fill_threads

SHORT = {"type": "string", "minLength": 1, "maxLength": 16}
SPECS: list[tuple[str, dict[str, Any]]] = [
    ("Describe a person.", {"json": {
        "type": "object", "required": ["name", "age", "email", "hobbies"],
        "properties": {"name": SHORT, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                       "email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.com$"},
                       "hobbies": {"type": "array", "items": SHORT, "minItems": 1, "maxItems": 4}}}}),
    ("Write a shopping list.", {"json": {
        "type": "object", "required": ["items"],
        "properties": {"items": {"type": "array", "minItems": 2, "maxItems": 6, "items": {
            "type": "object", "required": ["name", "qty", "urgent"],
            "properties": {"name": SHORT, "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                           "urgent": {"type": "boolean"}}}}}}}),
    ("Describe an event.", {"json": {
        "type": "object", "required": ["title", "day", "kind", "guests"],
        "properties": {"title": SHORT, "day": {"enum": ["mon", "tue", "wed", "thu", "fri"]},
                       "kind": {"enum": ["party", "meeting", "trip"]},
                       "guests": {"type": "array", "items": SHORT, "maxItems": 5}}}}),
    ("Describe a cat as a JSON object.", {"json_object": True}),
    ("Give a date and time.", {"regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9] [0-2][0-9]:[0-5][0-9]"}),
]
MODES = ("unguided", "mixed", "guided")


def prompts_and_specs(num: int) -> tuple[list[str], list[dict[str, Any]]]:
    prompts, specs = [], []
    for i in range(num):
        question, spec = SPECS[i % len(SPECS)]
        prompts.append(f"<|im_start|>user\n{question} (#{i}) Answer in JSON.<|im_end|>\n<|im_start|>assistant\n")
        specs.append(spec)
    return prompts, specs


def params_for(mode: str, specs: list[dict[str, Any]], lengths: list[int], max_tokens: int) -> list[SamplingParams]:
    """Guided rows follow their spec; unguided rows are held to the guided run's lengths."""
    params = []
    for i, (spec, length) in enumerate(zip(specs, lengths)):
        guided = mode == "guided" or (mode == "mixed" and i % 2 == 0)
        params.append(SamplingParams(temperature=0.0, max_tokens=max_tokens, guided_decoding=spec) if guided
                      else SamplingParams(temperature=0.0, max_tokens=length, ignore_eos=True))
    return params


BREAKDOWN = ("step", "device wait", "fill", "mask", "accept")
NAMED_RANGES = frozenset((*BREAKDOWN, "read", "detokenize", "emit", "schedule", "launch"))


class HostTimer:
    """Adds up the seconds spent in a few calls, per name, by wrapping them where they are looked up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        """Also marks each call as a ``record_function`` range, which a profile attributes
        the device's idle time to (``idle_by_host_range``)."""
        inner = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                with record_function(name):
                    return inner(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1

        setattr(owner, attribute, timed)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def per_step(self) -> dict[str, float]:
        """Milliseconds per engine step of each part; ``rest`` is the step's host time outside them."""
        steps = max(self.calls["step"], 1)
        ms = {name: 1e3 * self.seconds[name] / steps for name in BREAKDOWN}
        ms["rest"] = ms["step"] - ms["device wait"] - ms["mask"] - ms["accept"]
        return ms


def time_host(llm: LLM) -> HostTimer:
    """Time the engine's steps, its waits for the device and the backend's fill, mask and accept."""
    timer, backend = HostTimer(), llm.engine.structured_output
    timer.wrap(llm.engine, "step", "step")
    timer.wrap(HostCopy, "wait", "device wait")
    timer.wrap(backend.bitmask.filler, "fill", "fill")
    timer.wrap(backend, "apply_bitmask", "mask")
    timer.wrap(backend, "accept_tokens", "accept")
    engine = llm.engine
    for owner, attribute, name in ((engine, "_read", "read"), (engine, "_detokenize", "detokenize"),
                                   (engine, "_emit", "emit"), (engine.scheduler, "schedule", "schedule"),
                                   (engine.runner, "execute_model", "launch")):
        timer.wrap(owner, attribute, name)
    return timer


def compile_times(backend: Any, specs: list[dict[str, Any]]) -> tuple[float, float]:
    """Mean ms of the first compile of each distinct spec, and of a cached one."""
    from fastllm.sampling_params import GuidedDecodingParams

    distinct = [GuidedDecodingParams(**spec) for _, spec in SPECS]
    start = time.perf_counter()
    for spec in distinct:
        backend.compile(spec)
    cold = (time.perf_counter() - start) / len(distinct)
    start = time.perf_counter()
    for spec in specs:
        backend.compile(GuidedDecodingParams(**spec))
    cached = (time.perf_counter() - start) / len(specs)
    return cold * 1e3, cached * 1e3


def run_mode(llm: LLM, mode: str, prompts: list[str], specs: list[dict[str, Any]], lengths: list[int],
             max_tokens: int, timer: HostTimer) -> dict[str, Any]:
    timer.reset()
    start, start_cpu = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, params_for(mode, specs, lengths, max_tokens), use_tqdm=False)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    tokens = sum(len(out.outputs.token_ids) for out in outputs)
    mask_s = timer.seconds["mask"]
    return {"elapsed_s": elapsed, "cpu_s": cpu, "output_tokens": tokens, "tokens_per_s": tokens / elapsed,
            "mask_ms_per_step": 1e3 * mask_s / max(timer.calls["mask"], 1), "mask_share": mask_s / elapsed,
            "steps": timer.calls["step"], "host_ms_per_step": timer.per_step()}


def print_table(best: dict[str, dict[str, Any]]) -> None:
    """One row per mode; overheads are relative to the unguided run."""
    base = best["unguided"]
    print(f"{'mode':<10}{'tokens':>8}{'wall s':>9}{'tok/s':>9}{'overhead':>10}{'cpu s':>9}{'cpu overhead':>14}"
          f"{'mask ms/step':>14}{'mask share':>12}")
    for mode in MODES:
        row = best[mode]
        row["overhead_pct"] = 100.0 * (row["elapsed_s"] - base["elapsed_s"]) / base["elapsed_s"]
        row["cpu_overhead_pct"] = 100.0 * (row["cpu_s"] - base["cpu_s"]) / base["cpu_s"]
        print(f"{mode:<10}{row['output_tokens']:>8}{row['elapsed_s']:>9.2f}{row['tokens_per_s']:>9.1f}"
              f"{row['overhead_pct']:>9.1f}%{row['cpu_s']:>9.2f}{row['cpu_overhead_pct']:>13.1f}%"
              f"{row['mask_ms_per_step']:>14.3f}{100 * row['mask_share']:>11.1f}%")


def print_breakdown(best: dict[str, dict[str, Any]]) -> None:
    """Host milliseconds per engine step; the last column is the step's growth over unguided."""
    parts = (*BREAKDOWN, "rest")
    print(f"\nms per engine step{'steps':>7}" + "".join(f"{part:>12}" for part in parts) + f"{'added':>10}")
    base = best["unguided"]["host_ms_per_step"]["step"]
    for mode in MODES:
        ms = best[mode]["host_ms_per_step"]
        print(f"{mode:<18}{best[mode]['steps']:>7}" + "".join(f"{ms[part]:>12.3f}" for part in parts)
              + f"{ms['step'] - base:>10.3f}")
    print("fill: xgrammar's mask fill; mask: the whole masking call (fill, upload, apply); "
          "rest = step - device wait - mask - accept")


def profile_modes(llm: LLM, prompts: list[str], specs: list[dict[str, Any]], lengths: list[int],
                  max_tokens: int, timer: HostTimer) -> dict[str, dict[str, float]]:
    """One more run of the unguided and the guided mode under torch.profiler: how much of the
    wall time the device was busy (kernels and copies), and the guided run's costliest kernels.
    A step slower than its forward pass with the device busy throughout did more device work;
    with the device idle, the host kept it waiting."""
    from torch.profiler import ProfilerActivity, profile

    shares: dict[str, dict[str, float]] = {}
    for mode in ("unguided", "guided"):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            row = run_mode(llm, mode, prompts, specs, lengths, max_tokens, timer)
        events = prof.key_averages()
        busy_ms = sum(e.self_device_time_total for e in events if e.key not in NAMED_RANGES) / 1e3
        wall_ms = 1e3 * row["elapsed_s"]
        shares[mode] = {"wall_ms": wall_ms, "device_busy_ms": busy_ms, "steps": row["steps"]}
        idle = idle_by_host_range(prof.events())
        shares[mode]["device_idle_ms_by_host_range"] = idle
        print(f"profile {mode}: wall {wall_ms:.1f} ms, device busy {busy_ms:.1f} ms "
              f"({100 * busy_ms / wall_ms:.0f}%), {row['steps']} steps; device idle (ms) while the host was in: "
              + ", ".join(f"{name} {ms:.1f}" for name, ms in sorted(idle.items(), key=lambda kv: -kv[1])))
        if mode == "guided":
            print(events.table(sort_by="self_device_time_total", row_limit=12))
    return shares


def idle_by_host_range(events: Any) -> dict[str, float]:
    """Milliseconds the device sat idle (no kernel or copy), split by the innermost timed host
    range open at the time (``HostTimer`` names; "other" outside all): what the device waited for."""
    busy, ranges = [], []
    for event in events:
        span = (event.time_range.start, event.time_range.end)
        if event.name in NAMED_RANGES:  # on the device too, where they mark what a range queued
            if "CPU" in str(event.device_type):
                ranges.append((*span, event.name))
        elif "CUDA" in str(event.device_type):
            busy.append(span)
    busy.sort()
    ranges.sort()
    starts = [r[0] for r in ranges]
    longest = max((b - a for a, b, _ in ranges), default=0)
    out: dict[str, float] = defaultdict(float)
    end = busy[0][1] if busy else 0
    for start, stop in busy[1:]:
        if start > end:  # an idle gap [end, start)
            first = bisect.bisect_left(starts, end - longest)
            near = [r for r in ranges[first:bisect.bisect_left(starts, start)] if r[1] > end]
            cuts = sorted({end, start, *(t for a, b, _ in near for t in (a, b) if end < t < start)})
            for a, b in zip(cuts, cuts[1:]):
                inside = [r for r in near if r[0] <= a and b <= r[1]]
                name = min(inside, key=lambda r: r[1] - r[0])[2] if inside else "other"
                out[name] += (b - a) / 1e3
        end = max(end, stop)
    return dict(out)


def tokenizer_dir(path: str) -> str:
    """A tokenizer directory; a GGUF file's tokenizer is written out to one (the dummy loader
    reads tokenizers with ``from_pretrained``, which needs ``gguf_file`` for a GGUF)."""
    if not path.endswith(".gguf"):
        return path
    from transformers import AutoTokenizer

    out = tempfile.mkdtemp(prefix="fastllm-tokenizer-")
    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path))
    tokenizer.save_pretrained(out)
    return out


def build_llm(args: argparse.Namespace) -> LLM:
    model = args.model or embedded_model_path()
    extra: dict[str, Any] = {}
    if args.tokenizer:
        tokenizer: Optional[str] = tokenizer_dir(args.tokenizer)
        from transformers import AutoTokenizer

        extra = {"tokenizer": tokenizer, "hf_overrides": {"vocab_size": len(AutoTokenizer.from_pretrained(tokenizer))}}
    if args.async_scheduling is not None:
        extra["async_scheduling"] = args.async_scheduling == "true"
    return LLM(model, load_format=args.load_format, max_model_len=args.max_model_len, dtype=args.dtype,
               num_gpu_blocks_override=args.num_gpu_blocks, attention_backend=args.attention_backend,
               max_num_seqs=max(args.num_prompts, 1), structured_output_backend="xgrammar", **extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M GGUF")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer (directory or GGUF) for a dummy model; resizes its vocabulary to match")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--async-scheduling", choices=["true", "false"], default=None,
                        help="default: the platform's (on for CUDA)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode, interleaved; the fastest counts")
    parser.add_argument("--attention-backend", default=None, help="default: the platform's")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--num-gpu-blocks", type=int, default=None, help="KV blocks (default: profiled)")
    parser.add_argument("--fill-threads", type=int, default=None,
                        help="most xgrammar mask-fill threads (default: the backend's, half the cores, at most 8)")
    parser.add_argument("--profile", action="store_true",
                        help="then profile one unguided and one guided run (device busy time, kernels)")
    parser.add_argument("--output-json", default="benchmarks/results/structured_output.json")
    args = parser.parse_args()

    llm = build_llm(args)
    model = args.model or embedded_model_path()
    backend = llm.engine.structured_output
    prompts, specs = prompts_and_specs(args.num_prompts)
    cold_ms, cached_ms = compile_times(backend, specs)
    threads = args.fill_threads or fill_threads()
    backend.bitmask.filler = BatchFiller(threads)
    timer = time_host(llm)

    guided = llm.generate(prompts, params_for("guided", specs, [0] * len(specs), args.max_tokens), use_tqdm=False)
    lengths = [len(out.outputs.token_ids) for out in guided]
    best: dict[str, dict[str, Any]] = {}
    for _ in range(args.repeats):
        for mode in MODES:
            row = run_mode(llm, mode, prompts, specs, lengths, args.max_tokens, timer)
            if mode not in best or row["elapsed_s"] < best[mode]["elapsed_s"]:
                best[mode] = row

    device = llm.engine.platform.device.type
    print(f"\nstructured outputs on {device}, {model} (async scheduling {llm.engine.overlap}): "
          f"{args.num_prompts} prompts, {sum(lengths)} output tokens, at most {threads} fill threads, "
          f"best of {args.repeats}; compile {cold_ms:.1f} ms cold, {cached_ms:.3f} ms cached (mean per spec)")
    print_table(best)
    print_breakdown(best)
    profiled = profile_modes(llm, prompts, specs, lengths, args.max_tokens, timer) if args.profile else None
    if args.output_json:
        os.makedirs(os.path.dirname(args.output_json) or ".", exist_ok=True)
        with open(args.output_json, "w") as f:
            json.dump({"device": device, "model": model, "async_scheduling": llm.engine.overlap,
                       "num_prompts": args.num_prompts, "fill_threads": threads, "lengths": lengths,
                       "compile_ms_cold": cold_ms, "compile_ms_cached": cached_ms, "modes": best,
                       "profile": profiled}, f, indent=2)
        print(f"results: {args.output_json}")


if __name__ == "__main__":
    main()
