"""Random PEFT-format LoRA adapters for a model's projections, written as PEFT writes them."""

from __future__ import annotations

import contextlib
import os

import torch
from peft import LoraConfig
from safetensors.torch import save_file

# name -> (rank, targets, alpha, rsLoRA): different ranks, target sets and scalings.
ADAPTERS = {
    "qv8": (8, ["q_proj", "v_proj"], 16, False),
    "all16": (16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 32, True),
    "mlp4": (4, ["o_proj", "gate_proj", "up_proj", "down_proj"], 8, False),
}
PROJECTIONS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
               "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def projection_shapes(hf_config) -> dict[str, tuple[int, int]]:
    """(input, output) features of each HF projection."""
    hidden, inter = hf_config.hidden_size, hf_config.intermediate_size
    head_dim = getattr(hf_config, "head_dim", None) or hidden // hf_config.num_attention_heads
    q, kv = hf_config.num_attention_heads * head_dim, hf_config.num_key_value_heads * head_dim
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def write_adapter(path: str, hf_config, rank: int, targets: list[str], seed: int, alpha: float = 16,
                  use_rslora: bool = False, strength: float = 1.0, layers: int | None = None) -> str:
    """A random adapter on ``targets`` of every layer (or the first ``layers``); ``strength``
    sizes its change to the outputs."""
    generator = torch.Generator().manual_seed(seed)
    shapes = projection_shapes(hf_config)
    tensors = {}
    for layer in range(layers or hf_config.num_hidden_layers):
        for name in targets:
            inputs, outputs = shapes[name]
            prefix = f"base_model.model.model.layers.{layer}.{PROJECTIONS[name]}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, inputs, generator=generator) / inputs ** 0.5
            tensors[f"{prefix}.lora_B.weight"] = (torch.randn(outputs, rank, generator=generator)
                                                  * strength / (alpha / rank) / rank ** 0.5)
    os.makedirs(path, exist_ok=True)
    LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, use_rslora=use_rslora,
               task_type="CAUSAL_LM").save_pretrained(path)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    return path


def peft_greedy(model, adapter: str | None, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """PEFT's greedy tokens with ``adapter`` active, or the base model's for None."""
    if adapter is not None:
        model.set_adapter(adapter)
    with torch.inference_mode(), (model.disable_adapter() if adapter is None else contextlib.nullcontext()):
        out = model.generate(input_ids=torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=2)
    return out[0, len(prompt_ids):].tolist()
