"""Overlapped tensor-parallel steps on two real GPUs: with the micro-batches' streams and the
copy-engine sums, greedy tokens equal transformers' (a missing stream wait, a barrier short or a
buffer reused early shows up as other tokens)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from fastllm import LLM, SamplingParams
from fastllm.platforms.copy_engine_sums import CopyEngineSums
from fastllm.testing.models import save_tiny_checkpoint
from tests.conftest import TINY_LLAMA, hf_greedy
from tests.models.tiny_checkpoints import save_tiny_checkpoint as save_tiny_moe

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")

# the long prompts' first step cuts into micro-batches of 2,600 and 1,496 tokens, the short ones'
# into two of 400: every layer's two sums of each travel by copy engine, in alternating buffers
SHAPE = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=1024, max_position_embeddings=2048)
LENGTHS = [900, 400, 1300, 640, 770, 200]
PROMPTS = [[(7 * i + 3 * j) % 1000 + 5 for j in range(length)] for i, length in enumerate(LENGTHS + [100] * 8)]


@pytest.fixture(autouse=True)
def exchanges(monkeypatch) -> list[int]:
    """Rank 0's copy-engine sums (its runner is in this process): none would mean one-pass steps."""
    calls, exchange = [], CopyEngineSums.exchange
    monkeypatch.setattr(CopyEngineSums, "exchange", lambda self, *args: calls.append(1) or exchange(self, *args))
    yield calls
    assert calls, "no step ran overlapped with copy-engine sums"


def _greedy(path: str, batches: list[list[list[int]]], ignore_eos: bool, **kwargs) -> list[list[int]]:
    """Each batch in one ``generate`` of one engine: the copy-engine buffers serve step after step."""
    llm = LLM(path, tensor_parallel_size=2, dtype="float32", enforce_eager=True, tp_overlap_min_tokens=64,
              num_gpu_blocks_override=400, block_size=16, **kwargs)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=ignore_eos)
        return [output.outputs.token_ids for batch in batches
                for output in llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)]
    finally:
        llm.shutdown()


def test_overlapped_steps_match_transformers(tmp_path):
    path = save_tiny_checkpoint(LlamaConfig(**{**TINY_LLAMA, **SHAPE}), str(tmp_path))
    actual = _greedy(path, [PROMPTS[:len(LENGTHS)], PROMPTS[len(LENGTHS):]], True, max_num_batched_tokens=4096)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert actual == [hf_greedy(hf, p, 16) for p in PROMPTS]


def test_overlapped_moe_steps_match_transformers(tmp_path):
    """ERNIE-4.5-MoE: the shared experts' and the routed experts' sums (``all_reduce``) by copy engine too."""
    path, hf = save_tiny_moe("ernie4_5_moe", tmp_path)
    prompts = [[(5 * i + 3 * j) % 250 + 3 for j in range(length)] for i, length in enumerate([90, 70, 120, 40])]
    assert _greedy(path, [prompts], False) == [hf_greedy(hf, p, 16) for p in prompts]
