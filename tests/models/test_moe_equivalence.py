"""ERNIE-4.5 (dense and MoE), Qwen3-MoE and Mixtral: greedy output equal to HF transformers', token
for token, on tiny random checkpoints that transformers itself builds and saves as safetensors.

Each architecture also runs through chunked prefill, preemption and prefix-cache hits in one
engine, and the MoE ones at tensor_parallel_size=2 over gloo: none of them may change a token.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from fastllm import LLM, SamplingParams
from fastllm.model_loader.dummy_loader import DummyLoader
from fastllm.registry import registry
from tests.conftest import hf_greedy, needs_ranks
from tests.models.tiny_checkpoints import ARCHITECTURES, COMMON, save_tiny_checkpoint

SHARED = list(range(100, 140))  # a 40-token prefix: two full 16-token blocks for the prefix cache
PROMPTS = [[5, 17, 42, 99, 3], SHARED + [7, 8, 9], SHARED + list(range(200, 215)), [11] * 20]
MAX_NEW = 16


MOE = [name for name in ARCHITECTURES if name != "ernie4_5"]  # dense ERNIE's attention is ERNIE-MoE's


@pytest.fixture(scope="module")
def checkpoint(request, tmp_path_factory):
    """(directory, HF greedy tokens of PROMPTS) for one architecture."""
    folder, model = save_tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    return folder, [hf_greedy(model, p, MAX_NEW) for p in PROMPTS]


def _greedy(llm: LLM, prompts: list[list[int]]):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert all(o.error_code == 200 for o in outputs), [o.error_msg for o in outputs]
    return outputs


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs.token_ids for o in outputs]


@pytest.mark.parametrize("checkpoint", list(ARCHITECTURES), indirect=True)
def test_greedy_matches_hf(checkpoint):
    folder, expected = checkpoint
    llm = LLM(folder, dtype="float32", num_gpu_blocks_override=64, block_size=16)
    assert _tokens(_greedy(llm, PROMPTS)) == expected


@pytest.mark.parametrize("checkpoint", ["qwen3_moe"], indirect=True)
def test_triton_attention_backend_matches_hf(checkpoint):
    """The triton backend runs Qwen3's query and key head norms inside its rotary cache write."""
    folder, expected = checkpoint
    llm = LLM(folder, dtype="float32", num_gpu_blocks_override=64, block_size=16, attention_backend="triton")
    assert _tokens(_greedy(llm, PROMPTS)) == expected


def test_triton_kernels_leave_expert_sums_to_the_norms_and_match_hf(tmp_path, monkeypatch):
    """With the Triton kernels (the interpreter on CPU), a one-sequence decode over 16 experts, top-2,
    goes one pair a block: each MoE block hands its two expert rows to the next norm unsummed."""
    import fastllm_kernels

    folder, model = save_tiny_checkpoint("qwen3_moe", tmp_path, num_experts=16)
    expected = hf_greedy(model, PROMPTS[0], MAX_NEW)
    summands = []
    norm = fastllm_kernels.fused_add_rms_norm

    def counting_norm(x, residual, weight, eps):
        summands.append(x.dim() > residual.dim())
        return norm(x, residual, weight, eps)

    monkeypatch.setattr(fastllm_kernels, "fused_add_rms_norm", counting_norm)
    monkeypatch.setenv("FASTLLM_TRITON_OPS", "1")
    llm = LLM(folder, dtype="float32", num_gpu_blocks_override=64, block_size=16, enforce_eager=True)
    assert _tokens(_greedy(llm, PROMPTS[:1])) == [expected]
    assert any(summands) and not all(summands)  # decodes' MoE outputs, not the prefill's or attention's


def test_batch_one_decode_runs_shared_experts_beside_the_routed_and_matches_hf(tmp_path, monkeypatch):
    """ERNIE's one-sequence decode over 16 experts goes one pair a block with the Triton kernels; on
    a GPU its shared experts then run on a second stream, captured in the decode graphs."""
    folder, model = save_tiny_checkpoint("ernie4_5_moe", tmp_path, moe_num_experts=16)
    expected = hf_greedy(model, PROMPTS[0], MAX_NEW)
    monkeypatch.setenv("FASTLLM_TRITON_OPS", "1")
    llm = LLM(folder, dtype="float32", num_gpu_blocks_override=64, block_size=16)
    assert _tokens(_greedy(llm, PROMPTS[:1])) == [expected]


@pytest.mark.parametrize("checkpoint", list(ARCHITECTURES), indirect=True)
def test_chunked_prefill_preemption_and_prefix_hits_match_hf(checkpoint):
    folder, expected = checkpoint
    llm = LLM(folder, dtype="float32", num_gpu_blocks_override=8, block_size=16, kv_cache_ratio=1.0,
              max_num_batched_tokens=16, enable_prefix_caching=True)
    assert _tokens(_greedy(llm, PROMPTS)) == expected
    assert llm.engine.scheduler.num_preemptions > 0, "the tiny KV pool should have forced preemption"
    again = _greedy(llm, PROMPTS[1:3])
    assert all(o.num_cached_tokens >= 32 for o in again), [o.num_cached_tokens for o in again]
    assert _tokens(again) == expected[1:3]
    assert llm.engine.kv_cache.num_free_blocks == llm.engine.kv_cache.pool.num_usable_blocks


@needs_ranks(2)
@pytest.mark.parametrize("checkpoint", MOE, indirect=True)
def test_tensor_parallel_2_matches_hf(checkpoint):
    folder, expected = checkpoint
    llm = LLM(folder, dtype="float32", tensor_parallel_size=2, num_gpu_blocks_override=64, block_size=16,
              max_num_batched_tokens=16)
    try:
        assert _tokens(_greedy(llm, PROMPTS)) == expected
    finally:
        llm.shutdown()


@needs_ranks(2)
def test_dummy_weights_do_not_depend_on_tensor_parallel_size(tmp_path):
    """The dummy loader draws each stacked expert tensor whole and lets every rank keep its slice."""
    config = AutoConfig.for_model("ernie4_5_moe", **COMMON, **ARCHITECTURES["ernie4_5_moe"])
    config.architectures = ["Ernie4_5_MoeForCausalLM"]
    config.save_pretrained(tmp_path)
    params = SamplingParams(temperature=0.0, max_tokens=8, prompt_logprobs=1)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:2]]
    single = LLM(str(tmp_path), load_format="dummy", dtype="float32", num_gpu_blocks_override=32)
    expected = single.generate(prompts, params, use_tqdm=False)
    del single
    llm = LLM(str(tmp_path), load_format="dummy", dtype="float32", tensor_parallel_size=2, num_gpu_blocks_override=32)
    try:
        actual = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.shutdown()
    for a, e in zip(actual, expected):
        assert a.outputs.token_ids == e.outputs.token_ids
        assert a.prompt_logprobs[1:] == [pytest.approx(step, abs=1e-4) for step in e.prompt_logprobs[1:]]


@pytest.mark.parametrize("name, billions", [("ernie-4.5-0.3b", 0.36), ("ernie-4.5-21b-a3b", 21.83),
                                            ("qwen3-30b-a3b", 30.53), ("mixtral-8x7b", 46.70),
                                            ("llama-3-70b", 70.55)])
def test_bundled_configs_build_the_published_sizes(name, billions):
    config = DummyLoader().load_config(name)
    with torch.device("meta"):
        model = registry.get("models", config.architectures[0])(config)
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=0.005)
