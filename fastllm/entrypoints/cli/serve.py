"""``fastllm serve [MODEL]``: the OpenAI-compatible server (AIAK / Angel-vLLM flags and env vars).

Flags of those servers that fastllm cannot honour stop the start with a message
saying so, instead of being accepted and ignored; flags that ask for nothing
fastllm would do differently are accepted with a log line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any, Callable

from pydantic import ValidationError

from fastllm import registry
from fastllm.config import EngineConfig
from fastllm.entrypoints.cli.engine_args import add_engine_args, engine_config_from_args, env_bool, invalid_settings
from fastllm.entrypoints.openai.server_config import ServerConfig

logger = logging.getLogger("fastllm")

# dest -> (is the value something we cannot do?, why)
UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "num_scheduler_steps": (lambda v: v not in (None, 1), "multi-step scheduling is not supported"),
    "max_seq_len_to_capture": (lambda v: v is not None, "CUDA-graph capture length is not configurable"),
    "scheduler_delay_factor": (lambda v: v not in (None, 0.0), "a scheduler delay is not supported"),
    "tokenizer_extension_path": (lambda v: v is not None, "tokenizer extensions are not supported"),
}
# flags accepted for compatibility that change nothing here, and why
NO_OPS = {
    "trust_remote_code": "model code is built in; no remote code is ever run",
    "disable_async_output_proc": "outputs are processed synchronously after each step",
    "use_v2_block_manager": "the paged block manager is the only one",
}


# ServerConfig fields that are flags of the same name, help text and default taken from the field
LIMIT_FLAGS = ("max_prompts_per_request", "max_sequences_per_request", "limit_concurrency", "timeout_keep_alive",
               "header_timeout", "body_timeout", "enable_docs")


def env_default(name: str, convert: Callable[[str], Any]) -> Any:
    """A flag's default from its environment variable, for flags whose ``type`` argparse cannot apply."""
    return convert(os.environ[name]) if name in os.environ else None


def _env_list(value: str) -> list[str]:
    """``"a,b c"`` -> ``["a", "b", "c"]``: lists from flags and env vars alike."""
    return [item for item in value.replace(",", " ").split() if item]


def check_flags(args: argparse.Namespace) -> None:
    """Exit with the reason for every flag we cannot honour; log the ones that are no-ops here."""
    problems = [f"--{dest.replace('_', '-')}={getattr(args, dest)!r}: {why}"
                for dest, (unsupported, why) in UNSUPPORTED.items() if unsupported(getattr(args, dest))]
    if problems:
        raise SystemExit("fastllm serve cannot start:\n  " + "\n  ".join(problems))
    for dest, why in NO_OPS.items():
        if getattr(args, dest):
            logger.info("--%s accepted: %s", dest.replace("_", "-"), why)


def check_plugins(config: EngineConfig) -> None:
    """Fail on an unknown plugin name now, not after the weights are loaded."""
    wanted = [("quantizers", config.quantization), ("tool_parsers", config.tool_call_parser),
              ("reasoning_parsers", config.reasoning_parser),
              ("speculative_decoders", (config.speculative_config or {}).get("method"))]
    for kind, name in wanted:
        if name:
            registry.get(kind, name)
    if config.enable_lora:
        registry.only("adapter_managers", "enable_lora")


def server_config_from_args(args: argparse.Namespace, engine_config: EngineConfig) -> ServerConfig:
    # by default the model's file or folder name: /v1/models must not show where the weights lie
    names = args.served_model_name or _env_list(os.environ.get("SERVED_MODEL_NAME") or os.environ.get(
        "MODEL_ID") or "") or [os.path.basename(engine_config.model.rstrip("/")) or engine_config.model]
    try:
        return ServerConfig(served_model_names=names, api_keys=_env_list(" ".join(args.api_keys or [])),
                            disable_log_requests=bool(args.disable_log_requests),
                            enable_auto_tool_choice=bool(args.enable_auto_tool_choice),
                            max_waiting_requests=args.max_waiting_requests,
                            max_request_body_bytes=args.max_request_body_bytes,
                            lora_modules=lora_modules(args.lora_modules or []),
                            allow_runtime_lora_updating=bool(args.allow_runtime_lora_updating),
                            shutdown_timeout=args.shutdown_timeout,
                            **{name: getattr(args, name) for name in LIMIT_FLAGS})
    except ValidationError as exc:
        raise invalid_settings(exc) from None


