"""The contract every model plugin follows; the runner knows models only through it."""

from __future__ import annotations

from typing import Any, Iterable, Protocol

import torch


class CausalLM(Protocol):
    """Built as ``cls(hf_config)`` on the target device and dtype; weights arrive later."""

    config: Any
    """The HF config it was built from (quantizers' calibration reads its vocabulary size)."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Packed tokens ``[T]`` and their positions ``[T]`` -> hidden states ``[T, hidden]``."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[N, hidden]`` -> float logits ``[N, vocab]``."""
        ...

    # Optional: ``compute_greedy(hidden) -> (tokens, logprobs)``, each row's argmax and its logprob
    # without the full logits; where a model has it, tensor-parallel greedy steps use it.

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Consume HF-named tensors; return the names of the parameters that were filled."""
        ...


def promote_text_config(config: Any) -> None:
    """A vision-language config keeps its language model's sizes in ``text_config``: copy the
    ones the engine reads (vocabulary, context length, end-of-sequence id) to the top."""
    text = getattr(config, "text_config", None)
    for key in ("vocab_size", "max_position_embeddings", "eos_token_id"):
        if text is not None and getattr(config, key, None) is None and getattr(text, key, None) is not None:
            setattr(config, key, getattr(text, key))


def rope_settings(config: Any) -> tuple[float, dict[str, Any] | None]:
    """(base, scaling) from either transformers 4 (rope_theta) or 5 (rope_parameters) configs."""
    params = getattr(config, "rope_parameters", None) or {}
    base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    scaling = getattr(config, "rope_scaling", None) or params or None
    return float(base), scaling
