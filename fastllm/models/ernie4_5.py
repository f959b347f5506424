"""ERNIE-4.5 (dense): Llama whose rotary turns interleaved pairs of each head's dimensions.

fastllm's rotary (and its fused kernel) turns the two halves of a head, NeoX style. Loading
reorders each query and key head's rows from pairs ``(0, 1), (2, 3), ...`` to halves
``[0, 2, 4, ... | 1, 3, 5, ...]``: half-rotation of the reordered vectors is ERNIE's pair
rotation of the originals, and attention scores do not change when query and key are
permuted alike.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import torch

from fastllm.models.llama import LlamaForCausalLM


def pairs_to_halves(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows ``[heads * head_dim, ...]`` reordered head by head from interleaved pairs to halves."""
    return weight.unflatten(0, (-1, head_dim // 2, 2)).transpose(1, 2).flatten(0, 2)


def halves_to_pairs(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``pairs_to_halves``' inverse: the checkpoint's row order, for export."""
    return weight.unflatten(0, (-1, 2, head_dim // 2)).transpose(1, 2).flatten(0, 2)


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    def __init__(self, config: Any):
        if getattr(config, "use_bias", False):
            raise ValueError("ERNIE-4.5 with use_bias=true is not supported (no published checkpoint has it)")
        super().__init__(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        head_dim = self.model.layers[0].self_attn.head_dim
        return super().load_weights(
            (name, pairs_to_halves(tensor, head_dim) if self._rotated(name, tensor) else tensor)
            for name, tensor in weights)

    def to_checkpoint_layout(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """An exported tensor in the checkpoint's row order (``fastllm.quantization.export``)."""
        head_dim = self.model.layers[0].self_attn.head_dim
        return halves_to_pairs(tensor, head_dim) if self._rotated(name, tensor) else tensor

    def _rotated(self, name: str, tensor: torch.Tensor) -> bool:
        """A query or key tensor whose rows are output features: the weight, and a quantized
        format's per-row scales, zeros or packed codes."""
        heads = {"q_proj": self.config.num_attention_heads, "k_proj": self.config.num_key_value_heads}
        match = re.search(r"\.self_attn\.([qk]_proj)\.", name)
        head_dim = self.model.layers[0].self_attn.head_dim
        return match is not None and tensor.dim() > 0 and tensor.shape[0] == heads[match[1]] * head_dim
