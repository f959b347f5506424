"""A request's processed images and videos: pixel patches, placeholder spans, M-RoPE positions."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MultimodalItem:
    """One image or video after the HF processor, and the placeholder tokens it fills."""

    modality: str  # "image" or "video"
    pixel_values: torch.Tensor  # the processor's flattened patches of this item
    grid_thw: tuple[int, int, int]  # patches along time, height and width, before merging
    offset: int  # first placeholder token in the prompt
    length: int  # placeholder tokens (the encoder's output rows)
    content_hash: bytes  # of the pixels: prefix-cache blocks over the item are keyed by it
    extra: tuple[float, ...] = ()  # per-item model inputs besides pixels (video seconds per grid step)

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class MultimodalInputs:
    """What the engine carries for a multimodal prompt.

    ``positions`` are the model's rotary positions of the prompt tokens (``[3, P]`` for
    M-RoPE); a token past the prompt at index ``i`` sits at ``i + position_delta``.
    """

    items: tuple[MultimodalItem, ...]
    positions: torch.Tensor
    position_delta: int

    def items_in(self, start: int, end: int) -> list[MultimodalItem]:
        """The items whose placeholder tokens overlap prompt tokens ``[start, end)``."""
        return [item for item in self.items if item.offset < end and item.end > start]

    def block_key(self, start: int, end: int) -> bytes:
        """What a KV block over tokens ``[start, end)`` adds to its token hash: the content
        hashes of the items it covers, so equal placeholder tokens of different images differ."""
        return b"".join(item.content_hash for item in self.items_in(start, end))


@dataclass(frozen=True)
class StepMultimodal:
    """What a multimodal model gets beside one step's token ids: the M-RoPE positions of every
    token of the step ``[3, T]``, and the rows whose embeddings the vision encoder supplies."""

    positions: torch.Tensor
    rows: torch.Tensor
    embeds: torch.Tensor
