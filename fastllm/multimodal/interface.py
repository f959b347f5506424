"""The contract of a multimodal processor plugin (``register_multimodal_processors``)."""

from __future__ import annotations

from typing import Any, Protocol

from fastllm.multimodal.inputs import MultimodalInputs


class MultimodalProcessor(Protocol):
    """Built as ``cls(hf_config, tokenizer, model_path)`` for the architecture it is registered under.

    The engine loads and checks the media first (decodable, non-empty, within the pixel and
    frame limits, at most ``limit_mm_per_prompt`` per modality); the processor runs the
    model's HF image/video processor, expands each placeholder token to the item's number of
    encoder outputs, and computes the prompt's rotary positions. Bad input raises
    ``fastllm.engine.input_processor.RequestError`` (or ``ValueError``), failing that request only.
    """

    modalities: tuple[str, ...]  # which of "image" / "video" the model takes

    def process(self, prompt_token_ids: list[int],
                media: dict[str, list[Any]]) -> tuple[list[int], MultimodalInputs]:
        """``media``: PIL images under ``"image"``, ``[T, H, W, 3]`` uint8 arrays under ``"video"``.
        Returns the expanded prompt and its multimodal inputs."""
        ...
