"""Registers fastllm's built-in attention backends (the triton one imports its kernels lazily)."""

from fastllm.attention.torch_backend import TorchAttentionBackend
from fastllm.attention.triton_backend import TritonAttentionBackend
from fastllm.registry import hookimpl


@hookimpl
def register_attention_backends():
    return {"torch": TorchAttentionBackend, "triton": TritonAttentionBackend}
