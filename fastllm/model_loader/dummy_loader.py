"""Random weights from a config alone: benchmarks of big models on machines with no checkpoints.

``model`` may be a directory holding config.json, a .json file, or the name of a
config bundled in ``fastllm/configs`` (``llama-3-8b``, ``qwen2.5-7b``, ``qwen3-8b``, ...).
"""

from __future__ import annotations

import json
import os
import zlib
from importlib import resources
from typing import Any, Optional

import torch
import torch.nn as nn
from transformers import AutoConfig, AutoTokenizer

from fastllm.distributed.parallel_state import tp_size
from fastllm.layers.embedding import VocabParallelEmbedding
from fastllm.layers.linear import LinearBase, MergedColumnParallelLinear, QKVParallelLinear


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
        """Small uniform values: realistic speed, finite activations, meaningless text.

        The values do not depend on ``tensor_parallel_size``: each checkpoint-shaped tensor is
        drawn whole from a seed of its parameter name and handed to the parameter's own
        ``weight_loader``, which keeps this rank's slice, so TP=N runs the TP=1 model.
        """
        seen: set[int] = set()
        for prefix, owner in module.named_modules():
            for local, param in owner.named_parameters(recurse=False):
                if id(param) in seen:
                    continue  # tied weights load once
                seen.add(id(param))
                name = f"{prefix}.{local}" if prefix else local
                loader = getattr(param, "weight_loader", None)
                for shard_id, shape in checkpoint_shapes(owner, param):
                    full = _uniform(shape, param, f"{name}/{shard_id}")
                    if name.endswith("norm.weight"):
                        full.add_(1.0)
                    if loader is None:
                        param.data.copy_(full)
                    else:
                        loader(param, full, shard_id)


def checkpoint_shapes(owner: nn.Module, param: nn.Parameter) -> list[tuple[object, tuple[int, ...]]]:
    """``(shard_id, unsharded shape)`` of each checkpoint tensor that ``param`` of ``owner`` loads;
    a layer with its own layout (``FusedMoE``) says so through a ``checkpoint_shapes`` method."""
    if hasattr(owner, "checkpoint_shapes"):
        return owner.checkpoint_shapes(param)
    world = tp_size()
    rest = tuple(param.shape[1:])
    if isinstance(owner, QKVParallelLinear):
        q, kv = owner.num_heads * owner.head_dim * world, owner.num_kv_heads * owner.head_dim * world
        return [("q", (q, *rest)), ("k", (kv, *rest)), ("v", (kv, *rest))]
    if isinstance(owner, MergedColumnParallelLinear):
        return [(i, (size, *rest)) for i, size in enumerate(owner.output_sizes)]
    if isinstance(owner, VocabParallelEmbedding):
        return [(None, (owner.vocab_size, *rest))]
    shape = list(param.shape)
    if isinstance(owner, LinearBase) and owner.tp_dim is not None and owner.tp_dim < param.dim():
        shape[owner.tp_dim] *= world
    return [(None, tuple(shape))]


def _uniform(shape: tuple[int, ...], like: nn.Parameter, key: str) -> torch.Tensor:
    generator = torch.Generator(device=like.device).manual_seed(zlib.crc32(key.encode()))
    full = torch.empty(shape, dtype=like.dtype, device=like.device)
    return full.uniform_(-1e-2, 1e-2, generator=generator)
