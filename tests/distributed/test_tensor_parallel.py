"""Tensor parallelism over gloo on the CPU: TP=N gives TP=1's greedy tokens, and workers come and go.

Every test shuts its tensor-parallel LLM down: the layers shard over torch.distributed's
default group, which must be gone before another engine is built in this process.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal

import pytest
import torch.distributed as dist

from fastllm import LLM, SamplingParams
from fastllm.executor import WorkerError
from fastllm.bench.model_size import local_model, num_parameters
from tests.conftest import TINY_LLAMA, logprob_tolerance, needs_ranks

TINY_PROMPTS = [[5, 17, 42, 99, 3], [7, 8, 9], list(range(10, 50))]
SMOL_PROMPTS = ["The capital of France is", "def fibonacci(n):"]
LOGPROB_TOLERANCE = logprob_tolerance(rel=1e-4, abs=1e-4)  # two H200s: a cumulative logprob 2.7e-5 apart, relatively


def _tiny(path: str, tp: int, **kwargs) -> LLM:
    # 16-token steps chunk the 40-token prompt, so steps mix prefill chunks with decodes
    return LLM(path, load_format="dummy", tensor_parallel_size=tp, num_gpu_blocks_override=32, block_size=16,
               max_num_batched_tokens=16, **kwargs)


def _generate(llm: LLM, prompts: list, params: SamplingParams) -> list:
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert all(o.error_code == 200 for o in outputs), [o.error_msg for o in outputs]
    return outputs


def assert_same_outputs(actual: list, expected: list) -> None:
    """Same greedy tokens; logprobs equal up to the order of the ranks' float sums."""
    for a, e in zip(actual, expected):
        assert a.outputs.token_ids == e.outputs.token_ids
        assert a.outputs.cumulative_logprob == pytest.approx(e.outputs.cumulative_logprob, **LOGPROB_TOLERANCE)
        assert a.prompt_logprobs[1:] == [pytest.approx(step, **LOGPROB_TOLERANCE) for step in e.prompt_logprobs[1:]]


def _workers(llm: LLM) -> list[multiprocessing.Process]:
    return list(llm.engine.runner.workers.procs)


@needs_ranks(2)
def test_tp2_matches_tp1_on_tiny_llama(tiny_llama_dir):
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, prompt_logprobs=2)
    prompts = [{"prompt_token_ids": p} for p in TINY_PROMPTS]
    single = _tiny(tiny_llama_dir, 1)
    expected = _generate(single, prompts, params)
    whole, _ = local_model(single)
    del single
    llm = _tiny(tiny_llama_dir, 2, async_scheduling=True)  # sampled tokens reach the worker by broadcast
    try:
        actual = _generate(llm, prompts, params)
        shard, gpus = local_model(llm)  # what the benchmarks' roofline and MFU count per GPU
    finally:
        llm.shutdown()
    assert_same_outputs(actual, expected)
    # counted once a rank: the norms, and the one embedding row a token reads (from each rank's shard)
    extra = sum(p.numel() for name, p in whole.named_parameters() if "norm" in name) + TINY_LLAMA["hidden_size"]
    assert gpus == 2 and gpus * num_parameters(shard) - num_parameters(whole) == extra


@needs_ranks(2)
@pytest.mark.parametrize("triton_ops", ["0", "1"])  # torch's reduction, then the kernels' (interpreted)
def test_tp2_greedy_rows_reduce_vocabulary_shards_in_place(tmp_path, monkeypatch, triton_ops):
    """Plain greedy steps skip the logits' all-gather: each rank sends its shard's max, token and
    log-sum-exp; tokens and logprobs still equal TP=1's. A vocabulary of 255 leaves a padding
    column in rank 1's shard, which must never win; a row with ``min_tokens`` takes the logits."""
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, "vocab_size": 255}))
    plain = SamplingParams(temperature=0.0, max_tokens=12)
    edited = SamplingParams(temperature=0.0, max_tokens=12, min_tokens=4)
    prompts = [{"prompt_token_ids": p} for p in TINY_PROMPTS]
    # both engines take the same ops (the workers inherit it): on CUDA the kernels' float32 GEMMs
    # may round otherwise than torch's, so TP=1 must not be the other kind of reference
    monkeypatch.setenv("FASTLLM_TRITON_OPS", triton_ops)
    single = _tiny(str(tmp_path), 1)
    expected = _generate(single, prompts, plain) + _generate(single, prompts[:1], edited)
    del single
    llm = _tiny(str(tmp_path), 2)
    driver, calls = llm.engine.runner.runner, []
    reduce_in_place = driver.compute_greedy
    driver.compute_greedy = lambda *args: calls.append(1) or reduce_in_place(*args)
    try:
        plain_steps = _generate(llm, prompts, plain)
        in_place = len(calls)
        actual = plain_steps + _generate(llm, prompts[:1], edited)
    finally:
        llm.shutdown()
    assert in_place > 0 and len(calls) == in_place  # the min_tokens request's steps all took the logits
    for a, e in zip(actual, expected):
        assert a.outputs.token_ids == e.outputs.token_ids
        assert a.outputs.cumulative_logprob == pytest.approx(e.outputs.cumulative_logprob, **LOGPROB_TOLERANCE)


