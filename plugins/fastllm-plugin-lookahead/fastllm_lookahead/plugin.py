"""Registers lookahead decoding as ``speculative_config={"method": "lookahead"}``, and the
seeds' flags that turn it on: ``--use-lookahead`` / ``--num-speculative-tokens`` (Angel-vLLM),
or ``USE_LOOKAHEAD`` / ``NUM_SPECULATIVE_TOKENS``."""

from __future__ import annotations

import argparse
import os
from typing import Any, Optional

from fastllm.registry import hookimpl
from fastllm_lookahead.decoder import LookaheadDecoder

DEFAULT_NUM_SPECULATIVE_TOKENS = 6  # Angel-vLLM's default lookahead length


@hookimpl
def register_speculative_decoders():
    return {"lookahead": LookaheadDecoder}


@hookimpl
def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--use-lookahead", action="store_true", default=None,
                        help="lookahead speculative decoding (env USE_LOOKAHEAD=1)")
    parser.add_argument("--num-speculative-tokens", type=int, default=None,
                        help=f"lookahead draft length (env NUM_SPECULATIVE_TOKENS, default "
                             f"{DEFAULT_NUM_SPECULATIVE_TOKENS})")


@hookimpl
def engine_args_to_config(args: argparse.Namespace) -> Optional[dict[str, Any]]:
    use = getattr(args, "use_lookahead", None)
    if use is None:
        use = os.environ.get("USE_LOOKAHEAD", "0").strip().lower() in ("1", "true", "yes", "on")
    if not use:
        return None
    tokens = getattr(args, "num_speculative_tokens", None) or int(
        os.environ.get("NUM_SPECULATIVE_TOKENS", DEFAULT_NUM_SPECULATIVE_TOKENS))
    return {"speculative_config": {"method": "lookahead", "num_speculative_tokens": tokens}}
