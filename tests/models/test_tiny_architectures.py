"""Each built-in dense architecture, on a tiny random checkpoint, greedy-equal to HF transformers
(through the conformance kit that plugin authors use for theirs)."""

from __future__ import annotations

import pytest
import transformers

from fastllm.testing.models import assert_greedy_matches_hf, save_tiny_checkpoint

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
CONFIGS = {
    "LlamaForCausalLM": lambda: transformers.LlamaConfig(**TINY, tie_word_embeddings=False),
    "Qwen2ForCausalLM": lambda: transformers.Qwen2Config(**TINY, tie_word_embeddings=True),
    "Qwen3ForCausalLM": lambda: transformers.Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=False),
}
PROMPTS = [[5, 17, 33, 9, 120, 7], [200, 3], list(range(10, 40))]


@pytest.mark.parametrize("architecture", sorted(CONFIGS))
def test_greedy_matches_hf(tmp_path, architecture):
    config = CONFIGS[architecture]()
    config.architectures = [architecture]
    save_tiny_checkpoint(config, str(tmp_path))
    llm = assert_greedy_matches_hf(str(tmp_path), PROMPTS, max_new_tokens=12, block_size=16,
                                   num_gpu_blocks_override=32, max_num_batched_tokens=16)
    assert llm.engine.kv_cache.num_free_blocks == llm.engine.kv_cache.pool.num_usable_blocks
