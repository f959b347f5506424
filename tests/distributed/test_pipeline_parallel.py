"""Pipeline parallelism over gloo on the CPU: stages (alone or each tensor-parallel) give one
process's greedy tokens and logprobs."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
import torch.distributed as dist
from transformers import LlamaConfig

from fastllm import LLM, SamplingParams
from fastllm.attention.metadata import AttentionMetadata
from fastllm.worker import model_runner
from fastllm.worker.micro_batches import micro_batch_count, split_step
from fastllm.testing.models import save_tiny_checkpoint
from tests.conftest import TINY_LLAMA, needs_ranks
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


@pytest.mark.parametrize("tp, pp", [pytest.param(1, 2, marks=needs_ranks(2)), pytest.param(2, 2, marks=needs_ranks(4))])
def test_pipeline_matches_one_process_on_tiny_checkpoint(tiny_checkpoint, tiny_expected, tp, pp):
    llm = _tiny(tiny_checkpoint, tp, pp)
    try:
        actual = _generate(llm, [{"prompt_token_ids": p} for p in TINY_PROMPTS], PARAMS)
    finally:
        llm.shutdown()
    assert_same_outputs(actual, tiny_expected)
    assert not multiprocessing.active_children()
    assert not dist.is_initialized()


@needs_ranks(2)
def test_pp2_matches_one_process_on_smollm2(smollm2_path, smollm2_llm):
    """SmolLM2 ties its LM head to the embedding: the last stage holds the embedding too."""
    assert_smollm2_matches(smollm2_path, smollm2_llm, pipeline_parallel_size=2)


@needs_ranks(3)
def test_more_stages_than_layers_fails_at_start(tiny_llama_dir):
    assert_start_fails("2 layers cannot be split over pipeline_parallel_size=3",
                       lambda: LLM(tiny_llama_dir, load_format="dummy", pipeline_parallel_size=3,
                                   num_gpu_blocks_override=8))


@pytest.mark.parametrize("tp", [pytest.param(1, marks=needs_ranks(2)), pytest.param(2, marks=needs_ranks(4))])
def test_micro_batches_match_one_process_on_tiny_checkpoint(tiny_checkpoint, tiny_expected, monkeypatch, tp):
    """Steps of 16 tokens cut into 4 micro-batches: prefill chunks and decodes cut mid-run."""
    monkeypatch.setenv("FASTLLM_PP_MICRO_BATCH_TOKENS", "4")  # read by every rank, spawned ones too
    cuts = []
    monkeypatch.setattr(model_runner, "split_step", lambda *args: cuts.append(split_step(*args)) or cuts[-1])
    test_pipeline_matches_one_process_on_tiny_checkpoint(tiny_checkpoint, tiny_expected, tp, 2)
    assert {len(parts) for parts in cuts} == {4}  # on rank 0, which the workers' collectives must match


def test_split_step_cuts_rows_by_tokens():
    """Two decodes then a 5-token chunk after 3 computed tokens, in 3 micro-batches of 2-3 tokens."""
    meta = AttentionMetadata(slot_mapping=torch.arange(7), query_start_loc=torch.tensor([0, 1, 2, 7]),
                             seq_lens=torch.tensor([4, 9, 8]), block_tables=torch.arange(6).view(3, 2),
                             num_decodes=2, max_query_len=5, max_seq_len=9, query_lens_cpu=[1, 1, 5],
                             seq_lens_cpu=[4, 9, 8])
    parts = split_step(meta, 3, torch.device("cpu"))
    assert [p.tokens for p in parts] == [slice(0, 2), slice(2, 4), slice(4, 7)]
    first, middle, last = (p.attn_metadata for p in parts)
    assert (first.query_lens_cpu, first.seq_lens_cpu, first.num_decodes) == ([1, 1], [4, 9], 2)
    assert (middle.query_lens_cpu, middle.seq_lens_cpu, middle.num_decodes) == ([2], [5], 0)
    assert (last.query_lens_cpu, last.seq_lens_cpu, last.max_seq_len) == ([3], [8], 8)
    assert last.query_start_loc.tolist() == [0, 3] and last.block_tables.tolist() == [[4, 5]]
    assert last.slot_mapping.tolist() == [4, 5, 6]
    assert micro_batch_count(4096, 1) == 1 and micro_batch_count(4096, 2) == 8 and micro_batch_count(600, 2) == 1
