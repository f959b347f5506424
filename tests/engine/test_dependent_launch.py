"""Kernels launched dependent (Hopper's programmatic dependent launch) in the decode CUDA graphs
start before the kernel ahead of them ends: a read placed before its wait would see stale data.
Their tokens must be those of ordinary launches, for the float and the quantized GEMVs."""

from __future__ import annotations

import random

import pytest
import torch

from fastllm import LLM, SamplingParams

pdl = pytest.importorskip("fastllm_kernels.pdl")
weight_gemm = pytest.importorskip("fastllm_kernels.quant.weight_gemm")

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9 or not pdl._TRITON_HAS_PDL,
    reason="programmatic dependent launch needs a Hopper GPU and a Triton with grid dependency control")


def _greedy(model_dir: str, quantization: str | None, flag: str, monkeypatch) -> list[list[int]]:
    monkeypatch.setenv("FASTLLM_PDL", flag)
    pdl._enabled.cache_clear()
    weight_gemm.plan.cache_clear()
    assert pdl.pdl_launch(torch.device("cuda"))["PDL"] is (flag == "1")
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 256) for _ in range(rng.randrange(5, 60))]} for _ in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    llm = LLM(model_dir, load_format="dummy", dtype="bfloat16", quantization=quantization, seed=0,
              max_model_len=256, max_num_seqs=4, num_gpu_blocks_override=64, block_size=16)
    outputs = [o.outputs.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    llm.engine.runner.shutdown()
    return outputs


@pytest.mark.parametrize("quantization", [None, "weight_only_int4", "nf4", "weight_only_int8", "fp8"])
def test_dependent_launches_keep_greedy_output(tiny_llama_dir, monkeypatch, quantization):
    dependent = _greedy(tiny_llama_dir, quantization, "1", monkeypatch)
    ordinary = _greedy(tiny_llama_dir, quantization, "0", monkeypatch)
    assert dependent == ordinary
    pdl._enabled.cache_clear()
    weight_gemm.plan.cache_clear()
