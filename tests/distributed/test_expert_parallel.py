"""Expert parallelism over gloo: each of two ranks holds half the experts whole, and greedy
decoding equals transformers' on the same tiny MoE checkpoint (as TP=1 and TP=2 do), whether
the routed experts' parts are all-reduced or every step goes through the all-to-all."""

from __future__ import annotations

import pytest

import fastllm.layers.fused_moe as fused_moe
from fastllm import LLM, SamplingParams
from fastllm.layers.fused_moe import FusedMoE
from tests.conftest import hf_greedy, needs_ranks
from tests.models.test_moe_equivalence import MAX_NEW, PROMPTS, _greedy, _tokens
from tests.models.tiny_checkpoints import ARCHITECTURES, save_tiny_checkpoint


@pytest.mark.parametrize("model_type,all_to_all", [("ernie4_5_moe", False),  # routed and shared experts
                                                    ("ernie4_5_moe", True), ("qwen3_moe", True)])
@needs_ranks(2)
def test_expert_parallel_2_matches_hf(model_type, all_to_all, tmp_path, monkeypatch):
    dispatches = []
    if all_to_all:  # every step, decode included (read on the driver, handed to the workers)
        monkeypatch.setenv("FASTLLM_EP_ALL_TO_ALL_MIN_TOKENS", "0")
        dispatch = fused_moe.dispatch_combine
        monkeypatch.setattr(fused_moe, "dispatch_combine",
                            lambda *args: dispatches.append(1) or dispatch(*args))  # counted on rank 0
    folder, model = save_tiny_checkpoint(model_type, tmp_path)
    expected = [hf_greedy(model, p, MAX_NEW) for p in PROMPTS]
    llm = LLM(folder, dtype="float32", tensor_parallel_size=2, enable_expert_parallel=True,
              num_gpu_blocks_override=64, block_size=16, max_num_batched_tokens=16)
    try:
        layers = [m for m in llm.engine.runner.runner.model.modules() if isinstance(m, FusedMoE)]
        experts = ARCHITECTURES[model_type].get("num_experts") or ARCHITECTURES[model_type]["moe_num_experts"]
        moe_size = ARCHITECTURES[model_type]["moe_intermediate_size"]
        assert layers and all(m.expert_ids == list(range(experts // 2)) for m in layers)  # rank 0's half
        assert all(m.w13.shape[:2] == (experts // 2, 2 * moe_size) for m in layers)  # whole, not sliced
        assert _tokens(_greedy(llm, PROMPTS)) == expected
        assert bool(dispatches) == all_to_all
    finally:
        llm.shutdown()



@needs_ranks(2)
@pytest.mark.parametrize("padded", [False, True])
def test_data_parallel_attention_with_experts_over_the_replicas_matches_hf(padded, tmp_path):
    """Two one-rank replicas, each with its own requests and KV cache, hold half the experts each:
    every MoE layer gathers both replicas' tokens. Prompts of other lengths and output budgets
    leave one replica idle while the other decodes (it keeps step with a one-token pass).
    ``padded`` (an attention backend graphs could capture): decode steps pad to a common bucket (the
    CUDA-graph path, run eagerly) and steps overlap (tests/distributed/test_replica_step.py checks
    that path step by step)."""
    folder, model = save_tiny_checkpoint("qwen3_moe", tmp_path)
    budgets = [MAX_NEW, 3, MAX_NEW, 6]
    expected = [hf_greedy(model, p, n) for p, n in zip(PROMPTS, budgets)]
    extra = {}
    if padded:
        extra = dict(attention_backend="triton", async_scheduling=True)
    llm = LLM(folder, dtype="float32", data_parallel_size=2, enable_expert_parallel=True,
              num_gpu_blocks_override=64, block_size=16, max_num_batched_tokens=16, **extra)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                               [SamplingParams(temperature=0.0, max_tokens=n) for n in budgets], use_tqdm=False)
        assert llm.engine.runner.expert_ranks == 2  # each replica's layers hold half the experts
        assert [len(r.owned) for r in llm.engine.replicas] == [0, 0]
        assert _tokens(outputs) == expected
    finally:
        llm.shutdown()


def test_data_parallel_experts_need_one_gpu_replicas(tmp_path):
    folder, _ = save_tiny_checkpoint("qwen3_moe", tmp_path)
    with pytest.raises(ValueError, match="tensor_parallel_size=1"):
        LLM(folder, dtype="float32", data_parallel_size=2, tensor_parallel_size=2, enable_expert_parallel=True)
