"""Expert parallelism over gloo: each of two ranks holds half the experts whole, and greedy
decoding equals transformers' on the same tiny MoE checkpoint (as TP=1 and TP=2 do)."""

from __future__ import annotations

import pytest

from fastllm import LLM
from fastllm.layers.fused_moe import FusedMoE
from tests.conftest import hf_greedy
from tests.models.test_moe_equivalence import MAX_NEW, PROMPTS, _greedy, _tokens
from tests.models.tiny_checkpoints import ARCHITECTURES, save_tiny_checkpoint


@pytest.mark.parametrize("model_type", ["ernie4_5_moe"])  # routed and shared experts
def test_expert_parallel_2_matches_hf(model_type, tmp_path):
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
    finally:
        llm.shutdown()

