"""The plugin checks itself with fastllm's conformance kit, as any third-party plugin can."""

from __future__ import annotations

from transformers import LlamaConfig, LlamaForCausalLM

from fastllm.testing.models import assert_greedy_matches_hf, save_tiny_checkpoint
from fastllm_plugin_example.model import SoftCapLlamaForCausalLM


def test_greedy_matches_hf_llama(tmp_path):
    """Soft-capping is monotone, so the greedy tokens are plain Llama's: HF's LlamaForCausalLM on
    the same weights is the reference."""
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         architectures=["SoftCapLlamaForCausalLM"])
    save_tiny_checkpoint(config, str(tmp_path))
    built = SoftCapLlamaForCausalLM.instances
    assert_greedy_matches_hf(str(tmp_path), [[5, 6, 7, 8], [90, 3]], max_new_tokens=8,
                             hf_model=LlamaForCausalLM.from_pretrained(tmp_path).eval(),
                             block_size=16, num_gpu_blocks_override=16)
    assert SoftCapLlamaForCausalLM.instances == built + 1, "the plugin's class must serve the checkpoint"
