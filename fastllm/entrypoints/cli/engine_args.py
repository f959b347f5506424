"""The engine flags shared by every subcommand that builds an engine (serve, generate, bench)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from pydantic import ValidationError

from fastllm.config import EngineConfig
from fastllm.model_loader.resolve import embedded_model_path
from fastllm.registry.manager import plugin_manager

# flag -> environment variable that sets its default (AIAK / Angel-vLLM names)
ENV_DEFAULTS = {
    "max_model_len": "MAX_MODEL_LEN", "dtype": "DTYPE", "tensor_parallel_size": "TP",
    "quantization": "QUANTIZATION", "enable_prefix_caching": "ENABLE_PREFIX_CACHING",
    "gpu_memory_utilization": "GPU_MEMORY_UTILIZATION", "enforce_eager": "ENFORCE_EAGER",
    "model": "MODEL", "tool_call_parser": "TOOL_CALL_PARSER", "reasoning_parser": "REASONING_PARSER",
}


def env_bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def invalid_settings(exc: ValidationError) -> SystemExit:
    """A refused flag or environment value as one readable exit message naming both, not a traceback."""
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        if not field:
            lines.append(error["msg"])
            continue
        source = f"--{field.replace('_', '-')}" + (f" (or {ENV_DEFAULTS[field]})" if field in ENV_DEFAULTS else "")
        lines.append(f"{source}: {error['msg']}, got {error['input']!r}")
    return SystemExit("invalid settings:\n  " + "\n  ".join(lines))


def add_engine_args(parser: argparse.ArgumentParser, model_positional: bool = False) -> None:
    if model_positional:
        parser.add_argument("model", nargs="?", default=None, help="model path (default: embedded SmolLM2)")
    else:
        parser.add_argument("--model", default=None, help="model path (default: embedded SmolLM2)")
    parser.add_argument("--tokenizer", default=None, help="an HF tokenizer directory or name, or a .gguf file")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dtype", default=None, choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"])
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=None)
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=None)
    parser.add_argument("--data-parallel-size", "-dp", type=int, default=None)
    parser.add_argument("--enable-expert-parallel", action="store_true", default=None,
                        help="place MoE experts whole over the tensor-parallel ranks instead of slicing each")
    parser.add_argument("--distributed-executor-backend", default=None, choices=["mp", "ray"],
                        help="start ranks 1..N-1 as local processes (mp, default) or as actors of a Ray cluster "
                             "(ray: RAY_ADDRESS, else a local one; pip install fastllm[ray])")
    parser.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default 64)")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="sequences per step (default 256)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    parser.add_argument("--enable-prefix-caching", action="store_true", default=None)
    parser.add_argument("--enable-chunked-prefill", nargs="?", const=True, default=None, type=env_bool,
                        help="on by default; '--enable-chunked-prefill false' turns it off")
    parser.add_argument("--enforce-eager", action="store_true", default=None)
    parser.add_argument("--tp-cuda-graphs", nargs="?", const=True, default=None, type=env_bool,
                        help="capture CUDA graphs under tensor parallelism too (default on); "
                             "'--tp-cuda-graphs false' turns it off")
    parser.add_argument("--async-scheduling", nargs="?", const=True, default=None, type=env_bool,
                        help="queue each step before reading the last one's tokens (default: on CUDA); "
                             "'--async-scheduling false' turns it off")
    parser.add_argument("--quantization", "-q", default=None)
    parser.add_argument("--quantize-lm-head", action="store_true", default=None,
                        help="store the LM head in weight-only int8 (faster batch-1 decode)")
    parser.add_argument("--reasoning-parser", default=None)
    parser.add_argument("--tool-call-parser", default=None)
    parser.add_argument("--structured-output-backend", default=None,
                        help="guided-decoding backend (default auto: per request, one that enforces the spec exactly)")
    parser.add_argument("--structured-output-strict", nargs="?", const=True, default=None, type=env_bool,
                        help="refuse a schema no backend enforces exactly (default on); "
                             "'--structured-output-strict false' accepts approximations")
    parser.add_argument("--chat-template", default=None)
    parser.add_argument("--limit-mm-per-prompt", type=json.loads, default=None,
                        help='images/videos per prompt, JSON: {"image": 16, "video": 1}')
    parser.add_argument("--allowed-local-media-path", default=None,
                        help="media may be read by path only beneath this directory (off by default)")
    parser.add_argument("--allowed-media-domains", nargs="+", default=None,
                        help="hosts whose http(s) media URLs are fetched (off by default)")
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--enable-lora", action="store_true", default=None,
                        help="serve LoRA adapters per request (fastllm-plugin-lora)")
    parser.add_argument("--max-loras", type=int, default=None, help="distinct adapters in one step")
    parser.add_argument("--max-lora-rank", type=int, default=None)
    parser.add_argument("--max-cpu-loras", type=int, default=None, help="adapters kept on the host")
    parser.add_argument("--merge-lora", default=None, metavar="ADAPTER",
                        help="merge this PEFT LoRA adapter into the weights at load")
    parser.add_argument("--hf-overrides", type=json.loads, default=None,
                        help='JSON of config fields to override, e.g. \'{"vocab_size": 49152}\' for a '
                             "dummy-weight model served with another model's tokenizer")
    plugin_manager().hook.add_engine_args(parser=parser)


def engine_config_from_args(args: argparse.Namespace, **overrides: Any) -> EngineConfig:
    """Flags first, then the documented environment variables, then EngineConfig's defaults."""
    values: dict[str, Any] = {}
    for field in EngineConfig.model_fields:
        value = getattr(args, field, None)
        if value is None and field in ENV_DEFAULTS and ENV_DEFAULTS[field] in os.environ:
            raw = os.environ[ENV_DEFAULTS[field]]
            value = env_bool(raw) if EngineConfig.model_fields[field].annotation is bool else raw
        if value is not None:
            values[field] = value
    if not values.get("model"):  # only now: the embedded model's package need not be installed otherwise
        values["model"] = embedded_model_path()
    for fields in plugin_manager().hook.engine_args_to_config(args=args):
        for field, value in (fields or {}).items():
            values.setdefault(field, value)
    values.update(overrides)
    try:
        return EngineConfig(**values)
    except ValidationError as exc:
        raise invalid_settings(exc) from None

