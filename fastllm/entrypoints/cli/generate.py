"""``fastllm generate``: complete prompts with the offline engine (default: embedded SmolLM2)."""

from __future__ import annotations

import argparse

from fastllm.entrypoints.cli.engine_args import add_engine_args, engine_config_from_args
from fastllm.entrypoints.cli.sampling_args import add_sampling_args, sampling_params_from_args
from fastllm.llm import LLM


def run(args: argparse.Namespace) -> int:
    config = engine_config_from_args(args)
    llm = LLM(**config.model_dump(exclude_defaults=True))
    outputs = llm.generate(args.prompt, sampling_params_from_args(args), use_tqdm=False)
    for output in outputs:
        print(f"### prompt: {output.prompt!r}")
        if output.error_code != 200:
            print(f"error {output.error_code}: {output.error_msg}")
            continue
        if output.outputs.reasoning_content:
            print(f"[reasoning] {output.outputs.reasoning_content}")
        print(output.outputs.text)
        m = output.metrics
        print(f"--- {len(output.outputs.token_ids)} tokens, finish={output.outputs.finish_reason}, "
              f"ttft={m.first_token_time - m.arrival_time:.3f}s" if m.first_token_time else "---")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="complete prompts offline")
    parser.add_argument("prompt", nargs="+", help="one or more prompts")
    add_engine_args(parser)
    add_sampling_args(parser)
    parser.set_defaults(func=run)
