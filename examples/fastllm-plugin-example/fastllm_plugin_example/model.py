"""A Llama variant with Gemma-2-style soft-capped logits, to show a model plugin end to end."""

from __future__ import annotations

from typing import Any

import torch

from fastllm.models.llama import LlamaForCausalLM


class SoftCapLlamaForCausalLM(LlamaForCausalLM):
    """Logits pass through ``cap * tanh(logits / cap)``; ``instances`` lets tests see it was built."""

    instances = 0

    def __init__(self, config: Any):
        super().__init__(config)
        self.cap = float(getattr(config, "final_logit_softcapping", None) or 30.0)
        type(self).instances += 1

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        return self.cap * torch.tanh(logits / self.cap)
