"""Async scheduling with a speculative decoder: steps without drafts overlap as in plain decoding,
a step with drafts reads the step in flight first and is read before the next launch, and
greedy output stays that of plain decoding.

On the CPU a launch has finished when it returns, so what is checked is the order of launches
and reads and the bookkeeping between them, not the speed-up.
"""

from __future__ import annotations

import random

import pytest

from fastllm import LLM, SamplingParams
from fastllm.testing.steps import StepLog

ENGINE = dict(load_format="dummy", dtype="float32", max_model_len=256, block_size=16, max_num_seqs=4,
              max_num_batched_tokens=64)


class _OracleDrafts:
    """A decoder from before ``wants_drafts``: it knows the greedy answers and drafts up to 3 of
    the next tokens (the last one wrong every other time) when a sequence's output reaches a
    multiple of 5 tokens, never otherwise."""

    def __init__(self, answers: dict[tuple[int, ...], list[int]]):
        self.answers = answers

    def on_prompt(self, seq) -> None:
        seq.spec_state = self.answers[tuple(seq.prompt_token_ids)]

    def propose(self, seqs, max_drafts) -> None:
        for seq, room in zip(seqs, max_drafts):
            assert not seq.num_pending_tokens
            done = len(seq.output_token_ids)
            drafts = list(seq.spec_state[done:done + min(room, 3)]) if done % 5 == 0 else []
            if drafts and done % 10 == 0:
                drafts[-1] = (drafts[-1] + 1) % 256
            seq.draft_token_ids = drafts

    def on_step(self, seq, num_proposed: int, num_accepted: int) -> None:
        pass

    def on_finished(self, seq) -> None:
        pass


class _OracleThatSaysWhen(_OracleDrafts):
    """The same drafts, and it says when it will propose some."""

    def wants_drafts(self, seq) -> bool:
        return (len(seq.output_token_ids) + seq.num_pending_tokens) % 5 == 0


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(2, 60))] for _ in range(count)]


def _speculating(model: str, prompts: list[list[int]], expected: list[list[int]],
                 decoder_cls: type = _OracleThatSaysWhen, **engine) -> LLM:
    llm = LLM(model, async_scheduling=True, **{**ENGINE, **engine})
    llm.engine.speculator = decoder_cls({tuple(p): e for p, e in zip(prompts, expected)})
    return llm


def _assert_no_blocks_held(llm: LLM) -> None:
    pool = llm.engine.kv_cache.pool
    assert pool.num_free_blocks == pool.num_usable_blocks
    assert not llm.engine.scheduler.running and not llm.engine.scheduler.waiting


@pytest.mark.parametrize("max_num_seqs,max_num_batched_tokens", [(1, 256), (4, 64), (12, 24)])
def test_greedy_output_equals_plain_decoding(tiny_llama_dir, max_num_seqs, max_num_batched_tokens):
    prompts = _prompts(12, seed=0)
    params = [SamplingParams(temperature=0, max_tokens=6 + 3 * i, ignore_eos=True) for i in range(len(prompts))]
    engine = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    plain = LLM(tiny_llama_dir, async_scheduling=False, **{**ENGINE, **engine})
    expected = [o.outputs.token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    llm = _speculating(tiny_llama_dir, prompts, expected, **engine)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs.token_ids for o in outputs] == expected
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0
    _assert_no_blocks_held(llm)


def test_steps_without_drafts_overlap_and_a_drafted_step_is_read_before_step_returns(tiny_llama_dir):
    prompts = _prompts(1, seed=1)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = [LLM(tiny_llama_dir, **ENGINE).generate(prompts, params, use_tqdm=False)[0].outputs.token_ids]
    llm = _speculating(tiny_llama_dir, prompts, expected)
    engine = llm.engine
    log = StepLog(engine.runner)
    events = log.events
    engine.add_request("r", None, prompts[0], params)
    tokens = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens = output.outputs.token_ids
        events.append(("return", engine.in_flight is not None))
    assert tokens == expected[0]
    num_launches = log.num_steps
    drafted = {n for n, out in enumerate(log.outputs) if out.draft_token_ids}
    overlapped = 0
    for n in range(1, num_launches):
        launched = events.index(("execute", n))
        returned = next(i for i in range(launched, len(events)) if events[i][0] == "return")
        if n in drafted:  # the step before was read before this launch, this one before step() returned
            assert events.index(("read", n - 1)) < launched < events.index(("read", n)) < returned
            assert events[returned] == ("return", False)
        elif events.index(("read", n - 1)) > launched:  # queued behind the step before, left in flight
            assert events[returned] == ("return", True)
            overlapped += 1
    assert 3 <= len(drafted) < num_launches // 2
    assert overlapped >= (num_launches - 1 - len(drafted)) // 2
    _assert_no_blocks_held(llm)


@pytest.mark.parametrize("decoder_cls", [_OracleDrafts, _OracleThatSaysWhen])
def test_a_decoder_without_wants_drafts_gets_every_step_read_before_the_next_launch(tiny_llama_dir, decoder_cls):
    """Taken to want drafts every step, it sees each sequence that could draft launched only
    with its tokens on the host; the decoder that says when overlaps those launches instead."""
    prompts = _prompts(5, seed=2)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = [o.outputs.token_ids for o in LLM(tiny_llama_dir, **ENGINE).generate(prompts, params, use_tqdm=False)]
    llm = _speculating(tiny_llama_dir, prompts, expected, decoder_cls=decoder_cls)
    pending_at_launch = []
    executor = llm.engine.runner
    execute = executor.execute_model

    def spy(scheduler_output):
        seqs = [executor.runner.input_batch.seqs.get(seq_id) for seq_id in scheduler_output.seq_ids]
        pending_at_launch.extend(seq.num_pending_tokens for seq in seqs  # the runner's view, as the step starts
                                 if seq is not None and len(seq.output_token_ids) + 2 < params.max_tokens)
        execute(scheduler_output)

    executor.execute_model = spy
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs.token_ids for o in outputs] == expected
    assert any(pending_at_launch) is (decoder_cls is _OracleThatSaysWhen)
    _assert_no_blocks_held(llm)
