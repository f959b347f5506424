"""Data parallelism on the CPU: two replica processes give one engine's greedy tokens."""

from __future__ import annotations

import multiprocessing

import pytest

from fastllm import LLM, SamplingParams
from fastllm.engine.data_parallel import ReplicaGroup
from tests.conftest import needs_ranks
from tests.distributed.test_tensor_parallel import SMOL_PROMPTS, TINY_PROMPTS, _generate

PROMPTS = SMOL_PROMPTS + ["Once upon a time", "The three primary colors are"]


@needs_ranks(2)
def test_dp2_matches_one_engine_and_balances(smollm2_path, smollm2_llm):
    params = SamplingParams(temperature=0.0, max_tokens=8)
    expected = [o.outputs.token_ids for o in _generate(smollm2_llm, PROMPTS, params)]
    llm = LLM(smollm2_path, max_model_len=1024, num_gpu_blocks_override=64, data_parallel_size=2)
    try:
        replicas = llm.engine.replicas
        assert [r.proc.is_alive() for r in replicas] == [True, True]
        actual = [o.outputs.token_ids for o in _generate(llm, PROMPTS, params)]
        assert actual == expected
        # placement: four requests added at once spread two and two, and are all answered
        engine = llm.engine
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(f"r{i}", prompt, None, params)
        assert [len(r.owned) for r in replicas] == [2, 2]
        assert engine.abort_request("r3").finished
        done, prompts = {}, {}
        while engine.has_unfinished_requests():
            for output in engine.step():  # streamed: every output has its prompt back
                prompts.setdefault(output.request_id, set()).add(tuple(output.prompt_token_ids))
                if output.finished:
                    done[output.request_id] = output.outputs.token_ids
            if "r2" not in done:  # its replica has its next step in flight: the abort reads it first
                done["r2"] = engine.abort_request("r2").outputs.token_ids
        assert [done[f"r{i}"] for i in range(2)] == expected[:2]
        assert all(len(seen) == 1 and len(next(iter(seen))) > 3 for seen in prompts.values())
    finally:
        llm.shutdown()
    assert not multiprocessing.active_children()


@needs_ranks(4)
def test_dp2_replicas_of_tp2(tiny_llama_dir):
    """Each replica drives its own tensor-parallel worker (a replica may have children)."""
    params = SamplingParams(temperature=0.0, max_tokens=6)
    prompts = [{"prompt_token_ids": p} for p in TINY_PROMPTS]
    kwargs = dict(load_format="dummy", num_gpu_blocks_override=32, block_size=16)
    expected = [o.outputs.token_ids for o in _generate(LLM(tiny_llama_dir, **kwargs), prompts, params)]
    llm = LLM(tiny_llama_dir, data_parallel_size=2, tensor_parallel_size=2, **kwargs)
    try:
        assert [o.outputs.token_ids for o in _generate(llm, prompts, params)] == expected
    finally:
        llm.shutdown()
    assert not multiprocessing.active_children()


@needs_ranks(2)
def test_failed_start_stops_the_started_replicas(tiny_llama_dir, monkeypatch):
    """A failure after the replicas start (here: reading their facts) surfaces and leaves no
    replica behind (a non-daemon one left running would hang the interpreter's exit)."""
    started = []

    def fail(group: ReplicaGroup, facts: list) -> None:
        started.extend(replica.proc for replica in group.replicas)
        assert len(facts) == 2 and all(proc.is_alive() for proc in started)
        raise RuntimeError("facts unreadable")

    monkeypatch.setattr(ReplicaGroup, "_adopt_facts", fail)
    with pytest.raises(RuntimeError, match="facts unreadable"):
        LLM(tiny_llama_dir, load_format="dummy", num_gpu_blocks_override=16, block_size=16, data_parallel_size=2)
    assert len(started) == 2 and [proc.exitcode for proc in started] == [0, 0]  # told to stop, not killed
    assert not multiprocessing.active_children()
