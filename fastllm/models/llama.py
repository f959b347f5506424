"""Llama (Llama 2/3.x, SmolLM2, Mistral-style) written on fastllm's parallel layers."""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.nn as nn

from fastllm.distributed.parallel_state import (all_reduce, is_first_stage, is_last_stage,
                                                receive_from_previous_stage, send_to_next_stage, settled,
                                                stage_layers, tp_size)
from fastllm.layers.activation import SiluAndMul
from fastllm.layers.attention import Attention
from fastllm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from fastllm.layers.layernorm import RMSNorm
from fastllm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from fastllm.layers.pipeline import OtherStage, on_this_stage
from fastllm.layers.rotary import RotaryEmbedding, Rotation
from fastllm.models.interface import rope_settings


class LlamaAttention(nn.Module):
    """Returns this rank's partial sum of ``o_proj``: the post-attention norm sums it over the ranks."""

    qkv_bias = False
    qk_norm = False

    def __init__(self, config: Any, layer_idx: int):
        super().__init__()
        hidden = config.hidden_size
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // heads
        bias = getattr(config, "attention_bias", False) or self.qkv_bias
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, heads, kv_heads, bias=bias)
        self.o_proj = RowParallelLinear(heads * self.head_dim, hidden,
                                        bias=getattr(config, "attention_bias", False), reduce_results=False)
        self.num_heads, self.num_kv_heads = heads // tp_size(), kv_heads // tp_size()
        base, scaling = rope_settings(config)
        self.rotary_emb = RotaryEmbedding(self.head_dim, config.max_position_embeddings, base, scaling)
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.attn = Attention(layer_idx, self.num_heads, self.head_dim, self.num_kv_heads,
                              self.head_dim ** -0.5)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.unflatten(-1, (self.num_heads, self.head_dim))
        k = k.unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        norms = (self.q_norm, self.k_norm) if self.qk_norm else None  # applied with the rotation
        return self.o_proj(self.attn(q, k, v, Rotation(positions, self.rotary_emb, norms)))


class LlamaMLP(nn.Module):
    """``reduce_results=False``: returns this rank's partial sum, for the next norm to sum."""

    def __init__(self, config: Any, intermediate_size: int | None = None, reduce_results: bool = True):
        super().__init__()
        intermediate_size = intermediate_size or config.intermediate_size
        self.reduce_results = reduce_results
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [intermediate_size] * 2)
        self.down_proj = RowParallelLinear(intermediate_size, config.hidden_size, reduce_results=reduce_results)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    attention_cls = LlamaAttention

    def __init__(self, config: Any, layer_idx: int):
        super().__init__()
        self.self_attn = self.attention_cls(config, layer_idx)
        self.mlp = self.build_mlp(config, layer_idx)
        # a dense MLP leaves its sum over the tensor-parallel ranks to the next norm (LlamaModel marks it)
        self.leaves_sum = not getattr(self.mlp, "reduce_results", True)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, sums_partials=True)

    def build_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        """The feed-forward block of layer ``layer_idx``: dense here, MoE in sparse models."""
        return LlamaMLP(config, reduce_results=False)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None):
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    """Under pipeline parallelism, this stage's layers; the embedding on the first stage (and on
    the last, when the LM head shares it), the final norm on the last."""

    def __init__(self, config: Any, layer_cls: type[LlamaDecoderLayer]):
        super().__init__()
        self.hidden_size, self.dtype = config.hidden_size, torch.get_default_dtype()  # built in the model's dtype
        self.stage = stage_layers(config.num_hidden_layers)
        tied = getattr(config, "tie_word_embeddings", False)
        self.embed_tokens = (VocabParallelEmbedding(config.vocab_size, config.hidden_size)
                             if is_first_stage() or (tied and is_last_stage()) else OtherStage())
        self.layers = nn.ModuleList(layer_cls(config, i) if i in self.stage else OtherStage()
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps) if is_last_stage() else OtherStage()
        for before, after in zip(self.stage, self.stage[1:]):
            self.layers[after].input_layernorm.sums_partials = self.layers[before].leaves_sum
        self.last_leaves_sum = self.layers[self.stage[-1]].leaves_sum
        # an MoE block may leave the sum of each token's expert rows to the norm after it, on this stage
        for index in self.stage if is_last_stage() else self.stage[:-1]:
            mlp = self.layers[index].mlp
            if hasattr(mlp, "leaves_pair_sum"):
                mlp.leaves_pair_sum = True
        if is_last_stage():
            self.norm.sums_partials = self.last_leaves_sum
        # every block leaves its sum to the next norm, on one stage: the large steps' norms may work
        # on each rank's rows only (``platforms.copy_engine_sums``); an MoE block sums whole rows
        self.sequence_parallel = is_first_stage() and is_last_stage() and all(
            self.layers[index].leaves_sum for index in self.stage)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """The final hidden states on the last stage; on another, what it sent the next one.
        ``inputs_embeds``: the first stage's input when a multimodal model embedded it."""
        if is_first_stage():
            hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
            residual = None
        else:
            hidden, residual = receive_from_previous_stage(2, (input_ids.shape[0], self.hidden_size),
                                                           self.dtype, input_ids.device)
        for index in self.stage:
            hidden, residual = self.layers[index](positions, hidden, residual)
        if not is_last_stage():
            send_to_next_stage(all_reduce(hidden) if self.last_leaves_sum else hidden, residual)
            return hidden
        hidden, _ = self.norm(hidden, residual)
        return settled(hidden)


class LlamaForCausalLM(nn.Module):
    layer_cls = LlamaDecoderLayer
    # HF checkpoint name fragment -> (fused parameter fragment, shard id)
    stacked_params = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }
    # checkpoint name fragment -> this model's, where its checkpoints name a module otherwise;
    # the loader reads them and the quantized export writes them back
    checkpoint_renames: dict[str, str] = {}

    def __init__(self, config: Any):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, self.layer_cls)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size) if is_last_stage() else OtherStage()
        if getattr(config, "tie_word_embeddings", False) and is_last_stage():
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def compute_greedy(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy tokens and their logprobs without the full logits (``ParallelLMHead.greedy``)."""
        return self.lm_head.greedy(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            for theirs, ours in self.checkpoint_renames.items():
                name = name.replace(theirs, ours)
            target, shard_id = self.checkpoint_target(name)
            if not on_this_stage(self, target):
                continue
            if target not in params:
                if name == "lm_head.weight" and getattr(self.config, "tie_word_embeddings", False):
                    continue
                raise KeyError(f"checkpoint tensor {name!r} has no parameter in {type(self).__name__}")
            param = params[target]
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                param.data.copy_(tensor)
            else:
                loader(param, tensor, shard_id)
            loaded.add(target)
        return loaded

    def checkpoint_target(self, name: str) -> tuple[str, object]:
        """The parameter an HF tensor loads into, and the shard id its ``weight_loader`` takes."""
        for fragment, (fused, shard_id) in self.stacked_params.items():
            if f".{fragment}." in name:
                return name.replace(f".{fragment}.", f".{fused}."), shard_id
        return name, None
