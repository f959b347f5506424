"""What a weight format plugin provides: the HF config, the tokenizer, and the weights."""

from __future__ import annotations

from typing import Any, Optional, Protocol

import torch.nn as nn


class ModelLoader(Protocol):
    """Built with no arguments; ``model`` is whatever the user passed as ``LLM(model=...)``."""

    def load_config(self, model: str) -> Any:
        """A transformers ``PretrainedConfig`` (``architectures`` names the model plugin)."""
        ...

    def load_tokenizer(self, model: str, tokenizer: Optional[str]) -> Optional[Any]:
        """A transformers tokenizer, or None where the format carries none (dummy weights)."""
        ...

    def load_weights(self, model: str, module: nn.Module) -> None:
        """Fill every parameter of ``module`` (through its ``load_weights``)."""
        ...
