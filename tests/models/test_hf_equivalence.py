"""Greedy output of fastllm equals HF transformers' greedy output, token for token, on SmolLM2.

The same batch is also forced through chunked prefill, preemption and prefix-cache hits:
none of them may change a single token.
"""

from __future__ import annotations

import pytest

from fastllm import LLM, SamplingParams
from tests.conftest import hf_greedy

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is the boiling point of water in Celsius?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village at the edge of a dark forest, there lived an old "
    "woodcutter who had three sons. The eldest was strong, the second was clever, and the youngest",
    "List three primary colors:",
    "1, 2, 3, 4, 5,",
    "Translate to French: Good morning, how are you today?",
    "import numpy as np\nimport torch\n\nclass Attention(torch.nn.Module):\n    def __init__(self",
]
MAX_NEW = 24


@pytest.fixture(scope="module")
def reference(hf_smollm2):
    model, tokenizer = hf_smollm2
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    return ids, [hf_greedy(model, p, MAX_NEW) for p in ids]


def _greedy(llm: LLM, prompt_ids: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
    assert all(o.error_code == 200 for o in outputs), [o.error_msg for o in outputs]
    return [o.outputs.token_ids for o in outputs]


def _assert_same(actual: list[list[int]], expected: list[list[int]]) -> None:
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a == e, f"prompt {i} ({PROMPTS[i][:30]!r}) diverged: {a} vs HF {e}"


def test_greedy_matches_hf(smollm2_llm, reference):
    ids, expected = reference
    _assert_same(_greedy(smollm2_llm, ids), expected)


def test_chunked_prefill_matches_hf(smollm2_path, reference):
    ids, expected = reference
    llm = LLM(smollm2_path, max_model_len=512, max_num_batched_tokens=16, num_gpu_blocks_override=64,
              block_size=16)
    _assert_same(_greedy(llm, ids), expected)
    assert llm.engine.kv_cache.num_free_blocks == llm.engine.kv_cache.pool.num_usable_blocks


def test_preemption_matches_hf(smollm2_path, reference):
    ids, expected = reference
    llm = LLM(smollm2_path, max_model_len=512, num_gpu_blocks_override=10, block_size=16, kv_cache_ratio=1.0)
    _assert_same(_greedy(llm, ids), expected)
    assert llm.engine.scheduler.num_preemptions > 0, "the tiny KV pool should have forced preemption"
    assert llm.engine.kv_cache.num_free_blocks == llm.engine.kv_cache.pool.num_usable_blocks


def test_prefix_cache_hits_match_hf(smollm2_path, hf_smollm2):
    model, tokenizer = hf_smollm2
    shared = ("You are a careful assistant. Answer briefly and precisely. Here is some background: the "
              "Eiffel Tower is in Paris, the Colosseum is in Rome and the Acropolis is in Athens. ")
    prompts = [shared + q for q in ("Where is the Colosseum?", "Where is the Eiffel Tower?", "Name a city.")]
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    expected = [hf_greedy(model, p, MAX_NEW) for p in ids]
    llm = LLM(smollm2_path, max_model_len=512, num_gpu_blocks_override=64, block_size=16,
              enable_prefix_caching=True)
    first = llm.generate([{"prompt_token_ids": ids[0]}], SamplingParams(temperature=0, max_tokens=MAX_NEW),
                         use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    rest = llm.generate([{"prompt_token_ids": p} for p in ids], SamplingParams(temperature=0, max_tokens=MAX_NEW),
                        use_tqdm=False)
    assert all(o.num_cached_tokens >= 16 for o in rest), [o.num_cached_tokens for o in rest]
    assert rest[0].num_cached_tokens >= (len(ids[0]) - 1) // 16 * 16
    _assert_same([first.outputs.token_ids], expected[:1])
    _assert_same([o.outputs.token_ids for o in rest], expected)
