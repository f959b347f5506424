"""Lookahead changes the speed, never the text: greedy SmolLM2 output with and without it is
the same token for token, alone and in batches of 4 and 16+, and copying is where it gains."""

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
    params = SamplingParams(temperature=0.0, max_tokens=64)
    outputs = []
    for prompt in COPY_PROMPTS[:2] + FREE_PROMPTS[:1]:
        plain, lookahead = generate_both(engines, [prompt], params)
        assert lookahead[0].outputs.token_ids == plain[0].outputs.token_ids
        assert lookahead[0].outputs.text == plain[0].outputs.text
        outputs.append(lookahead[0])
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
