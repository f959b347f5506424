"""``fastllm chat``: an interactive conversation in the terminal, using the model's chat template."""

from __future__ import annotations

import argparse

from fastllm.entrypoints.cli.engine_args import add_engine_args, engine_config_from_args
from fastllm.entrypoints.cli.sampling_args import add_sampling_args, sampling_params_from_args
from fastllm.llm import LLM


def run(args: argparse.Namespace) -> int:
    llm = LLM(**engine_config_from_args(args).model_dump(exclude_defaults=True))
    params = sampling_params_from_args(args)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    kwargs = {"enable_thinking": not args.no_thinking}
    print("Type a message; an empty line or Ctrl-D ends the chat.")
    while True:
        try:
            line = input("user> ").strip()
        except EOFError:
            break
        if not line:
            break
        messages.append({"role": "user", "content": line})
        output = llm.chat(messages, params, use_tqdm=False, chat_template_kwargs=kwargs)[0]
        if output.error_code != 200:
            print(f"error: {output.error_msg}")
            messages.pop()
            continue
        if output.outputs.reasoning_content:
            print(f"[reasoning] {output.outputs.reasoning_content}")
        print(f"assistant> {output.outputs.text}")
        messages.append({"role": "assistant", "content": output.outputs.text})
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("chat", help="interactive chat with the model")
    parser.add_argument("--system", default=None, help="system prompt")
    parser.add_argument("--no-thinking", action="store_true", help="chat_template_kwargs enable_thinking=False")
    add_engine_args(parser)
    add_sampling_args(parser)
    parser.set_defaults(func=run)
