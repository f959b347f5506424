"""Async scheduling (step n+1 queued before step n's tokens are read) changes no output.

On the CPU a launch finishes before it returns, so these tests check the bookkeeping that
the overlap needs (pending tokens read on the device, counts advanced at launch, late stops
discarded, drains for grammar and penalties), not the speed-up, which only a GPU shows.
"""

from __future__ import annotations

import random

import pytest
import torch

from fastllm import LLM, SamplingParams
from fastllm.testing.steps import StepLog
from fastllm.worker.input_batch import SampledTokens, ScheduledRow, SequenceState, pack_inputs

ENGINE = dict(load_format="dummy", max_model_len=256, block_size=16, max_num_seqs=4, max_num_batched_tokens=48)


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(2, 70))] for _ in range(count)]


def _run(model: str, prompts, params, overlap: bool, **engine) -> tuple[list[tuple], LLM]:
    llm = LLM(model, async_scheduling=overlap, **{**ENGINE, **engine})
    assert llm.engine.overlap is overlap
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [(o.outputs.token_ids, o.outputs.finish_reason, o.outputs.stop_reason,
             round(o.outputs.cumulative_logprob, 3), _rounded(o.outputs.logprobs)) for o in outputs], llm


def _rounded(logprobs):
    return None if logprobs is None else [{t: round(v, 3) for t, v in entry.items()} for entry in logprobs]


def _assert_no_blocks_held(llm: LLM) -> None:
    pool = llm.engine.kv_cache.pool
    assert pool.num_free_blocks == pool.num_usable_blocks
    assert not llm.engine.scheduler.running and not llm.engine.scheduler.waiting


@pytest.mark.parametrize("max_num_seqs,max_num_batched_tokens", [(1, 256), (4, 48), (16, 32)])
def test_greedy_outputs_and_logprobs_equal_the_synchronous_engine(tiny_llama_dir, max_num_seqs,
                                                                   max_num_batched_tokens):
    prompts = _prompts(10)
    params = [SamplingParams(temperature=0, max_tokens=8 + 3 * i, logprobs=2 if i % 3 == 0 else None)
              for i in range(len(prompts))]
    engine = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    sync, _ = _run(tiny_llama_dir, prompts, params, False, **engine)
    overlapped, llm = _run(tiny_llama_dir, prompts, params, True, **engine)
    assert overlapped == sync
    assert [len(row[0]) for row in overlapped] == [8 + 3 * i for i in range(len(prompts))]
    _assert_no_blocks_held(llm)


def test_a_stop_found_late_discards_the_token_of_the_step_in_flight(tiny_llama_dir):
    """Stop on a token the synchronous run produces mid-way: the overlapped run launched one
    more step for that sequence before it read the stop, and must drop that step's token."""
    prompts = _prompts(6, seed=1)
    greedy = SamplingParams(temperature=0, max_tokens=30)
    reference, _ = _run(tiny_llama_dir, prompts, greedy, False)
    params = [SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[tokens[len(tokens) // 2]])
              for tokens, *_ in reference]
    sync, _ = _run(tiny_llama_dir, prompts, params, False)
    overlapped, llm = _run(tiny_llama_dir, prompts, params, True)
    assert overlapped == sync
    assert all(row[1] == "stop" for row in overlapped)
    _assert_no_blocks_held(llm)


def test_seeded_sampling_with_n_equals_the_synchronous_engine(tiny_llama_dir):
    prompts = _prompts(5, seed=2)
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, n=2, seed=7, max_tokens=12)
    engine = dict(max_num_seqs=8)
    sync = LLM(tiny_llama_dir, async_scheduling=False, **{**ENGINE, **engine}).generate(prompts, params, use_tqdm=False)
    overlapped = LLM(tiny_llama_dir, async_scheduling=True, **{**ENGINE, **engine}).generate(prompts, params,
                                                                                          use_tqdm=False)
    assert [[c.token_ids for c in o.completions] for o in overlapped] == \
        [[c.token_ids for c in o.completions] for o in sync]


def test_penalties_and_min_tokens_match_the_synchronous_engine(tiny_llama_dir):
    """Their logits need the latest token on the host: the engine reads it before sampling the next step."""
    prompts = _prompts(5, seed=3)
    params = [SamplingParams(temperature=0, max_tokens=15, repetition_penalty=1.3),
              SamplingParams(temperature=0, max_tokens=15, frequency_penalty=0.8, presence_penalty=0.4),
              SamplingParams(temperature=0, max_tokens=15, min_tokens=10, stop_token_ids=[5, 9, 11]),
              SamplingParams(temperature=0, max_tokens=15),
              SamplingParams(temperature=0, max_tokens=15, logit_bias={17: 5.0})]
    sync, _ = _run(tiny_llama_dir, prompts, params, False)
    overlapped, llm = _run(tiny_llama_dir, prompts, params, True)
    assert overlapped == sync
    _assert_no_blocks_held(llm)


def test_preemption_with_tokens_in_flight_matches_and_frees_every_block(tiny_llama_dir):
    prompts = _prompts(8, seed=4)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine = dict(num_gpu_blocks_override=12, kv_cache_ratio=1.0, max_num_seqs=6)
    sync, sync_llm = _run(tiny_llama_dir, prompts, params, False, **engine)
    overlapped, llm = _run(tiny_llama_dir, prompts, params, True, **engine)
    assert llm.engine.scheduler.num_preemptions > 0
    assert overlapped == sync
    _assert_no_blocks_held(llm)


def test_abort_while_its_step_is_in_flight(tiny_llama_dir):
    prompts = _prompts(4, seed=5)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    sync, _ = _run(tiny_llama_dir, prompts, params, False)
    llm = LLM(tiny_llama_dir, async_scheduling=True, **ENGINE)
    engine = llm.engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", None, prompt, params)
    for _ in range(4):
        engine.step()
    assert engine.in_flight is not None and any(s.seq.request_id == "r1" for s in engine.in_flight.scheduled)
    r1 = [seq_id for seq_id, seq in engine.runner.runner.input_batch.seqs.items() if seq.request_id == "r1"]
    aborted = engine.abort_request("r1")
    assert aborted.outputs.finish_reason == "abort"
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs.token_ids
    assert finished == {f"r{i}": sync[i][0] for i in (0, 2, 3)}
    assert not engine.runner.runner.input_batch.seqs.keys() & set(r1)  # the runner forgot it
    _assert_no_blocks_held(llm)


def test_decode_steps_really_overlap_and_waste_no_step_at_max_tokens(tiny_llama_dir):
    """Each launch after the first is queued before the previous step's tokens are read, and a
    sequence whose pending token reaches max_tokens is not scheduled again."""
    llm = LLM(tiny_llama_dir, async_scheduling=True, **ENGINE)
    log = StepLog(llm.engine.runner)
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs.token_ids) == 10
    assert log.num_steps == 10  # one prefill + nine decodes, none wasted
    for n in range(1, log.num_steps):
        assert log.events.index(("sample", n)) < log.events.index(("read", n - 1))