@needs_ranks(2)
def test_tp2_int4_calibrates_on_every_rank(tiny_llama_dir):
    """Online int4 runs the load-time random-token calibration on every rank (its collectives
    must pair up, or start-up hangs) and each rank fits its own shards. Quantizing shards is not
    bit-identical to quantizing whole layers (measured 3e-3 apart here), so close, not equal."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=2)
    prompts = [{"prompt_token_ids": p} for p in TINY_PROMPTS]
    single = _tiny(tiny_llama_dir, 1, quantization="weight_only_int4")
    expected = _generate(single, prompts, params)
    del single
    llm = _tiny(tiny_llama_dir, 2, quantization="weight_only_int4")
    try:
        actual = _generate(llm, prompts, params)
    finally:
        llm.shutdown()
    for prompt, a, e in zip(TINY_PROMPTS, actual, expected):
        scored = list(zip(prompt[1:], a.prompt_logprobs[1:], e.prompt_logprobs[1:]))
        assert [got[token] for token, got, _ in scored] == pytest.approx([want[token] for token, _, want in scored],
                                                                         abs=2e-2)


def assert_smollm2_matches(smollm2_path: str, smollm2_llm: LLM, **parallel) -> None:
    """The embedded model split as ``parallel`` says greedily writes what one process writes."""
    params = SamplingParams(temperature=0.0, max_tokens=10)
    expected = [o.outputs.token_ids for o in _generate(smollm2_llm, SMOL_PROMPTS, params)]
    llm = LLM(smollm2_path, max_model_len=1024, num_gpu_blocks_override=128, **parallel)
    try:
        actual = [o.outputs.token_ids for o in _generate(llm, SMOL_PROMPTS, params)]
    finally:
        llm.shutdown()
    assert actual == expected


def assert_start_fails(match: str, build) -> None:
    """``build()`` raises ValueError matching ``match`` and leaves no process or group behind."""
    with pytest.raises(ValueError, match=match):
        build()
    assert not multiprocessing.active_children()
    assert not dist.is_initialized()


@needs_ranks(3)
def test_tp3_matches_tp1_on_smollm2(smollm2_path, smollm2_llm):
    assert_smollm2_matches(smollm2_path, smollm2_llm, tensor_parallel_size=3)


@needs_ranks(3)
def test_heads_not_divisible_fails_at_start(tiny_llama_dir):
    assert_start_fails("4 attention heads cannot be split over tensor_parallel_size=3",
                       lambda: _tiny(tiny_llama_dir, 3))


@needs_ranks(2)
def test_failed_start_leaves_no_workers(tmp_path):
    # heads split, but every rank's down projection refuses 129 input features, after spawning
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, "intermediate_size": 129}))
    with pytest.raises(ValueError, match="129 input features cannot be split"):
        _tiny(str(tmp_path), 2)
    assert not multiprocessing.active_children()
    assert not dist.is_initialized()


@needs_ranks(2)
def test_workers_exit_when_llm_is_deleted(tiny_llama_dir):
    llm = _tiny(tiny_llama_dir, 2)
    workers = _workers(llm)
    assert all(w.is_alive() for w in workers)
    del llm
    gc.collect()
    for worker in workers:
        worker.join(timeout=10)
        assert worker.exitcode == 0
    assert not dist.is_initialized()


@needs_ranks(2)
def test_worker_crash_raises_instead_of_hanging(tiny_llama_dir):
    llm = _tiny(tiny_llama_dir, 2)
    try:
        worker = _workers(llm)[0]
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(timeout=10)
        # the code is -9, or None when another part of the test process (an asyncio child
        # watcher left by the server tests) reaped the worker first; the point is no hang
        with pytest.raises(WorkerError, match=f"{worker.name} exited with code (-9|None)"):
            llm.generate([{"prompt_token_ids": TINY_PROMPTS[0]}], SamplingParams(max_tokens=4), use_tqdm=False)
    finally:
        llm.shutdown()
    assert not dist.is_initialized()
