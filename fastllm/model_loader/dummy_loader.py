"""Random weights from a config alone: benchmarks of big models on machines with no checkpoints.

``model`` may be a directory holding config.json, a .json file, or the name of a
config bundled in ``fastllm/configs`` (``llama-3-8b``, ``qwen2.5-7b``, ``qwen3-8b``, ...).
"""

from __future__ import annotations

import json
import os
from importlib import resources
from typing import Any, Optional

import torch
import torch.nn as nn
from transformers import AutoConfig, AutoTokenizer


def bundled_configs() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("fastllm.configs").iterdir() if p.name.endswith(".json"))


def _config_dict(model: str) -> dict[str, Any]:
    if os.path.isdir(model):
        model = os.path.join(model, "config.json")
    elif not os.path.exists(model):
        bundled = resources.files("fastllm.configs").joinpath(f"{model}.json")
        if not bundled.is_file():
            raise FileNotFoundError(f"{model!r} is neither a config path nor a bundled config "
                                    f"({', '.join(bundled_configs())})")
        return json.loads(bundled.read_text())
    with open(model) as f:
        return json.load(f)


class DummyLoader:
    def load_config(self, model: str) -> Any:
        data = _config_dict(model)
        return AutoConfig.for_model(data.pop("model_type"), **data)

    def load_tokenizer(self, model: str, tokenizer: Optional[str]) -> Any:
        if tokenizer:
            return AutoTokenizer.from_pretrained(tokenizer)
        if os.path.isdir(model) and os.path.exists(os.path.join(model, "tokenizer.json")):
            return AutoTokenizer.from_pretrained(model)
        return None

    def load_weights(self, model: str, module: nn.Module) -> None:
        """Small uniform values: realistic speed, finite activations, meaningless text."""
        generators: dict[torch.device, torch.Generator] = {}
        for name, param in module.named_parameters():
            if param.device not in generators:
                generators[param.device] = torch.Generator(device=param.device).manual_seed(0)
            param.data.uniform_(-1e-2, 1e-2, generator=generators[param.device])
            if name.endswith("norm.weight"):
                param.data.add_(1.0)
