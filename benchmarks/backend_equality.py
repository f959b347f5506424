"""Greedy output of one attention backend against another (the ``torch`` reference) on one device.

    python benchmarks/backend_equality.py --model smollm2-135m --load-format dummy --prompts random

Prints, and writes with ``--output-json``, the share of prompts whose whole greedy output is
identical and the share whose first 32 tokens are.

``--backend torch --reordered-scores`` is the control for bf16: the reference against itself
with each attention score summed in another fp32 order (two halves of the head dimension),
the only difference two exact implementations can avoid having. How many outputs that alone
changes bounds what any other kernel can reach.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import torch

from fastllm import LLM, SamplingParams
from fastllm.attention import torch_backend

PREFIX_TOKENS = 32
TEXT = Path(__file__).parent.parent / "plugins/fastllm-plugin-quant/tests/data/opticks.txt"
QUESTIONS = Path(__file__).parent / "data/chat_questions.txt"


def make_prompts(kind: str, count: int, rng: random.Random) -> list:
    """``chat``: questions for the instruct model in its chat template, the prompts it is made
    for; ``random``: token ids drawn uniformly (4-700 of them), whose continuations are near-flat
    distributions where a rounding flips the greedy pick most often; ``text``: passages of 20-3000
    characters of a real book, to be continued."""
    if kind == "chat":
        questions = QUESTIONS.read_text().splitlines()
        return [[{"role": "user", "content": q}] for q in questions[:count]]
    if kind == "random":
        return [{"prompt_token_ids": [rng.randrange(3, 32000) for _ in range(rng.randrange(4, 700))]}
                for _ in range(count)]
    text = TEXT.read_text()
    starts = [rng.randrange(len(text) - 3000) for _ in range(count)]
    return [text[start:start + rng.randrange(20, 3000)] for start in starts]


def reordered_scores_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                               scale: float) -> torch.Tensor:
    """The torch backend's float32 attention with ``q . k`` summed as two half-dimension dots."""
    dtype, group, half = q.dtype, q.shape[-3] // k.shape[-3], q.shape[-1] // 2
    q, k, v = q.float(), k.float().repeat_interleave(group, -3), v.float().repeat_interleave(group, -3)
    scores = q[..., :half] @ k[..., :half].transpose(-1, -2) + q[..., half:] @ k[..., half:].transpose(-1, -2)
    probs = (scores * scale).masked_fill(~mask, float("-inf")).softmax(-1)
    return (probs @ v).to(dtype)


def greedy(args: argparse.Namespace, backend: str, prompts: list, max_num_seqs: int,
           reordered: bool = False) -> list[list[int]]:
    if reordered:
        assert backend == "torch", "--reordered-scores changes the torch backend only"
    start = time.perf_counter()
    llm = LLM(args.model, load_format=args.load_format, dtype=args.dtype, attention_backend=backend,
              max_model_len=args.max_model_len, enforce_eager=args.enforce_eager, max_num_seqs=max_num_seqs,
              seed=0)
    # A chat answer ends where the model says so; the other prompts have no natural end.
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=args.prompts != "chat")
    built = time.perf_counter()
    patch = mock.patch.object(torch_backend, "_attention", reordered_scores_attention)
    with patch if reordered else nullcontext():
        outputs = (llm.chat if args.prompts == "chat" else llm.generate)(prompts, params, use_tqdm=False)
    print(f"{backend} ({args.dtype}): engine built in {built - start:.1f}s, generated in "
          f"{time.perf_counter() - built:.1f}s", flush=True)
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return [o.outputs.token_ids for o in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--backend", default="triton")
    parser.add_argument("--reference", default="torch")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--max-num-seqs", type=int, default=256,
                        help="1: every step's matmuls have the same shapes in both engines (no batch "
                             "composition or graph padding), so only the attention backends differ")
    parser.add_argument("--reference-max-num-seqs", type=int, default=None,
                        help="the reference run's alone (default: --max-num-seqs); 1 with --reference "
                             "triton: does a sequence's output depend on the batch it runs in?")
    parser.add_argument("--prompts", choices=["chat", "random", "text"], default="chat")
    parser.add_argument("--reordered-scores", action="store_true",
                        help="--backend torch only: sum its attention scores in another fp32 order")
    parser.add_argument("--output-json")
    args = parser.parse_args()
    args.reference_max_num_seqs = args.reference_max_num_seqs or args.max_num_seqs
    rng = random.Random(0)
    prompts = make_prompts(args.prompts, args.num_prompts, rng)
    expected = greedy(args, args.reference, prompts, args.reference_max_num_seqs)
    got = greedy(args, args.backend, prompts, args.max_num_seqs, args.reordered_scores)
    whole = sum(a == b for a, b in zip(got, expected)) / len(prompts)
    prefix = sum(a[:PREFIX_TOKENS] == b[:PREFIX_TOKENS] for a, b in zip(got, expected)) / len(prompts)
    result = {"model": args.model, "dtype": args.dtype, "backend": args.backend, "reference": args.reference,
              "prompts": len(prompts), "output_len": args.output_len, "identical": whole,
              f"first_{PREFIX_TOKENS}_identical": prefix, "enforce_eager": args.enforce_eager,
              "max_num_seqs": args.max_num_seqs,
              "reference_max_num_seqs": args.reference_max_num_seqs, "prompts_kind": args.prompts,
              "reordered_scores": args.reordered_scores}
    print(json.dumps(result))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
