"""Lookahead decoding side by side with plain decoding, one request at a time (batch 1).

Workloads: ``copy`` (a paragraph in the prompt, the answer repeats it), ``free`` (questions
whose answers quote nothing), ``norepeat`` (such questions under a repetition penalty, so the
answers repeat no token they can avoid: drafts almost never hold, and all lookahead can do is
stay out of the way) and ``repeat`` (one new question asked twice: the second time the shared
pool holds the first answer). Every request runs on both engines in turn, so
slow and fast moments of a shared machine fall on both alike (and which goes first alternates).
Reported per workload: decode speed (tokens after the first, over the wall-clock time after
the first), the same ratio in process CPU time (whole requests: steadier than wall-clock time
on a busy machine), tokens per forward step, draft acceptance, and the share of steps left in
flight (overlapped with the host's work for the next one: async scheduling, on by default on
CUDA, forced either way by ``--async-scheduling``). Each engine first serves a few warm-up
requests (``--warmup``), so one-off compilation is not timed.

Greedy outputs must agree between the engines. In bfloat16 they may not, token for token:
a verification pass computes several positions in one matrix product, which rounds
differently from a one-token step, and a near-tie of the top two logits then flips. So in any
dtype other than float32 the same prompts run again on a float32 pair of engines
(``--check-float32``), where that rounding is too small to flip a greedy choice.

    python benchmarks/lookahead.py                                              # SmolLM2, CPU
    python benchmarks/lookahead.py --model llama-3-8b --load-format dummy       # GPU, random weights
    python benchmarks/lookahead.py --model SmolLM2-135M-Instruct.Q4_1.gguf --dtype bfloat16 --num-prompts 4

Without a tokenizer (dummy weights) the prompts are token ids: ``copy`` then holds a random
"document" twice, and only ``repeat`` says much, since random weights copy nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from fastllm import LLM, SamplingParams
from fastllm.model_loader.resolve import embedded_model_path

NAMES = ["Ada Price", "Tomas Okafor", "Lena Marsh", "Ivo Brandt", "Mira Solis", "Jonah Reyes", "Esther Lund"]
PLACES = ["Harwick", "the Vale of Orrin", "Port Selby", "Kestrel Bay", "Ambermoor", "Lowfield", "Carran"]
THINGS = ["a lighthouse", "a paper mill", "a village school", "a ferry line", "an observatory", "a rope works"]
SENTENCES = [
    "{name} was born in {place} in {year}, the youngest of {count} children.",
    "In {year} {name} founded {thing} near {place}, and ran it for {count} years.",
    "Every morning the workers of {thing} walked {count} miles from {place} along the old canal.",
    "The records of {thing} were kept in a green ledger that is now held in the museum of {place}.",
    "When the flood of {year} reached {place}, {name} opened {thing} to anyone who needed shelter.",
    "Visitors to {place} can still see the stone marker that {name} carved in {year}.",
]
TOPICS = ["volcanoes", "the printing press", "honeybees", "chess openings", "bread baking", "the moon landing",
          "solar panels", "coral reefs", "medieval castles", "the violin", "black holes", "tea ceremonies"]
WORKLOADS = ("copy", "free", "norepeat")
QUESTIONS = ["Write a short story about {topic}.", "Explain {topic} to a ten-year-old.",
             "Give three surprising facts about {topic}.", "Why do people care about {topic}?"]


@dataclass
class Run:
    """One request on one engine: how many tokens, steps and seconds its decode took."""

    tokens: int
    steps: int
    decode_s: float
    cpu_s: float
    draft_tokens: int
    accepted_tokens: int
    overlapped: int  # steps that returned with a step still in flight

    @property
    def tokens_per_step(self) -> float:
        return (self.tokens - 1) / max(self.steps - 1, 1)


class Engine:
    """An LLM whose ``step`` calls are counted, so forward passes per request are known, and
    those that returned with a step in flight."""

    def __init__(self, llm: LLM):
        self.llm, self.steps, self.overlapped = llm, 0, 0
        step = llm.engine.step

        def counted() -> list:
            self.steps += 1
            outputs = step()
            self.overlapped += llm.engine.in_flight is not None
            return outputs

        llm.engine.step = counted

    def run(self, prompt: Any, params: SamplingParams) -> tuple[Run, list[int]]:
        before, overlapped, cpu = self.steps, self.overlapped, time.process_time()
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            output = self.llm.chat(prompt, params, use_tqdm=False)[0]
        else:
            output = self.llm.generate([prompt], params, use_tqdm=False)[0]
        m = output.metrics
        tokens = output.outputs.token_ids
        return Run(len(tokens), self.steps - before, m.finished_time - m.first_token_time,
                   time.process_time() - cpu, m.num_draft_tokens, m.num_accepted_tokens,
                   self.overlapped - overlapped), tokens


def document(rng: random.Random, num_sentences: int) -> str:
    fill = lambda s: s.format(name=rng.choice(NAMES), place=rng.choice(PLACES), thing=rng.choice(THINGS),
                              year=rng.randint(1820, 1990), count=rng.randint(2, 12))
    return " ".join(fill(rng.choice(SENTENCES)) for _ in range(num_sentences))


def workloads(args: argparse.Namespace, has_tokenizer: bool, vocab: int) -> dict[str, list[Any]]:
    """Prompts per workload; every prompt is new to the engines (``repeat`` holds one, asked twice)."""
    rng = random.Random(args.seed)
    if not has_tokenizer:
        ids = lambda n: [rng.randrange(100, vocab) for _ in range(n)]
        docs = [ids(args.doc_tokens) for _ in range(args.num_prompts)]
        return {"copy": [d + d for d in docs], "free": [ids(32) for _ in range(args.num_prompts)],
                "norepeat": [ids(32) for _ in range(args.num_prompts)], "repeat": [ids(32)] * 2,
                "warmup": [ids(8)] + [d + d for d in (ids(64) for _ in range(args.warmup))]}
    chat = lambda text: [{"role": "user", "content": text}]
    questions = [q.format(topic=t) for t in TOPICS for q in QUESTIONS]
    rng.shuffle(questions)
    return {
        "copy": [chat("Repeat the following text exactly:\n\n" + document(rng, args.doc_sentences))
                 for _ in range(args.num_prompts)],
        "free": [chat(q) for q in questions[:args.num_prompts]],
        "norepeat": [chat(q) for q in questions[args.num_prompts:2 * args.num_prompts]],
        "repeat": [chat(questions[2 * args.num_prompts])] * 2,
        "warmup": [chat("Say hello.")] + [chat("Repeat the following text exactly:\n\n" + document(rng, 2))
                                          for _ in range(args.warmup)],
    }


def summarize(runs: list[Run]) -> dict[str, float]:
    tokens = sum(r.tokens - 1 for r in runs)
    seconds = sum(r.decode_s for r in runs)
    drafts = sum(r.draft_tokens for r in runs)
    return {"decode_tokens": tokens, "decode_s": round(seconds, 3), "decode_tok_s": round(tokens / seconds, 2),
            "cpu_s": round(sum(r.cpu_s for r in runs), 3),
            "tokens_per_step": round(tokens / max(sum(r.steps - 1 for r in runs), 1), 3),
            "acceptance": round(sum(r.accepted_tokens for r in runs) / drafts, 3) if drafts else 0.0,
            "overlapped_steps": round(sum(r.overlapped for r in runs) / sum(r.steps for r in runs), 3)}


def measure(engines: dict[str, Engine], prompts: list[Any], params: SamplingParams,
            check: Callable[[list[int], list[int]], None]) -> dict[str, list[Run]]:
    """Each prompt on both engines in turn, first one then the other going first; greedy
    outputs must agree token for token."""
    runs: dict[str, list[Run]] = {name: [] for name in engines}
    for i, prompt in enumerate(prompts):
        outputs = {}
        for name in sorted(engines, reverse=i % 2 == 1):
            run, outputs[name] = engines[name].run(prompt, params)
            runs[name].append(run)
        check(outputs["plain"], outputs["lookahead"])
    return runs


def build_engines(model: str, common: dict[str, Any], spec: dict[str, Any]) -> dict[str, Engine]:
    return {"plain": Engine(LLM(model, **common)), "lookahead": Engine(LLM(model, speculative_config=spec, **common))}


def float32_mismatches(model: str, common: dict[str, Any], spec: dict[str, Any],
                       requests: list[tuple[Any, SamplingParams]]) -> int:
    """How many greedy outputs differ between a plain and a lookahead engine in float32."""
    engines = build_engines(model, common, spec)
    return sum(engines["plain"].run(prompt, params)[1] != engines["lookahead"].run(prompt, params)[1]
               for prompt, params in requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M GGUF")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--num-gpu-blocks", type=int, default=256, help="KV blocks of each engine")
    parser.add_argument("--num-speculative-tokens", type=int, default=6)
    parser.add_argument("--num-prompts", type=int, default=6, help="prompts per workload")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--doc-sentences", type=int, default=5, help="copy workload: sentences per paragraph")
    parser.add_argument("--doc-tokens", type=int, default=128, help="copy workload without a tokenizer")
    parser.add_argument("--repetition-penalty", type=float, default=1.3, help="norepeat workload")
    parser.add_argument("--async-scheduling", choices=["true", "false"], default=None,
                        help="overlap steps (default: where launches return early, i.e. CUDA)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=2, help="untimed copy requests per engine first")
    parser.add_argument("--check-float32", action=argparse.BooleanOptionalAction, default=None,
                        help="compare greedy outputs on two float32 engines too (default: unless float32)")
    parser.add_argument("--output-json", default="benchmarks/results/lookahead.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = args.model or embedded_model_path()
    common = {"load_format": args.load_format, "dtype": args.dtype, "max_model_len": args.max_model_len,
              "num_gpu_blocks_override": args.num_gpu_blocks, "attention_backend": args.attention_backend}
    if args.async_scheduling is not None:
        common["async_scheduling"] = args.async_scheduling == "true"
    spec = {"method": "lookahead", "num_speculative_tokens": args.num_speculative_tokens}
    engines = build_engines(model, common, spec)
    llm = engines["plain"].llm
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    prompts = workloads(args, llm.tokenizer is not None, llm.engine.hf_config.vocab_size)
    mismatches = []
    check = lambda a, b: mismatches.append(1) if a != b else None
    for engine in engines.values():
        for prompt in prompts["warmup"]:
            engine.run(prompt, SamplingParams(temperature=0.0, max_tokens=args.max_tokens // 2))

    penalized = params.model_copy(update={"repetition_penalty": args.repetition_penalty})
    results: dict[str, Any] = {}
    for name in WORKLOADS:
        runs = measure(engines, prompts[name], penalized if name == "norepeat" else params, check)
        results[name] = {mode: summarize(r) for mode, r in runs.items()}
        results[name]["speedup"] = round(results[name]["lookahead"]["decode_tok_s"]
                                         / results[name]["plain"]["decode_tok_s"], 3)
        results[name]["cpu_speedup"] = round(results[name]["plain"]["cpu_s"] / results[name]["lookahead"]["cpu_s"], 3)
        results[name]["per_request_speedup_median"] = round(statistics.median(
            p.decode_s / l.decode_s * (l.tokens - 1) / (p.tokens - 1)
            for p, l in zip(runs["plain"], runs["lookahead"])), 3)
    repeat = measure(engines, prompts["repeat"], params, check)
    results["repeat"] = {mode: [asdict(r) | {"decode_tok_s": round((r.tokens - 1) / r.decode_s, 2),
                                              "tokens_per_step": round(r.tokens_per_step, 3)} for r in runs]
                         for mode, runs in repeat.items()}
    results["lookahead_stats"] = engines["lookahead"].llm.engine.speculator.stats()
    results["greedy_mismatches"] = len(mismatches)
    check_float32 = args.check_float32
    if check_float32 is None:
        check_float32 = llm.engine.dtype != torch.float32
    if check_float32:
        everything = [(p, penalized if name == "norepeat" else params) for name in WORKLOADS for p in prompts[name]]
        results["float32_greedy_mismatches"] = float32_mismatches(model, common | {"dtype": "float32"}, spec,
                                                                  everything)

    device = llm.engine.platform.device.type
    print(f"\nlookahead decoding on {device} ({os.path.basename(model)}), batch 1, greedy, "
          f"{args.num_prompts} prompts a workload, max_tokens {args.max_tokens}, "
          f"num_speculative_tokens {args.num_speculative_tokens}, async scheduling {llm.engine.overlap}")
    print(f"{'workload':<10}{'plain tok/s':>12}{'lookahead tok/s':>17}{'speed-up':>10}{'cpu-time speed-up':>19}"
          f"{'tokens/step':>13}{'acceptance':>12}{'overlapped':>12}")
    for name in WORKLOADS:
        row = results[name]
        print(f"{name:<10}{row['plain']['decode_tok_s']:>12.1f}{row['lookahead']['decode_tok_s']:>17.1f}"
              f"{row['speedup']:>9.2f}x{row['cpu_speedup']:>18.2f}x{row['lookahead']['tokens_per_step']:>13.2f}"
              f"{row['lookahead']['acceptance']:>12.2f}{row['lookahead']['overlapped_steps']:>12.2f}")
    for mode in ("plain", "lookahead"):
        first, second = results["repeat"][mode]
        print(f"repeat    {mode:<10} first {first['decode_tok_s']:>7.1f} tok/s ({first['tokens_per_step']:.2f} "
              f"tokens/step), second {second['decode_tok_s']:>7.1f} tok/s ({second['tokens_per_step']:.2f} tokens/step)")
    print(f"greedy outputs that differ between the engines: {len(mismatches)} of "
          f"{args.num_prompts * len(WORKLOADS) + 2} ({args.dtype})")
    if check_float32:
        print(f"the same prompts in float32: {results['float32_greedy_mismatches']} differ")
    if args.output_json:
        os.makedirs(os.path.dirname(args.output_json) or ".", exist_ok=True)
        with open(args.output_json, "w") as f:
            json.dump({"device": device, "model": model, "args": vars(args), "time": time.time(), **results},
                      f, indent=2)
        print(f"results: {args.output_json}")


if __name__ == "__main__":
    main()
