"""ERNIE-4.5-VL (28B-A3B, 424B-A47B): ERNIE-4.5 MoE whose sparse layers hold two expert sets,
text experts for text tokens and vision experts for image tokens (and their start/end
markers), beside shared experts every token runs; 3-D rotary positions; fed by a ViT and a
resampler.

Checkpoints keep Baidu's layout: ``mlp.experts.{0..E-1}`` are the text experts and
``{E..2E-1}`` the vision ones, ``mlp.gate.weight`` / ``mlp.gate.weight_1`` the two routers
(transposed), and ``mlp.moe_statics.e_score_correction_bias`` their two bias rows.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Iterator, Optional

import torch
import torch.nn as nn

from fastllm.layers.fused_moe import FusedMoE, TopKRouter, expert_checkpoint_target
from fastllm.layers.rotary import MRotaryEmbedding
from fastllm.models.ernie4_5 import Ernie4_5ForCausalLM
from fastllm.models.ernie4_5_vl_vision import ErnieVisionTransformer, VariableResolutionResampler
from fastllm.models.interface import rope_settings
from fastllm.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP
from fastllm.models.qwen2_vl import multimodal_forward
from fastllm.multimodal.inputs import MultimodalItem, StepMultimodal

DEFAULT_SECTIONS = [22, 22, 20]


class Ernie3DRotaryEmbedding(MRotaryEmbedding):
    """ERNIE's 3-D rotary: of the first ``h + w`` frequencies the even ones turn by the height
    position and the odd ones by the width, the last ``t`` by time (transformers'
    ``recomposition_frequencies``, on pair-to-half reordered heads)."""

    def __init__(self, head_dim: int, max_position: int, base: float, sections: list[int]):
        super().__init__(head_dim, max_position, base, sections)
        spatial = sections[0] + sections[1]
        axis = torch.tensor([1 + j % 2 if j < spatial else 0 for j in range(head_dim // 2)])
        self.axis_of_column = torch.cat([axis, axis])


class Ernie4_5_VLAttention(LlamaAttention):
    def __init__(self, config: Any, layer_idx: int):
        super().__init__(config, layer_idx)
        base, scaling = rope_settings(config)
        sections = (scaling or {}).get("mrope_section", DEFAULT_SECTIONS)
        self.rotary_emb = Ernie3DRotaryEmbedding(self.head_dim, config.max_position_embeddings, base, sections)


def _experts(config: Any, intermediate_size: int) -> FusedMoE:
    router = TopKRouter(config.hidden_size, config.moe_num_experts, config.moe_k, score_correction_bias=True,
                        norm_min=config.moe_norm_min, float32_logits=True)
    return FusedMoE(router, intermediate_size)


class ModalityMoE(nn.Module):
    """Text tokens route among the text experts, vision tokens among the vision experts; the
    shared experts run on every token. ``vision`` (set per step by the model) marks the
    vision tokens; None: all text (decodes, text-only prompts)."""

    def __init__(self, config: Any):
        super().__init__()
        text_size, vision_size = config.moe_intermediate_size
        self.text_moe, self.vision_moe = _experts(config, text_size), _experts(config, vision_size)
        shared = config.moe_num_shared_experts
        self.shared_experts = LlamaMLP(config, text_size * shared) if shared else None
        self.vision: Optional[torch.Tensor] = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        vision = self.vision
        if vision is None:
            out = self.text_moe(hidden)
        else:
            out = torch.empty_like(hidden)
            out[~vision] = self.text_moe(hidden[~vision])
            out[vision] = self.vision_moe(hidden[vision])
        return out if self.shared_experts is None else out + self.shared_experts(hidden)


class Ernie4_5_VLDecoderLayer(LlamaDecoderLayer):
    attention_cls = Ernie4_5_VLAttention

    def build_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        if config.mlp_layer_types[layer_idx] == "sparse":
            return ModalityMoE(config)
        return super().build_mlp(config, layer_idx)


class Ernie4_5_VLMoeForConditionalGeneration(Ernie4_5ForCausalLM):
    layer_cls = Ernie4_5_VLDecoderLayer

    def __init__(self, config: Any):
        text = config.text_config
        if getattr(config, "tie_word_embeddings", False):
            text.tie_word_embeddings = True
        super().__init__(text)
        self.num_experts = text.moe_num_experts
        self.vision_model = ErnieVisionTransformer(config.vision_config)
        self.resampler_model = VariableResolutionResampler(config)
        self.register_buffer("vision_token_ids", torch.tensor([
            config.image_token_id, config.image_start_token_id, config.image_end_token_id,
            config.video_token_id, config.video_start_token_id, config.video_end_token_id]), persistent=False)
        self._sparse = [m for m in self.modules() if isinstance(m, ModalityMoE)]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                multimodal: Optional[StepMultimodal] = None) -> torch.Tensor:
        vision = None
        if multimodal is not None:  # a step with prompt tokens of a multimodal prompt
            vision = torch.isin(input_ids, self.vision_token_ids)
        for block in self._sparse:
            block.vision = vision
        return multimodal_forward(self.model, input_ids, positions, multimodal)

    def encode_multimodal(self, item: MultimodalItem) -> torch.Tensor:
        """An image's placeholder embeddings, ``[item.length, hidden]``."""
        weight = self.vision_model.patch_embed.proj.weight
        features = self.vision_model(item.pixel_values.to(weight.device, weight.dtype), [item.grid_thw])
        return self.resampler_model(features, item.grid_thw)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(pair for name, tensor in weights for pair in self._split(name, tensor))

    def _split(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """Baidu's names -> this model's: the vision side drops ``model.``, the experts, routers
        and bias rows go to their modality's ``FusedMoE``."""
        name = re.sub(r"^model\.(vision_model|resampler_model)\.", r"\1.", name)
        if name.endswith(".mlp.moe_statics.e_score_correction_bias"):
            prefix = name[:-len("moe_statics.e_score_correction_bias")]
            yield prefix + "text_moe.gate.e_score_correction_bias", tensor[0]
            yield prefix + "vision_moe.gate.e_score_correction_bias", tensor[1]
            return
        router = re.search(r"\.mlp\.gate\.weight(_1)?$", name)
        if router:
            yield f"{name[:router.start()]}.mlp.{'vision' if router[1] else 'text'}_moe.gate.weight", tensor.t()
            return
        expert = re.search(r"\.mlp\.experts\.(\d+)\.", name)
        if expert:
            index = int(expert[1])
            moe, index = ("vision_moe", index - self.num_experts) if index >= self.num_experts else ("text_moe", index)
            name = f"{name[:expert.start()]}.mlp.{moe}.experts.{index}.{name[expert.end():]}"
        yield name, tensor

    def checkpoint_target(self, name: str) -> tuple[str, object]:
        if name.startswith(("vision_model.", "resampler_model.")):
            return name, None
        return expert_checkpoint_target(name) or super().checkpoint_target(name)
