"""Merging an adapter into base weights for good (``W += scaling * B @ A``): into a loaded model
(``merge_lora=`` / ``--merge-lora``), or offline between checkpoints (``fastllm merge-lora``)."""

from __future__ import annotations

import argparse
import glob
import logging
import os
import shutil
import sys

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from fastllm.distributed.parallel_state import tp_rank
from fastllm.engine.input_processor import RequestError
from fastllm.layers.linear import LinearBase
from fastllm_lora.checkpoint import ModuleDelta, read_adapter
from fastllm_lora.targets import projection_shapes, projections, shard_slices

logger = logging.getLogger("fastllm")
NO_RANK_LIMIT = sys.maxsize


def _delta(delta: ModuleDelta, dtype: torch.dtype) -> torch.Tensor:
    return (delta.scaling * (delta.b.double() @ delta.a.double())).to(dtype)


def merge_into_model(model: nn.Module, path: str) -> None:
    targets = projections(model)
    adapter = read_adapter(path, NO_RANK_LIMIT, projection_shapes(model))
    for name, delta in adapter.modules.items():
        layer_name, shard = targets[name]
        layer = model.get_submodule(layer_name)
        if not isinstance(layer, LinearBase):
            raise ValueError("merge_lora needs float weights: merge first (fastllm merge-lora), then quantize")
        offset, size = shard_slices(layer)[shard]
        weight = layer.weight.data[offset:offset + size]
        whole = _delta(delta, torch.float64)  # this rank's part of it, under tensor parallelism
        if layer.tp_dim == 0:
            whole = whole.narrow(0, tp_rank() * size, size)
        elif layer.tp_dim == 1:
            whole = whole.narrow(1, tp_rank() * layer.input_size, layer.input_size)
        weight += whole.to(weight.device).to(weight.dtype)


def merge_checkpoint(base: str, adapter_path: str, out: str) -> int:
    """Write ``out``: ``base`` (an HF safetensors directory) with the adapter merged; other files copied."""
    files = sorted(glob.glob(os.path.join(base, "*.safetensors")))
    if not files:
        raise ValueError(f"{base!r} holds no .safetensors weights (merge-lora reads HF safetensors directories)")
    checkpoints = {file: load_file(file) for file in files}
    where = {name[:-len(".weight")]: file for file, tensors in checkpoints.items() for name, tensor in tensors.items()
             if name.endswith(".weight") and tensor.dim() == 2}
    shapes = {name: tuple(checkpoints[file][name + ".weight"].shape[::-1]) for name, file in where.items()}
    adapter = read_adapter(adapter_path, NO_RANK_LIMIT, shapes)
    for name, delta in adapter.modules.items():
        weight = checkpoints[where[name]][name + ".weight"]
        checkpoints[where[name]][name + ".weight"] = (weight.double() + _delta(delta, torch.float64)).to(weight.dtype)
    os.makedirs(out, exist_ok=True)
    for entry in os.listdir(base):
        source = os.path.join(base, entry)
        if os.path.isfile(source) and not entry.endswith(".safetensors"):
            shutil.copy2(source, os.path.join(out, entry))
    for file, tensors in checkpoints.items():
        save_file({name: t.contiguous() for name, t in tensors.items()}, os.path.join(out, os.path.basename(file)),
                  metadata={"format": "pt"})
    return len(adapter.modules)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("merge-lora", help="merge a PEFT LoRA adapter into a model's weights")
    parser.add_argument("-i", "--input", required=True, help="base model: an HF safetensors directory")
    parser.add_argument("-a", "--adapter", required=True, help="PEFT adapter directory")
    parser.add_argument("-o", "--output", required=True, help="directory for the merged model")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        merged = merge_checkpoint(args.input, args.adapter, args.output)
    except (RequestError, ValueError) as exc:
        raise SystemExit(f"fastllm merge-lora: {exc}") from None
    logger.info("merged %d projections of %s into %s", merged, args.adapter, args.output)
    return 0
