"""The engine's host time a sequence costs a decode step: scheduling, packing inputs, building the
sampling rows, reading tokens back, stop checks and outputs. At a few hundred sequences this
host work, not the device, bounds a step wherever the device is fast (tensor parallel, small
models), since the host prepares step n+1 while the device runs step n.

    python -P benchmarks/host_step.py [--model M --load-format dummy -tp 2] [--num-seqs 256]

Without ``--model``, a one-layer random Llama on the CPU (its forward is nearly free), with the
step overlap a GPU has forced on, so the figure is the engine's own. Prints the best of
``--repeats`` runs: microseconds a sequence-step in all, and the host's work outside the model's
forward and logits calls and outside its waits for the device's tokens (on a GPU a run the device
bounds spends most of its step waiting). ``--profile FILE``: one more run under cProfile, its
statistics into FILE.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import tempfile
import time
from typing import Any, Callable


def tiny_llama(directory: str) -> str:
    from transformers import LlamaConfig

    from fastllm.testing.models import save_tiny_checkpoint
    return save_tiny_checkpoint(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1, vocab_size=512,
                                            max_position_embeddings=2048), directory)


def timed(fn: Callable, total: list[float]) -> Callable:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - start
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile")
    args = parser.parse_args()

    import fastllm.worker.model_runner as model_runner
    from fastllm import LLM, SamplingParams
    from fastllm.platforms.cpu import CpuPlatform
    from fastllm.platforms.transfer import HostCopy

    engine_args: dict[str, Any] = {"max_num_seqs": args.num_seqs, "tensor_parallel_size": args.tensor_parallel_size}
    if args.model is None:
        CpuPlatform.overlaps_steps = True  # the GPU's step overlap, so the host path is a GPU's
        model = tiny_llama(tempfile.mkdtemp())
        engine_args.update(dtype="float32", max_model_len=args.input_len + args.output_len,
                           num_gpu_blocks_override=args.num_seqs * (-(-(args.input_len + args.output_len) // 64) + 1))
    else:
        model = args.model
        engine_args.update(load_format=args.load_format, dtype=args.dtype)
    llm = LLM(model, **engine_args)
    rng = random.Random(0)
    vocab = 500 if args.model is None else 30000

    def prompts() -> list[dict]:
        return [{"prompt_token_ids": [rng.randrange(1, vocab) for _ in range(args.input_len)]}
                for _ in range(args.num_seqs)]

    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts()[:8], params, use_tqdm=False)
    not_host_work = [0.0]  # the model's calls and the waits for the device
    runner = model_runner.ModelRunner
    runner.forward = timed(runner.forward, not_host_work)
    runner.compute_logits = timed(runner.compute_logits, not_host_work)
    HostCopy.wait = timed(HostCopy.wait, not_host_work)
    best = None
    for _ in range(args.repeats):
        batch = prompts()
        not_host_work[0] = 0.0
        start = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        if best is None or elapsed < best[0]:
            best = elapsed, not_host_work[0]
    seq_steps = args.num_seqs * args.output_len
    print(f"{args.model or 'tiny-llama (CPU)'} tp={args.tensor_parallel_size}: {args.num_seqs} sequences x "
          f"{args.output_len} tokens in {best[0]:.3f} s: {best[0] / seq_steps * 1e6:.2f} us a sequence-step, "
          f"{(best[0] - best[1]) / seq_steps * 1e6:.2f} of host work outside the model and the waits", flush=True)
    if args.profile:
        profile = cProfile.Profile()
        batch = prompts()
        profile.runcall(llm.generate, batch, params, use_tqdm=False)
        with open(args.profile, "w") as out:
            stats = pstats.Stats(profile, stream=out)
            stats.sort_stats("tottime").print_stats(50)
            stats.sort_stats("cumulative").print_stats(80)
    llm.shutdown()


if __name__ == "__main__":
    main()
