"""Llama, Qwen2 and Qwen3 written in fastllm equal HF transformers' own implementations:
random small checkpoints saved by HF as safetensors, greedy-decoded by both."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from fastllm import LLM, SamplingParams

COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
ARCHS = {
    "llama": dict(rope_theta=10000.0),
    "qwen2": dict(rope_theta=1000000.0),
    "qwen3": dict(rope_theta=1000000.0, head_dim=32),
}
PROMPTS = [[5, 17, 99, 3, 250, 7], [11] * 3, list(range(20, 60))]


@pytest.mark.parametrize("model_type", list(ARCHS))
def test_greedy_matches_hf_implementation(tmp_path, model_type):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **COMMON, **ARCHS[model_type])
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.2)
    hf.save_pretrained(tmp_path)
    expected = []
    with torch.inference_mode():
        for ids in PROMPTS:
            out = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
            expected.append(out[0, len(ids):].tolist())
    llm = LLM(str(tmp_path), num_gpu_blocks_override=32, block_size=16)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                           SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    assert [o.outputs.token_ids for o in outputs] == expected
