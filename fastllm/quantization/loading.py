"""Choosing the quantizer for an engine and loading weights through it.

The method comes from ``quantization=`` or, for pre-quantized checkpoints, from config.json's
``quantization_config``; asking for a different method than the checkpoint holds is an error.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch.nn as nn

from fastllm import registry
from fastllm.quantization.interface import PromptRunner, Quantizer
from fastllm.quantization.linear import CheckpointLayoutError

logger = logging.getLogger("fastllm")


def checkpoint_quantization(hf_config: Any) -> Optional[dict[str, Any]]:
    """config.json's ``quantization_config`` as a dict, or None for a float checkpoint."""
    config = getattr(hf_config, "quantization_config", None)
    if config is None:
        return None
    return dict(config) if isinstance(config, dict) else config.to_dict()


def build_quantizer(requested: Optional[str], hf_config: Any) -> Optional[Quantizer]:
    """The quantizer the engine should use, or None; raises on a conflicting request."""
    declared_config = checkpoint_quantization(hf_config)
    declared = declared_config.get("quant_method") if declared_config else None
    if declared is None:
        return registry.get("quantizers", requested)(None) if requested else None
    if declared not in registry.entries("quantizers"):
        raise ValueError(f"the checkpoint is quantized with {declared!r}, which no plugin registers; "
                         f"registered quantizers: {', '.join(registry.names('quantizers')) or '(none)'}")
    factory = registry.get("quantizers", declared)
    if requested and registry.get("quantizers", requested) is not factory:
        raise ValueError(f"the checkpoint is already quantized with {declared!r}; quantization="
                         f"{requested!r} cannot be applied on top of it (leave quantization unset)")
    return factory(declared_config)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters, tied ones counted once."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def load_weights(loader: Any, model_path: str, model: nn.Module, quantizer: Optional[Quantizer],
                 lm_head: bool = False, run_prompts: Optional[PromptRunner] = None) -> None:
    """Fill ``model`` from ``model_path`` and quantize it (``lm_head``: its LM head too, by the
    registered ``lm_head_quantizers`` plugin; ``run_prompts``: the runner's, for a method's
    ``online_calibration``); logs weight bytes before and after."""
    before = weight_bytes(model)
    if quantizer is not None:
        quantizer.prepare_model(model)
    try:
        loader.load_weights(model_path, model)
    except (KeyError, RuntimeError, ValueError) as exc:
        if quantizer is None or not quantizer.prequantized or isinstance(exc, CheckpointLayoutError):
            raise
        raise CheckpointLayoutError(f"the checkpoint's tensors do not match its declared quantization "
                                    f"{quantizer.name!r}: {exc}") from exc
    if quantizer is not None:
        calibrate = quantizer.online_calibration(model, run_prompts) if run_prompts is not None else None
        quantizer.quantize_model(model, calibrate)
    head = registry.only("lm_head_quantizers", "quantize_lm_head") if lm_head else None
    if head is not None:
        head.factory(model)
    applied = "+".join(([quantizer.name] if quantizer is not None else []) + ([f"lm_head_{head.name}"] if head else []))
    if not applied:
        logger.info("weight bytes: %d (%.1f MiB, unquantized)", before, before / 2**20)
        return
    after = weight_bytes(model)
    logger.info("weight bytes before quantization: %d (%.1f MiB), after %s: %d (%.1f MiB, %.3fx)",
                before, before / 2**20, applied, after, after / 2**20, after / before)
