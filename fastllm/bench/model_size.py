"""How big the engine's model is: the bytes a decode step streams and the parameters a token multiplies."""

from __future__ import annotations

from torch import nn

from fastllm.entrypoints.cli.quantize import engine_model
from fastllm.llm import LLM


def local_model(llm: LLM) -> nn.Module | None:
    """The whole model when this process holds it; None under tensor parallelism (each rank has a shard)."""
    config = llm.config
    whole = config.tensor_parallel_size == config.pipeline_parallel_size == config.data_parallel_size == 1
    return engine_model(llm) if whole else None


def weight_bytes(model: nn.Module) -> int:
    """Bytes of parameters and buffers (tied tensors once): what batch-1 decode reads every step, give or
    take the embedding table, of which it reads one row."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def num_parameters(model: nn.Module) -> int:
    """Elements of the parameters. A quantized model stores packed weights, so this undercounts its
    logical weights (e.g. two int4 values per int8 element)."""
    return sum(p.numel() for p in model.parameters())
