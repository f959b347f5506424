"""How big the engine's model is: the bytes a decode step streams and the parameters a token multiplies."""

from __future__ import annotations

from torch import nn

from fastllm.entrypoints.cli.quantize import engine_model
from fastllm.layers.fused_moe import FusedMoE
from fastllm.llm import LLM


def local_model(llm: LLM) -> nn.Module | None:
    """The whole model when this process holds it; None under tensor parallelism (each rank has a shard)."""
    return engine_model(llm) if llm.config.tensor_parallel_size == 1 else None


def weight_bytes(model: nn.Module) -> int:
    """Bytes of parameters and buffers (tied tensors once): what batch-1 decode reads every step, give or
    take the embedding table, of which it reads one row."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def num_parameters(model: nn.Module) -> int:
    """Elements of the parameters. A quantized model stores packed weights, so this undercounts its
    logical weights (e.g. two int4 values per int8 element)."""
    return sum(p.numel() for p in model.parameters())


def active_weight_bytes(model: nn.Module) -> int:
    """``weight_bytes`` less the routed experts a token leaves alone (all but ``k`` of each MoE
    layer's ``E``): what one token of batch-1 decode reads. Equal to ``weight_bytes`` for dense models."""
    return weight_bytes(model) - _unrouted(model, lambda t: t.numel() * t.element_size())


def num_active_parameters(model: nn.Module) -> int:
    """``num_parameters`` less the routed experts a token leaves alone: the parameters it multiplies."""
    return num_parameters(model) - _unrouted(model, lambda t: t.numel())


def _unrouted(model: nn.Module, size) -> int:
    return round(sum((1 - moe.gate.top_k / moe.num_experts) * (size(moe.w13) + size(moe.w2))
                     for moe in model.modules() if isinstance(moe, FusedMoE)))
