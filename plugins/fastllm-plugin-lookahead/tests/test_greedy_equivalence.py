"""Lookahead changes the speed, never the text: greedy SmolLM2 output with and without it is
the same token for token, alone and in batches of 4 and 16+, with async scheduling too, and
copying is where it gains."""

from __future__ import annotations

import pytest

from fastllm import LLM, SamplingParams
from fastllm.model_loader.resolve import embedded_model_path

PARAGRAPH = ("The harbour of Port Selby was dredged in 1887, when the new rope works needed deeper water "
             "for its barges. Ada Price kept the ledger of every ship that entered, and her green books "
             "are still held in the town museum, next to the brass bell of the old ferry.")
CODE = "def area(width, height):\n    return width * heigth\n\nprint(area(3, 4))\n"


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


COPY_PROMPTS = [
    chat("Repeat the following text exactly:\n\n" + PARAGRAPH),
    chat(f"Here is a text:\n{PARAGRAPH}\n\nWho kept the ledger, and where are her books? Quote the text."),
    chat(f"Fix the typo in this code and show the whole corrected code:\n\n{CODE}"),
    chat("Continue the list: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday,"),
]
FREE_PROMPTS = [
    chat("Write a short poem about autumn."),
    chat("What is the capital of France?"),
    chat("Give me three tips for learning to cook."),
    "The history of the printing press begins",
]


@pytest.fixture(scope="module")
def engines() -> tuple[LLM, LLM]:
    """The same model twice, plain and with lookahead; every test of this module shares them."""
    common = {"max_model_len": 2048, "num_gpu_blocks_override": 256}
    plain = LLM(embedded_model_path(), **common)
    lookahead = LLM(embedded_model_path(), speculative_config={"method": "lookahead", "num_speculative_tokens": 6},
                    **common)
    return plain, lookahead


def generate_both(engines: tuple[LLM, LLM], prompts: list[str], params) -> tuple[list, list]:
    plain, lookahead = engines
    return (plain.generate(prompts, params, use_tqdm=False), lookahead.generate(prompts, params, use_tqdm=False))


def test_batch_of_one_is_identical_and_copies_in_few_steps(engines):
    """Lookahead runs each prompt alone; the plain reference runs them in one batch, since its
    greedy tokens do not depend on the batch (the other tests compare batches) and each of its
    decode steps costs about the same for one row as for three."""
    params = SamplingParams(temperature=0.0, max_tokens=64)
    prompts = COPY_PROMPTS[:2] + FREE_PROMPTS[:1]
    plain = engines[0].generate(prompts, params, use_tqdm=False)
    outputs = []
    for prompt, reference in zip(prompts, plain):
        lookahead = engines[1].generate([prompt], params, use_tqdm=False)[0]
        assert lookahead.outputs.token_ids == reference.outputs.token_ids
        assert lookahead.outputs.text == reference.outputs.text
        outputs.append(lookahead)
    copy = outputs[0]
    metrics = copy.metrics
    decode_steps = len(copy.outputs.token_ids) - 1 - metrics.num_accepted_tokens
    assert metrics.num_accepted_tokens <= metrics.num_draft_tokens
    assert (len(copy.outputs.token_ids) - 1) / decode_steps >= 2.0
    assert metrics.mean_accepted_length >= 2.0


def test_batch_of_four_is_identical(engines):
    params = SamplingParams(temperature=0.0, max_tokens=48)
    plain, lookahead = generate_both(engines, COPY_PROMPTS, params)
    assert [o.outputs.token_ids for o in lookahead] == [o.outputs.token_ids for o in plain]
    assert sum(o.metrics.num_accepted_tokens for o in lookahead) > 0


def test_batch_of_sixteen_with_mixed_parameters_is_identical(engines):
    prompts = (COPY_PROMPTS + FREE_PROMPTS) * 2 + COPY_PROMPTS[:2]
    variants = [
        SamplingParams(temperature=0.0, max_tokens=40),
        SamplingParams(temperature=0.0, max_tokens=7),
        SamplingParams(temperature=0.0, max_tokens=40, stop=["museum", "\n\n"]),
        SamplingParams(temperature=0.0, max_tokens=40, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=40, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[13]),
    ]
    params = [variants[i % len(variants)] for i in range(len(prompts))]
    plain, lookahead = generate_both(engines, prompts, params)
    for p, la in zip(plain, lookahead):
        assert la.outputs.token_ids == p.outputs.token_ids
        assert (la.outputs.text, la.outputs.finish_reason) == (p.outputs.text, p.outputs.finish_reason)
        if p.outputs.logprobs is not None:
            for mine, ref in zip(la.outputs.logprobs, p.outputs.logprobs):
                assert mine.keys() == ref.keys()
                assert all(abs(mine[t] - ref[t]) < 1e-3 for t in ref)
    assert sum(o.metrics.num_accepted_tokens for o in lookahead) > 0


