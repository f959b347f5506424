"""Tiny random checkpoints of the MoE-era architectures, built and saved by transformers itself."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)
ARCHITECTURES = {
    # dense, tied embeddings like ERNIE-4.5-0.3B
    "ernie4_5": dict(intermediate_size=96, tie_word_embeddings=True),
    # layer 0 dense (moe_layer_start_index=1), then 8 experts, top-2, one shared expert
    "ernie4_5_moe": dict(intermediate_size=96, moe_intermediate_size=32, moe_num_experts=8, moe_k=2,
                         moe_num_shared_experts=1, moe_layer_start_index=1, tie_word_embeddings=False),
    # layer 1 dense (mlp_only_layers)
    "qwen3_moe": dict(intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                      norm_topk_prob=True, mlp_only_layers=[1], tie_word_embeddings=False),
    "mixtral": dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False),
}


def _randomize(model: torch.nn.Module) -> None:
    """Weights larger than transformers' init, so routing and text depend on every tensor."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
            elif param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.15)


def save_tiny_checkpoint(model_type: str, folder: Path, **overrides) -> tuple[str, torch.nn.Module]:
    """Save a float32 random ``model_type`` (a key of ARCHITECTURES, its config changed by
    ``overrides``) as safetensors in ``folder``; returns the folder and transformers' model (the reference)."""
    config = AutoConfig.for_model(model_type, **COMMON, **{**ARCHITECTURES[model_type], **overrides})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _randomize(model)
    model.save_pretrained(folder)
    if model_type == "ernie4_5_moe":  # Baidu's checkpoints add multi-token-prediction layers
        save_file({"model.mtp_linear_proj.0.weight": torch.zeros(4, 4)}, Path(folder) / "mtp.safetensors")
    return str(folder), model
