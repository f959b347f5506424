"""Perplexity of each quantization method on text the methods were never tuned on.

The CI bounds and `benchmarks/RESULTS.md` score `opticks.txt`, on which the 4-bit fits' settings
were chosen; this scores the built-in calibration text instead (about 3,000 tokens of mixed
registers, `fastllm_quant.calibration.DEFAULT_TEXT`), in prompts of ``--chunk`` tokens.
Online methods calibrate on random tokens, so the text is held out for them.

    python benchmarks/quant_holdout.py --methods none fp8 weight_only_int4 nf4
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from fastllm import LLM
from fastllm.model_loader.resolve import embedded_model_path
from fastllm_quant.calibration import DEFAULT_TEXT

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "plugins", "fastllm-plugin-quant", "tests"))
from quant_helpers import prompt_logprobs  # noqa: E402  (the plugin tests' scoring, not a copy)


def holdout_perplexity(model: str, method: str | None, chunk: int) -> tuple[float, int]:
    """(perplexity, tokens scored) of ``DEFAULT_TEXT`` under ``method`` (None: unquantized)."""
    llm = LLM(model, quantization=method, max_model_len=chunk + 1, num_gpu_blocks_override=64,
              max_num_seqs=4, max_num_batched_tokens=4096)
    ids = llm.tokenizer(DEFAULT_TEXT, add_special_tokens=False)["input_ids"]
    prompts = [ids[i * chunk:(i + 1) * chunk] for i in range(len(ids) // chunk)]
    logprobs = prompt_logprobs(llm, prompts).double()
    return math.exp(-logprobs.mean().item()), len(logprobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=embedded_model_path())
    parser.add_argument("--methods", nargs="+", default=["none", "weight_only_int8", "fp8", "weight_only_int4", "nf4"])
    parser.add_argument("--chunk", type=int, default=1000)
    args = parser.parse_args()
    baseline = None
    for method in args.methods:
        ppl, tokens = holdout_perplexity(args.model, None if method == "none" else method, args.chunk)
        baseline = baseline or (ppl if method == "none" else None)
        versus = f" ({ppl / baseline - 1:+.2%})" if baseline and method != "none" else ""
        print(f"{method:<18} perplexity {ppl:.4f} over {tokens} tokens{versus}", flush=True)


if __name__ == "__main__":
    main()
