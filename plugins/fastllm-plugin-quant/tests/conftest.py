"""Session fixtures: the embedded SmolLM2 and its unquantized perplexity, computed once."""

from __future__ import annotations

import pytest

from fastllm import LLM
from fastllm.model_loader.resolve import embedded_model_path

from quant_helpers import SMOLLM2_ARGS, chunk_nlls


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return embedded_model_path()


@pytest.fixture(scope="session")
def baseline_nlls(smollm2_path) -> list[float]:
    """The unquantized model's loss on every chunk, computed once for every comparison."""
    return chunk_nlls(LLM(smollm2_path, **SMOLLM2_ARGS))
