"""HF model directories: config.json, one or many *.safetensors shards, tokenizer files."""

from __future__ import annotations

import glob
import os
from typing import Any, Iterator, Optional

import torch
import torch.nn as nn
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer


def iter_safetensors(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    for path in files:
        with safe_open(path, framework="pt") as shard:
            for name in shard.keys():
                yield name, shard.get_tensor(name)


class SafetensorsLoader:
    def load_config(self, model: str) -> Any:
        return AutoConfig.from_pretrained(model)

    def load_tokenizer(self, model: str, tokenizer: Optional[str]) -> Any:
        """The tokenizer beside the weights; None for a weights-only directory."""
        source = tokenizer or model
        if not tokenizer and not glob.glob(os.path.join(model, "tokenizer*")):
            return None
        return AutoTokenizer.from_pretrained(source)

    def load_weights(self, model: str, module: nn.Module) -> None:
        module.load_weights(iter_safetensors(model))
