"""Registers fastllm's built-in attention backend."""

from fastllm.attention.torch_backend import TorchAttentionBackend
from fastllm.registry import hookimpl


@hookimpl
def register_attention_backends():
    return {"torch": TorchAttentionBackend}