def lora_modules(specs: list[str]) -> dict[str, str]:
    """``name=path`` or ``{"name": ..., "path": ...}`` per adapter -> name -> path."""
    modules = {}
    for spec in specs:
        if spec.lstrip().startswith("{"):
            try:
                entry = json.loads(spec)
                name, path = entry["name"], entry["path"]
            except (ValueError, KeyError, TypeError):
                raise SystemExit(f"--lora-modules {spec!r}: JSON needs \"name\" and \"path\"") from None
        else:
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                raise SystemExit(f"--lora-modules {spec!r}: expected name=path")
        modules[name] = path
    return modules


def run(args: argparse.Namespace) -> int:
    from fastllm.engine.core_client import EngineCoreClient
    from fastllm.entrypoints.openai.api_server import build_app, run_server

    args.model = args.model or args.model_option
    check_flags(args)
    runtime_lora = args.lora_modules or args.allow_runtime_lora_updating
    engine_config = engine_config_from_args(args, **({"enable_lora": True} if runtime_lora else {}))
    check_plugins(engine_config)
    server_config = server_config_from_args(args, engine_config)
    engine = EngineCoreClient(engine_config, request_window=args.request_window)
    try:
        run_server(build_app(engine, server_config), args.host, args.port, server_config.shutdown_timeout,
                   args.uvicorn_log_level)
    finally:
        engine.shutdown(server_config.shutdown_timeout)
    if engine.dead_error is not None:
        logger.error("the engine loop died; exiting so that a supervisor can restart the server")
        return 1
    return 0


def _add_server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", dest="model_option", default=None, help="same as the MODEL argument")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-keys", nargs="+", default=env_default("API_KEYS", _env_list),
                        help="accepted bearer tokens, space- or comma-separated (env API_KEYS)")
    parser.add_argument("--served-model-name", nargs="+", default=None,
                        help="names clients may use (env SERVED_MODEL_NAME, else MODEL_ID, else the model path)")
    parser.add_argument("--disable-log-requests", action="store_true",
                        default=env_default("DISABLE_LOG_REQUESTS", env_bool))
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        default=env_default("ENABLE_AUTO_TOOL_CHOICE", env_bool))
    parser.add_argument("--max-waiting-requests", type=int, default=os.environ.get("MAX_WAITING_REQUESTS"),
                        help="answer 429 while this many requests wait (env MAX_WAITING_REQUESTS; default: no limit)")
    parser.add_argument("--max-request-body-bytes", type=int, default=16 * 2**20)
    parser.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="seconds in-flight requests get to finish after SIGTERM")
    limits = ServerConfig.model_fields
    for name in LIMIT_FLAGS:
        field = limits[name]
        if field.annotation is bool:
            parser.add_argument(f"--{name.replace('_', '-')}", action="store_true", help=field.description)
        else:
            parser.add_argument(f"--{name.replace('_', '-')}", type=float if field.annotation is float else int,
                                default=field.default, help=f"{field.description} (default {field.default})")
    parser.add_argument("--request-window", type=int, default=None,
                        help="sequences of one request in the engine at once; the rest wait their turn, round-robin "
                             "with other requests (default: a sixteenth of --max-num-seqs, at least 4)")
    parser.add_argument("--uvicorn-log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug", "trace"])
    parser.add_argument("--trust-remote-code", action="store_true",
                        default=env_default("TRUST_REMOTE_CODE", env_bool))
    parser.add_argument("--disable-async-output-proc", action="store_true")
    parser.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                        help="LoRA adapters clients address by name in `model`: name=path, or JSON "
                             '{"name": ..., "path": ...}; implies --enable-lora')
    parser.add_argument("--allow-runtime-lora-updating", action="store_true",
                        default=env_default("ALLOW_RUNTIME_LORA_UPDATING", env_bool),
                        help="enable /v1/load_lora_adapter and /v1/unload_lora_adapter (env ALLOW_RUNTIME_LORA_UPDATING)")
    parser.add_argument("--use-v2-block-manager", action="store_true")


def _add_unsupported_args(parser: argparse.ArgumentParser) -> None:
    """Flags of 003's table that fastllm refuses: parsed only so that ``check_flags`` can explain."""
    group = parser.add_argument_group("not supported (refused at start)")
    group.add_argument("--num-scheduler-steps", type=int, default=None)
    group.add_argument("--max-seq-len-to-capture", type=int, default=None)
    group.add_argument("--scheduler-delay-factor", type=float, default=None)
    group.add_argument("--tokenizer-extension-path", default=None)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_engine_args(parser, model_positional=True)
    _add_server_args(parser)
    _add_unsupported_args(parser)
    parser.set_defaults(func=run)
