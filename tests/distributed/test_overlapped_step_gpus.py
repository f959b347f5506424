"""Overlapped tensor-parallel steps on two real GPUs: the micro-batches' streams and the sums'
stream give the one-pass step's tokens and prompt logprobs (a missing stream wait or an early
reuse of a buffer shows up as different numbers)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from fastllm import LLM, SamplingParams
from fastllm.testing.models import save_tiny_checkpoint
from tests.conftest import TINY_LLAMA

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")

# wide enough that the all-reduces take NCCL's path at the step sizes below
SHAPE = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=1024)
PROMPTS = [[(7 * i + 3 * j) % 1000 + 5 for j in range(length)] for i, length in enumerate([90, 40, 130, 64, 77, 200])]


def _run(path: str, overlap_min_tokens: int) -> list:
    llm = LLM(path, tensor_parallel_size=2, dtype="float32", max_num_batched_tokens=256, enforce_eager=True,
              tp_overlap_min_tokens=overlap_min_tokens, num_gpu_blocks_override=64, block_size=16)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=16, prompt_logprobs=1)
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert all(o.error_code == 200 for o in outputs)
    return outputs


def test_overlapped_steps_match_one_pass(tmp_path):
    path = save_tiny_checkpoint(LlamaConfig(**{**TINY_LLAMA, **SHAPE}), str(tmp_path))
    one_pass, overlapped = _run(path, 0), _run(path, 64)
    for a, b in zip(overlapped, one_pass):
        assert a.outputs.token_ids == b.outputs.token_ids
        for got, want in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
            assert got == pytest.approx(want, abs=1e-3)