def test_seeded_sampling_is_identical(engines):
    """A seeded row's noise is keyed by its seed and output position, so drafts change no token:
    temperature, top-k, top-p, min-p and n=2 in one batch, every sample the same."""
    variants = [{"temperature": 0.7}, {"temperature": 1.0, "top_k": 20}, {"temperature": 0.8, "top_p": 0.9},
                {"temperature": 0.6, "min_p": 0.1}, {"temperature": 0.9, "n": 2}]
    prompts = COPY_PROMPTS + FREE_PROMPTS[:2]
    params = [SamplingParams(seed=100 + 7 * i, max_tokens=40, **variants[i % len(variants)])
              for i in range(len(prompts))]
    plain, lookahead = generate_both(engines, prompts, params)
    for p, la in zip(plain, lookahead):
        assert [c.token_ids for c in la.completions] == [c.token_ids for c in p.completions]
    assert sum(o.metrics.num_accepted_tokens for o in lookahead) > 0


def test_metrics_add_up_to_the_engine_totals(engines):
    decoder = engines[1].engine.speculator
    before = decoder.stats()
    outputs = engines[1].generate(COPY_PROMPTS[2:], SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False)
    after = decoder.stats()
    for key in ("num_draft_tokens", "num_accepted_tokens", "num_spec_steps"):
        assert after[key] - before[key] == sum(getattr(o.metrics, key) for o in outputs)
    assert after["active_requests"] == 0 and after["pool_nodes"] > 0


def test_the_second_identical_request_takes_fewer_steps(engines):
    lookahead = engines[1]
    steps = []
    step = lookahead.engine.step

    def counted():
        steps[-1] += 1
        return step()

    lookahead.engine.step = counted
    try:
        prompt = chat("Describe a walk along a river at dawn.")
        outputs = []
        for _ in range(2):
            steps.append(0)
            outputs.append(lookahead.generate([prompt], SamplingParams(temperature=0.0, max_tokens=48),
                                              use_tqdm=False)[0])
    finally:
        del lookahead.engine.step
    assert outputs[0].outputs.token_ids == outputs[1].outputs.token_ids
    assert steps[1] < steps[0] / 2


@pytest.fixture(scope="module")
def overlapped() -> LLM:
    """Lookahead under async scheduling, forced on (the CPU does not overlap by default)."""
    llm = LLM(embedded_model_path(), speculative_config={"method": "lookahead", "num_speculative_tokens": 6},
              max_model_len=2048, num_gpu_blocks_override=256, async_scheduling=True)
    assert llm.engine.overlap
    return llm


MIXED = [
    (COPY_PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=40, stop=["ledger"])),
    (FREE_PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=40)),
    (COPY_PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=23)),
    (FREE_PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=40, repetition_penalty=1.3)),
    (COPY_PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=40, logprobs=2)),
    (FREE_PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=40, stop=["\n\n"])),
    (COPY_PROMPTS[3], SamplingParams(temperature=0.0, max_tokens=17, stop_token_ids=[13])),
    (FREE_PROMPTS[3], SamplingParams(temperature=0.0, max_tokens=40)),
]


@pytest.fixture(scope="module")
def mixed_reference(engines) -> list:
    """Plain greedy outputs of all of MIXED in one batch; each batch size below compares a prefix."""
    return engines[0].generate([p for p, _ in MIXED], [p for _, p in MIXED], use_tqdm=False)


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_async_scheduling_keeps_greedy_output_and_overlaps_the_draft_free_steps(mixed_reference, overlapped, batch,
                                                                                monkeypatch):
    """Copying and free text in one batch: the copies verify drafts (read synchronously), the
    rest overlap, and stops and max_tokens that end inside a verification step end as in plain
    decoding, with every KV block returned."""
    engine, steps, ends = overlapped.engine, [], []
    step, append = engine.step, engine._append_tokens

    def spied_step():  # (did it verify drafts, did it leave a step in flight)
        verified = engine.speculator.num_spec_steps
        outputs = step()
        steps.append((engine.speculator.num_spec_steps > verified, engine.in_flight is not None))
        return outputs

    def spied_append(state, item, result, *deferred):
        append(state, item, result, *deferred)
        if item.seq.is_finished:
            ends.append((item.seq.finish_reason, result.num_accepted_drafts))

    monkeypatch.setattr(engine, "step", spied_step)
    monkeypatch.setattr(engine, "_append_tokens", spied_append)
    prompts, params = [p for p, _ in MIXED[:batch]], [p for _, p in MIXED[:batch]]
    outputs = overlapped.generate(prompts, params, use_tqdm=False)
    for mine, ref in zip(outputs, mixed_reference[:batch]):
        assert mine.outputs.token_ids == ref.outputs.token_ids
        assert (mine.outputs.text, mine.outputs.finish_reason) == (ref.outputs.text, ref.outputs.finish_reason)
        if ref.outputs.logprobs is not None:
            for got, want in zip(mine.outputs.logprobs, ref.outputs.logprobs):
                assert got.keys() == want.keys() and all(abs(got[t] - want[t]) < 1e-3 for t in want)
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0
    assert not any(verified and in_flight for verified, in_flight in steps)
    assert sum(in_flight for _, in_flight in steps) > 1
    ended_verifying = {reason for reason, accepted in ends if accepted}
    assert "stop" in ended_verifying and (batch == 1 or "length" in ended_verifying)
    pool = engine.kv_cache.pool
    assert pool.num_free_blocks == pool.num_usable_blocks and not engine.scheduler.running
    assert engine.in_flight is None and engine.speculator.stats()["active_requests"] == 0
