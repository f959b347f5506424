"""The engine loop's own timings: one inter-token gap per generated token after the first."""

from __future__ import annotations

from fastllm import LLM
from fastllm.bench.datasets import random_requests
from fastllm.bench.timed_run import run_timed


def test_run_timed_stamps_every_token(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", max_model_len=256, block_size=16,
              num_gpu_blocks_override=64, max_num_seqs=2)
    requests = random_requests(3, 8, 5, vocab_size=256, range_ratio=0.5, seed=1)
    results = run_timed(llm.engine, requests)
    for request, result in zip(requests, results):
        assert result.ok and result.prompt_tokens == len(request.prompt_token_ids)
        assert result.output_tokens == request.output_len and len(result.itl) == request.output_len - 1
        assert 0 < result.ttft < result.latency and all(gap > 0 for gap in result.itl)
        assert sum(result.itl) <= result.latency - result.ttft + 0.05
    again = run_timed(llm.engine, requests)  # request ids are free again once a run has finished
    assert [r.output_tokens for r in again] == [r.output_len for r in requests]
