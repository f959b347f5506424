"""Pipeline parallelism over gloo on the CPU: stages (alone or each tensor-parallel) give one
process's greedy tokens and logprobs."""

from __future__ import annotations

import multiprocessing

import pytest
import torch.distributed as dist
from transformers import LlamaConfig

from fastllm import LLM, SamplingParams
from fastllm.testing.models import save_tiny_checkpoint
from tests.conftest import TINY_LLAMA
from tests.distributed.test_tensor_parallel import (TINY_PROMPTS, _generate, assert_same_outputs,
                                                    assert_smollm2_matches, assert_start_fails)

PARAMS = SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, prompt_logprobs=2)


def _tiny(path: str, tp: int = 1, pp: int = 1) -> LLM:
    # 16-token steps chunk the 40-token prompt, so steps mix prefill chunks with decodes
    return LLM(path, tensor_parallel_size=tp, pipeline_parallel_size=pp, num_gpu_blocks_override=32, block_size=16,
               max_num_batched_tokens=16)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> str:
    """Real (random) weights, 3 layers: the stages split them unevenly."""
    config = LlamaConfig(**{**TINY_LLAMA, "num_hidden_layers": 3})
    return save_tiny_checkpoint(config, str(tmp_path_factory.mktemp("tiny_llama")))


@pytest.fixture(scope="module")
def tiny_expected(tiny_checkpoint):
    return _generate(_tiny(tiny_checkpoint), [{"prompt_token_ids": p} for p in TINY_PROMPTS], PARAMS)


@pytest.mark.parametrize("tp, pp", [(1, 2), (2, 2)])
def test_pipeline_matches_one_process_on_tiny_checkpoint(tiny_checkpoint, tiny_expected, tp, pp):
    llm = _tiny(tiny_checkpoint, tp, pp)
    try:
        actual = _generate(llm, [{"prompt_token_ids": p} for p in TINY_PROMPTS], PARAMS)
    finally:
        llm.shutdown()
    assert_same_outputs(actual, tiny_expected)
    assert not multiprocessing.active_children()
    assert not dist.is_initialized()


def test_pp2_matches_one_process_on_smollm2(smollm2_path, smollm2_llm):
    """SmolLM2 ties its LM head to the embedding: the last stage holds the embedding too."""
    assert_smollm2_matches(smollm2_path, smollm2_llm, pipeline_parallel_size=2)


def test_more_stages_than_layers_fails_at_start(tiny_llama_dir):
    assert_start_fails("2 layers cannot be split over pipeline_parallel_size=3",
                       lambda: LLM(tiny_llama_dir, load_format="dummy", pipeline_parallel_size=3,
                                   num_gpu_blocks_override=8))
