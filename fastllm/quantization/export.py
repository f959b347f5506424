"""Write a quantized model as an HF-style directory that ``LLM(model=...)`` loads with no flag.

Tensors keep HF names: fused layers (``qkv_proj``, ``gate_up_proj``) are split back into the
checkpoint shards they were loaded from, through the model's ``stacked_params`` and each
layer's ``shard_slices``, and MoE layers' stacked experts into one tensor per expert and
projection, so the saved tensors go through the same loaders as any checkpoint. A model whose
checkpoints name things otherwise declares it once for its loader and this export alike
(``checkpoint_renames``, ``expert_projections``: Mixtral's ``block_sparse_moe.experts.{e}.w1``).
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import torch
import torch.nn as nn
from safetensors.torch import save_file

from fastllm.distributed.parallel_state import tp_size
from fastllm.layers.fused_moe import EXPERT_PROJECTIONS, FusedMoE
from fastllm.layers.linear import LinearBase
from fastllm.quantization.interface import Quantizer
from fastllm.quantization.linear import QuantizedLinear

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def checkpoint_tensors(model: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """HF-named CPU tensors of ``model``; float tensors in ``dtype``, integer and fp8 ones as they are."""
    if tp_size() > 1:
        raise ValueError("export the model from a single process (tensor_parallel_size=1)")
    hf_names = {(fused, shard): name for name, (fused, shard) in getattr(model, "stacked_params", {}).items()}
    modules = dict(model.named_modules())
    projections = getattr(model, "expert_projections", EXPERT_PROJECTIONS)  # a model's own expert names
    tensors: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        owner_name, _, leaf = name.rpartition(".")
        owner = modules[owner_name]
        if isinstance(owner, FusedMoE):  # stacked experts: one HF tensor per expert and projection
            tensors.update(owner.checkpoint_tensors(owner_name, leaf, projections))
            continue
        if not isinstance(owner, (LinearBase, QuantizedLinear)):
            tensors[name] = param.data
            continue
        slices = owner.shard_slices if isinstance(owner, QuantizedLinear) else owner.shard_slices()
        layout = owner.layouts[leaf] if isinstance(owner, QuantizedLinear) else "output"
        parent, _, fused = owner_name.rpartition(".")
        for shard_id, (offset, size) in slices.items():
            shard_name = fused if shard_id is None else hf_names[(fused, shard_id)]
            part = param.data if layout == "input" else param.data.narrow(0, offset, size)
            tensors[f"{parent}.{shard_name}.{leaf}"] = part
    layout = getattr(model, "to_checkpoint_layout", lambda name, tensor: tensor)  # rows a model reordered on load
    return {_checkpoint_name(model, name): layout(name, t.to(dtype) if t.dtype in FLOAT_DTYPES else t)
            .detach().cpu().clone() for name, t in tensors.items()}


def _checkpoint_name(model: nn.Module, name: str) -> str:
    """``name`` as the model's checkpoints spell it: its ``checkpoint_renames`` undone (Mixtral's
    ``.mlp.`` -> ``.block_sparse_moe.``)."""
    for theirs, ours in getattr(model, "checkpoint_renames", {}).items():
        name = name.replace(ours, theirs)
    return name


def save_quantized(model: nn.Module, hf_config: Any, tokenizer: Optional[Any], quantizer: Quantizer,
                   output_dir: str, dtype: torch.dtype) -> None:
    """model.safetensors, config.json (with ``quantization_config``) and the tokenizer files."""
    os.makedirs(output_dir, exist_ok=True)
    save_file(checkpoint_tensors(model, dtype), os.path.join(output_dir, "model.safetensors"),
              metadata={"format": "pt"})
    config = hf_config.to_dict()
    config["quantization_config"] = quantizer.checkpoint_config_to_save()
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    config.pop("dtype", None)
    with open(os.path.join(output_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
