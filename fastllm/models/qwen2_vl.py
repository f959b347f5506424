"""Qwen2-VL and Qwen2.5-VL: a Qwen2 language model with M-RoPE, fed by a ViT vision tower.

The runner asks ``encode_multimodal`` for an item's embeddings (once per item: it caches
them across the chunks of a chunked prefill) and passes the rows of the step that hold
placeholder tokens, with their M-RoPE positions, as ``multimodal``.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from fastllm.layers.rotary import MRotaryEmbedding
from fastllm.models.interface import rope_settings
from fastllm.models.qwen2 import Qwen2Attention, Qwen2DecoderLayer, Qwen2ForCausalLM
from fastllm.models.qwen2_vl_vision import VisionTransformer
from fastllm.multimodal.inputs import MultimodalItem, StepMultimodal

DEFAULT_MROPE_SECTION = [16, 24, 24]


def multimodal_forward(model: Any, input_ids: torch.Tensor, positions: torch.Tensor,
                       multimodal: Optional[StepMultimodal]) -> torch.Tensor:
    """The language model over one step; with ``multimodal``, the encoder's rows replace the
    placeholder tokens' embeddings and its M-RoPE positions replace ``positions``."""
    if multimodal is None:
        return model(input_ids, positions)
    embeds = model.embed_tokens(input_ids)
    if multimodal.rows.numel():
        embeds = embeds.index_put((multimodal.rows,), multimodal.embeds.to(embeds.dtype))
    return model(input_ids, multimodal.positions, inputs_embeds=embeds)


class Qwen2VLAttention(Qwen2Attention):
    def __init__(self, config: Any, layer_idx: int):
        super().__init__(config, layer_idx)
        base, scaling = rope_settings(config)
        sections = (scaling or {}).get("mrope_section", DEFAULT_MROPE_SECTION)
        self.rotary_emb = MRotaryEmbedding(self.head_dim, config.max_position_embeddings, base, sections)


class Qwen2VLDecoderLayer(Qwen2DecoderLayer):
    attention_cls = Qwen2VLAttention


class Qwen2VLForConditionalGeneration(Qwen2ForCausalLM):
    """Also Qwen2.5-VL: only its tower differs (windows, RMSNorm, gated MLP), as its config says."""

    layer_cls = Qwen2VLDecoderLayer
    # transformers 5 names first, then the names of checkpoints saved before it
    renames = (("model.language_model.", "model."), ("model.visual.", "visual."))

    def __init__(self, config: Any):
        text = getattr(config, "text_config", config)
        if getattr(config, "tie_word_embeddings", False):
            text.tie_word_embeddings = True
        super().__init__(text)
        self.visual = VisionTransformer(config.vision_config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                multimodal: Optional[StepMultimodal] = None) -> torch.Tensor:
        return multimodal_forward(self.model, input_ids, positions, multimodal)

    def encode_multimodal(self, item: MultimodalItem) -> torch.Tensor:
        """An image's or video's placeholder embeddings, ``[item.length, hidden]``."""
        weight = self.visual.patch_embed.proj.weight
        return self.visual(item.pixel_values.to(weight.device, weight.dtype), [item.grid_thw])

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights((self._rename(name), tensor) for name, tensor in weights)

    def _rename(self, name: str) -> str:
        for old, new in self.renames:
            if name.startswith(old):
                return new + name[len(old):]
        return name

    def checkpoint_target(self, name: str) -> tuple[str, object]:
        if name.startswith("visual."):  # the tower's gate/up projections stay separate
            return name, None
        return super().checkpoint_target(name)
