"""Lockstep data-parallel replicas (DP attention + EP) agree on each step before its forward pass:
the common padded bucket, and the padding rows whose routes carry no weight.

The end-to-end test runs two replicas' engines over gloo, each built as ``run_replica`` builds
it, with the padded common-bucket decode steps run eagerly over the decode graphs' static
buffers (the Triton attention backend under the interpreter, which graphs could capture):
greedy tokens equal transformers', while one replica holds three sequences and the other one
that finishes early, so it keeps step idle inside padded steps, and async scheduling is on.
"""

from __future__ import annotations

import torch
import torch.multiprocessing as mp

from fastllm.distributed.replica_step import ReplicaPlan, common_bucket, padding_rows
from tests.conftest import hf_greedy
from tests.models.test_moe_equivalence import MAX_NEW, PROMPTS
from tests.models.tiny_checkpoints import save_tiny_checkpoint

SIZES = [1, 2, 4, 8, 16]


def test_common_bucket_holds_every_replica_or_none():
    decode = [ReplicaPlan(3, True), ReplicaPlan(1, True, work=False)]
    assert common_bucket(decode, SIZES) == 4  # the smallest size holding the largest count
    assert common_bucket([ReplicaPlan(8, True), ReplicaPlan(2, True)], SIZES) == 8
    assert common_bucket([ReplicaPlan(3, True), ReplicaPlan(12, False)], SIZES) is None  # a prefill: eager
    assert common_bucket([ReplicaPlan(17, True), ReplicaPlan(1, True)], SIZES) is None  # past the largest
    assert common_bucket(decode, []) is None  # nothing captured


def test_padding_rows_follow_each_replicas_count():
    padding = padding_rows(torch.tensor([3, 1]), 4)
    assert padding.shape == (8, 1)
    assert padding.squeeze(1).tolist() == [False, False, False, True, False, True, True, True]


# rank 0 holds three prompts, rank 1 one with a short budget: it idles (a dummy step) after it
PLACEMENT = {0: ([0, 1, 2], [MAX_NEW, MAX_NEW, 6]), 1: ([3], [3])}
STEPS = 40  # enough for both (chunked prefills first): a step where no replica has work runs no forward


def _replica(rank: int, init: str, folder: str, results: dict) -> None:
    from fastllm import SamplingParams
    from fastllm.config import EngineConfig
    from fastllm.distributed.process_group import destroy_tensor_parallel, init_replica_experts
    from fastllm.engine.llm_engine import LLMEngine

    init_replica_experts(rank, 2, init, "gloo", torch.device("cpu"))
    engine = None
    try:
        engine = LLMEngine(EngineConfig(model=folder, dtype="float32", num_gpu_blocks_override=64, block_size=16,
                                        max_num_batched_tokens=16, attention_backend="triton",
                                        async_scheduling=True))
        runner = engine.runner.runner
        padded, idle_padded, idle = [], [], [False]
        replay = runner.graphs.run
        runner.graphs.run = lambda *args, **kwargs: (padded.append(kwargs["size"]), idle_padded.append(idle[0]),
                                                     replay(*args, **kwargs))[-1]
        idle_step = runner.idle_step

        def counted_idle_step():
            idle[0] = True
            try:
                idle_step()
            finally:
                idle[0] = False

        runner.idle_step = counted_idle_step
        prompts, budgets = PLACEMENT[rank]
        for index, budget in zip(prompts, budgets):
            engine.add_request(str(index), None, PROMPTS[index], SamplingParams(temperature=0.0, max_tokens=budget))
        tokens = {}
        for _ in range(STEPS):
            for output in engine.step():
                if output.finished:
                    tokens[int(output.request_id)] = output.outputs.token_ids
        results[rank] = (tokens, padded, sum(idle_padded), engine.overlap)
    finally:
        if engine is not None:
            engine.runner.runner.graphs = None
        destroy_tensor_parallel()


def test_padded_lockstep_decode_matches_hf(tmp_path):
    folder, model = save_tiny_checkpoint("qwen3_moe", tmp_path)
    results = mp.Manager().dict()
    mp.spawn(_replica, args=(f"file://{tmp_path}/rendezvous", folder, results), nprocs=2)
    for rank, (prompts, budgets) in PLACEMENT.items():
        tokens, padded, idle_padded, overlap = results[rank]
        assert overlap  # async scheduling stays on in lockstep
        assert tokens == {i: hf_greedy(model, PROMPTS[i], n) for i, n in zip(prompts, budgets)}
        assert padded and set(padded) <= {1, 2, 4}  # decode steps at the common bucket
    assert results[0][1] == results[1][1]  # both replicas replayed the same buckets, step by step
    assert results[1][2] > 0  # rank 1 idled inside padded steps
    assert 4 in results[0][1]  # rank 0's three decodes padded to 4
