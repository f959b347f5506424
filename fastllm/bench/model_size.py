"""How big the engine's model is: the bytes a decode step streams and the parameters a token multiplies."""

from __future__ import annotations

import torch
from torch import nn

from fastllm.engine.in_process import engine_model
from fastllm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from fastllm.layers.fused_moe import FusedMoE
from fastllm.layers.rotary import RotaryEmbedding
from fastllm.llm import LLM


def local_model(llm: LLM) -> tuple[nn.Module | None, int]:
    """The model this process holds and how many GPUs share its work: all of it on one (1); under
    tensor parallelism rank 0's shard, alike on every rank, so per GPU what the whole is for all
    of them (``tensor_parallel_size``); None under pipeline or data parallelism."""
    config = llm.config
    if config.pipeline_parallel_size != 1 or config.data_parallel_size != 1:
        return None, 1
    return engine_model(llm), config.tensor_parallel_size


def _token_shares(model: nn.Module) -> dict[int, float]:
    """The share of a tensor one token reads, where it is not all: ``k / E`` of the routed experts'
    stacked weights, one row of an input embedding table (unless the LM head, which reads all of
    it, shares it), one position row of a rotary cos/sin table."""
    shares: dict[int, float] = {}
    heads = {id(m.weight) for m in model.modules() if isinstance(m, ParallelLMHead)}
    for module in model.modules():
        if isinstance(module, FusedMoE):
            for tensor in (module.w13, module.w2):
                shares[id(tensor)] = module.gate.top_k / module.num_experts
        elif type(module) is VocabParallelEmbedding and id(module.weight) not in heads:
            shares[id(module.weight)] = 1 / module.weight.shape[0]
        elif isinstance(module, RotaryEmbedding):
            shares[id(module.cos_sin_cache)] = 1 / module.cos_sin_cache.shape[0]
    return shares


def _active(model: nn.Module, tensors: list[torch.Tensor], size: bool) -> int:
    shares = _token_shares(model)
    return round(sum(t.numel() * (t.element_size() if size else 1) * shares.get(id(t), 1.0) for t in tensors))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of parameters and buffers (tied tensors once) that batch-1 decode reads every step:
    all but the experts a token is not routed to and the embedding rows of other tokens."""
    return _active(model, [*model.parameters(), *model.buffers()], size=True)


def num_parameters(model: nn.Module) -> int:
    """Elements of the parameters a token multiplies (routed experts: its ``k`` of ``E``; the input
    embedding: one row). A quantized model stores packed weights, so this undercounts its logical
    weights (e.g. two int4 values per int8 element)."""
    return _active(model, list(model.parameters()), size=False)
