"""ERNIE-4.5 MoE (21B-A3B, 300B-A47B): ERNIE-4.5 whose sparse layers route each token to k of
the experts (picked by softmax plus a score-correction bias) beside always-on shared experts;
the layers outside ``moe_layer_start_index..moe_layer_end_index`` (every
``moe_layer_interval``-th inside it is sparse) stay dense."""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.nn as nn

from fastllm.layers.fused_moe import FusedMoE, TopKRouter, expert_checkpoint_target
from fastllm.models.ernie4_5 import Ernie4_5ForCausalLM
from fastllm.models.llama import LlamaDecoderLayer, LlamaMLP


def is_sparse_layer(config: Any, layer_idx: int) -> bool:
    end = config.moe_layer_end_index
    end = config.num_hidden_layers - 1 if end in (None, -1) else end
    return ((layer_idx + 1) % config.moe_layer_interval == 0
            and config.moe_layer_start_index <= layer_idx <= end)


class Ernie4_5_MoeDecoderLayer(LlamaDecoderLayer):
    def build_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        if not is_sparse_layer(config, layer_idx):
            return super().build_mlp(config, layer_idx)
        router = TopKRouter(config.hidden_size, config.moe_num_experts, config.moe_k,
                            score_correction_bias=True, norm_min=config.moe_norm_min, float32_logits=True)
        shared = config.moe_num_shared_experts
        shared_experts = LlamaMLP(config, config.moe_intermediate_size * shared) if shared else None
        return FusedMoE(router, config.moe_intermediate_size, shared_experts)


class Ernie4_5_MoeForCausalLM(Ernie4_5ForCausalLM):
    layer_cls = Ernie4_5_MoeDecoderLayer
    # ERNIE checkpoints keep the router's bias in mlp.moe_statics (loader and export)
    checkpoint_renames = {".mlp.moe_statics.e_score_correction_bias": ".mlp.gate.e_score_correction_bias"}

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # Baidu's checkpoints carry multi-token-prediction layers (mtp_*) for speculative
        # decoding; like transformers, the model leaves them out
        return super().load_weights((name, tensor) for name, tensor in weights if ".mtp_" not in name)

    def checkpoint_target(self, name: str) -> tuple[str, object]:
        name = name.replace(".mlp.gate.moe_statics.", ".mlp.gate.")  # transformers 5's in-memory name
        return expert_checkpoint_target(name) or super().checkpoint_target(name)
