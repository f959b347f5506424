"""Qwen3-MoE (30B-A3B, 235B-A22B): Qwen3 whose feed-forward is k of many routed experts
(softmax, top-k, renormalised when ``norm_topk_prob``), except the ``mlp_only_layers``."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from fastllm.layers.fused_moe import FusedMoE, TopKRouter, expert_checkpoint_target
from fastllm.models.qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    def build_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        sparse = (layer_idx not in (config.mlp_only_layers or []) and config.num_experts > 0
                  and (layer_idx + 1) % config.decoder_sparse_step == 0)
        if not sparse:
            return super().build_mlp(config, layer_idx)
        router = TopKRouter(config.hidden_size, config.num_experts, config.num_experts_per_tok,
                            renormalize=config.norm_topk_prob)
        return FusedMoE(router, config.moe_intermediate_size)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    layer_cls = Qwen3MoeDecoderLayer

    def checkpoint_target(self, name: str) -> tuple[str, object]:
        return expert_checkpoint_target(name) or super().checkpoint_target(name)
