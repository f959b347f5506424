"""Mixtral: Mistral whose every feed-forward is 2 of 8 experts (softmax, top-k, renormalised)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from fastllm.layers.fused_moe import FusedMoE, TopKRouter, expert_checkpoint_target
from fastllm.models.llama import LlamaDecoderLayer, LlamaForCausalLM


class MixtralDecoderLayer(LlamaDecoderLayer):
    def build_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        router = TopKRouter(config.hidden_size, config.num_local_experts, config.num_experts_per_tok)
        return FusedMoE(router, config.intermediate_size)


class MixtralForCausalLM(LlamaForCausalLM):
    layer_cls = MixtralDecoderLayer
    # Mixtral's checkpoints name the MoE block and its experts' projections so (loader and export)
    checkpoint_renames = {".block_sparse_moe.": ".mlp."}
    expert_projections = ("w1", "w3", "w2")

    def checkpoint_target(self, name: str) -> tuple[str, object]:
        return expert_checkpoint_target(name, self.expert_projections) or super().checkpoint_target(name)
