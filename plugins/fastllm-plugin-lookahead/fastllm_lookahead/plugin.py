"""Registers lookahead decoding as ``speculative_config={"method": "lookahead"}``."""

from fastllm.registry import hookimpl
from fastllm_lookahead.decoder import LookaheadDecoder


@hookimpl
def register_speculative_decoders():
    return {"lookahead": LookaheadDecoder}
