"""Bad input fails that request alone, with a clear error; the rest finish; no KV block leaks."""

from __future__ import annotations

import pytest

from fastllm import LLM, SamplingParams
from fastllm.registry import UnknownPluginError


def _all_blocks_free(llm: LLM) -> bool:
    kv = llm.engine.kv_cache
    return kv.num_free_blocks == kv.pool.num_usable_blocks and not llm.engine.requests


def test_bad_requests_fail_alone(smollm2_llm):
    llm = smollm2_llm
    too_long = "hello " * 2000
    prompts = ["The capital of France is", too_long, "", "Water boils at", "Count: 1, 2, 3,"]
    params = [
        SamplingParams(temperature=0, max_tokens=8),
        SamplingParams(temperature=0, max_tokens=8),
        SamplingParams(temperature=0, max_tokens=8),
        {"temperature": -1.0, "max_tokens": 8},
        {"temperature": 0, "max_tokens": 8, "top_p": 0.0},
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.error_code for o in outputs] == [200, 400, 400, 400, 400]
    assert "max_model_len" in outputs[1].error_msg
    assert "empty" in outputs[2].error_msg
    assert "temperature" in outputs[3].error_msg
    assert "top_p" in outputs[4].error_msg
    assert len(outputs[0].outputs.token_ids) == 8 and outputs[0].outputs.text
    assert _all_blocks_free(llm)


def test_bad_token_ids_and_stop_ids(smollm2_llm):
    bad = [[1, 2, 10**9], [1, -1], [1, True], [1, 2.0]]  # past the vocabulary, negative, not int
    outputs = smollm2_llm.generate(bad + [[504, 3575]], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    for output in outputs[:-1]:
        assert output.error_code == 400 and "token ids" in output.error_msg
    assert outputs[-1].error_code == 200
    assert _all_blocks_free(smollm2_llm)


def test_unknown_plugin_names_fail_at_start(smollm2_path):
    with pytest.raises(UnknownPluginError) as info:
        LLM(smollm2_path, attention_backend="no-such-backend", num_gpu_blocks_override=8)
    assert "torch" in str(info.value) and "fastllm" in str(info.value)
    with pytest.raises(UnknownPluginError):
        LLM(smollm2_path, quantization="no-such-quant", num_gpu_blocks_override=8)


def test_bad_engine_config_names_the_field(smollm2_path):
    with pytest.raises(ValueError, match="block_size"):
        LLM(smollm2_path, block_size=48)
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLM(smollm2_path, max_num_seqs=0)


def test_prompt_larger_than_the_whole_cache_fails_alone(tiny_llama_dir):
    """4 blocks of 16 hold 64 tokens: max_model_len is capped there, so nothing waits forever."""
    llm = LLM(tiny_llama_dir, load_format="dummy", max_model_len=256, block_size=16,
              num_gpu_blocks_override=4)
    assert llm.engine.max_model_len == 64
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    outputs = llm.generate([[5] * 100, [7] * 10], params, use_tqdm=False)
    assert outputs[0].error_code == 400 and "max_model_len" in outputs[0].error_msg
    assert outputs[1].error_code == 200 and len(outputs[1].outputs.token_ids) == 54
    assert outputs[1].outputs.finish_reason == "length"
    assert _all_blocks_free(llm)