def test_pack_inputs_reads_pending_tokens_on_the_device():
    params = SamplingParams(max_tokens=10)
    seqs = [SequenceState(seq_id, name, 0, prompt, params, 0, block_ids=[3, 5], num_computed_tokens=computed)
            for seq_id, name, prompt, computed in ((0, "a", [11, 12, 13], 3), (1, "b", [21, 22], 1))]
    seqs[0].num_pending_tokens = 1  # its 4th token was sampled in row 1 of the previous step
    previous = SampledTokens(torch.tensor([90, 91, 92]), {seqs[0].seq_id: 1})
    inputs = pack_inputs([ScheduledRow(seqs[1], 1), ScheduledRow(seqs[0], 1)], 4, torch.device("cpu"), previous)
    assert inputs.input_ids.tolist() == [22, 91]
    assert inputs.positions.tolist() == [1, 3]
    assert inputs.attn_metadata.slot_mapping.tolist() == [3 * 4 + 1, 3 * 4 + 3]
    assert inputs.attn_metadata.seq_lens.tolist() == [2, 4]
    assert inputs.attn_metadata.block_tables.tolist() == [[3, 5], [3, 5]]
    assert inputs.attn_metadata.query_start_loc.tolist() == [0, 1, 2]


def test_penalties_keep_steps_overlapped_by_reading_inside_the_launch(tiny_llama_dir):
    """A sequence that needs its latest token on the host no longer drains the pipeline: each
    decode launch queues its forward pass, then reads the step before, then samples."""
    llm = LLM(tiny_llama_dir, async_scheduling=True, **ENGINE)
    log = StepLog(llm.engine.runner)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, repetition_penalty=1.3)
    out = llm.generate([[5, 6, 7]], params, use_tqdm=False)
    assert len(out[0].outputs.token_ids) == 8
    assert log.read_inside() == [False] + [True] * 7


def test_stop_strings_found_after_the_sampling_launch_end_sequences_as_before(smollm2_path):
    """With penalties, a read step's tokens are detokenized only after the next sampling is
    queued; a stop string found then must end its sequence with the synchronous engine's text,
    reason and tokens, and free its blocks."""
    llm_args = dict(max_model_len=512, block_size=16, max_num_seqs=4, num_gpu_blocks_override=64)
    prompts = ["The capital of France is", "List three colours:", "Count from one to ten:",
               "Write a haiku about rain."]
    sync_llm = LLM(smollm2_path, async_scheduling=False, **llm_args)
    free_text = sync_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.2),
                                  use_tqdm=False)
    # stop at a word each answer reaches midway, so the stop is found while a step is in flight
    stops = [o.outputs.text.split()[len(o.outputs.text.split()) // 2] for o in free_text]
    params = [SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.2, stop=[stop]) for stop in stops]
    rows = {}
    for overlap, llm in ((False, sync_llm), (True, LLM(smollm2_path, async_scheduling=True, **llm_args))):
        assert llm.engine.overlap is overlap
        outputs = llm.generate(prompts, params, use_tqdm=False)
        rows[overlap] = [(o.outputs.text, o.outputs.token_ids, o.outputs.finish_reason, o.outputs.stop_reason)
                         for o in outputs]
        _assert_no_blocks_held(llm)
    assert rows[True] == rows[False]
    assert all(row[2] == "stop" and row[3] == stop for row, stop in zip(rows[True], stops))
