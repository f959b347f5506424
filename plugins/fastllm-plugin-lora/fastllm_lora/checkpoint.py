"""Reads and checks a PEFT LoRA adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``).

Every way an adapter can be unusable (no such file, not LoRA, rank over the limit, a module the
model does not have, a shape that does not fit) is a ``RequestError``: only the request that
named it fails.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import torch
from safetensors.torch import load_file

from fastllm.engine.input_processor import RequestError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.default)?\.weight$")


@dataclass
class ModuleDelta:
    """``delta W = scaling * B @ A`` for one of the model's projections (PEFT's name)."""

    a: torch.Tensor  # [rank, input]
    b: torch.Tensor  # [output, rank]
    scaling: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass
class LoRAAdapter:
    modules: dict[str, ModuleDelta]  # PEFT module name (``model.layers.0.self_attn.q_proj``) -> delta


def _scaling(config: dict, module: str, rank: int) -> float:
    """``lora_alpha / r``, or ``/ sqrt(r)`` for rsLoRA; PEFT's alpha_pattern may override alpha."""
    alpha = config.get("lora_alpha", 8)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.search(rf"(^|\.){re.escape(pattern)}$", module) or re.fullmatch(pattern, module):
            alpha = value
    return alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)


def read_adapter(path: str, max_rank: int, shapes: dict[str, tuple[int, int]]) -> LoRAAdapter:
    """Load and check an adapter against ``shapes``: PEFT module name -> (input, output) features."""
    config_path, weights_path = os.path.join(path, CONFIG_FILE), os.path.join(path, WEIGHTS_FILE)
    for needed in (config_path, weights_path):
        if not os.path.isfile(needed):
            raise RequestError(f"LoRA adapter at {path!r}: {os.path.basename(needed)} not found")
    try:
        with open(config_path) as f:
            config = json.load(f)
        tensors = load_file(weights_path)
    except (OSError, ValueError) as exc:
        raise RequestError(f"LoRA adapter at {path!r} cannot be read: {exc}") from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise RequestError(f"adapter at {path!r} is {config.get('peft_type')}, not LORA")
    if config.get("use_dora") or config.get("bias", "none") != "none" or config.get("modules_to_save"):
        raise RequestError(f"LoRA adapter at {path!r} uses DoRA, biases or modules_to_save, which are not served")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise RequestError(f"LoRA adapter at {path!r}: unexpected tensor {key!r}")
        pairs.setdefault(match["module"], {})[match["which"]] = tensor
    modules = {}
    for module, pair in pairs.items():
        if module not in shapes:
            raise RequestError(f"LoRA adapter at {path!r}: unknown target module {module!r} "
                               f"(served: q/k/v/o and gate/up/down projections)")
        if set(pair) != {"A", "B"}:
            raise RequestError(f"LoRA adapter at {path!r}: {module} lacks lora_A or lora_B")
        a, b = pair["A"], pair["B"]
        rank, (inputs, outputs) = a.shape[0], shapes[module]
        if rank > max_rank:
            raise RequestError(f"LoRA adapter at {path!r}: rank {rank} of {module} exceeds max_lora_rank={max_rank}")
        if a.shape != (rank, inputs) or b.shape != (outputs, rank):
            raise RequestError(f"LoRA adapter at {path!r}: {module} has A {tuple(a.shape)} and B {tuple(b.shape)}, "
                               f"expected ({rank}, {inputs}) and ({outputs}, {rank})")
        modules[module] = ModuleDelta(a, b, _scaling(config, module, rank))
    if not modules:
        raise RequestError(f"LoRA adapter at {path!r} holds no LoRA weights")
    return LoRAAdapter(modules)
