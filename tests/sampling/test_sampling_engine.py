"""Sampling features end to end on SmolLM2: seeds, n, logprobs, prompt logprobs, stops."""

from __future__ import annotations

import math

import pytest
import torch

from fastllm import SamplingParams
from tests.conftest import logprob_tolerance

PROMPT = "Write a short poem about the sea:"


def test_same_seed_same_output_whatever_the_batch(smollm2_llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=16)
    alone = smollm2_llm.generate([PROMPT], seeded, use_tqdm=False)[0].outputs.token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=12), seeded, SamplingParams(temperature=0.8, seed=5, max_tokens=20)]
    batch = smollm2_llm.generate(["Tell me a joke.", PROMPT, "Hello"], others, use_tqdm=False)
    assert batch[1].outputs.token_ids == alone
    different = smollm2_llm.generate([PROMPT], seeded.model_copy(update={"seed": 99}), use_tqdm=False)[0]
    assert different.outputs.token_ids != alone


def test_n_samples_are_distinct_and_indexed(smollm2_llm):
    out = smollm2_llm.generate([PROMPT], SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=12),
                               use_tqdm=False)[0]
    assert [c.index for c in out.completions] == [0, 1, 2]
    assert out.outputs is out.completions[0]
    assert len({tuple(c.token_ids) for c in out.completions}) == 3


def test_logprobs_include_sampled_token(smollm2_llm):
    out = smollm2_llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=6, logprobs=3),
                               use_tqdm=False)[0].outputs
    assert len(out.logprobs) == 6
    for token, entry in zip(out.token_ids, out.logprobs):
        assert token in entry and len(entry) in (3, 4)
        assert entry[token] == max(entry.values())  # greedy picks the most likely token
    assert math.isclose(out.cumulative_logprob, sum(e[t] for t, e in zip(out.token_ids, out.logprobs)),
                        rel_tol=1e-5)


def test_prompt_logprobs_match_hf(smollm2_llm, hf_smollm2):
    model, tokenizer = hf_smollm2
    text = "The quick brown fox jumps over the lazy dog. " * 3
    ids = tokenizer(text)["input_ids"]
    out = smollm2_llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=2),
                               use_tqdm=False)[0]
    assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
    with torch.inference_mode():
        ref = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    for i in range(1, len(ids)):
        entry = out.prompt_logprobs[i]
        assert ids[i] in entry
        assert abs(entry[ids[i]] - ref[i - 1, ids[i]].item()) < 1e-3


def test_stop_strings_and_tokens(smollm2_llm):
    base = smollm2_llm.generate(["1, 2, 3, 4, 5,"], SamplingParams(temperature=0, max_tokens=20),
                                use_tqdm=False)[0].outputs
    assert "8" in base.text
    stopped = smollm2_llm.generate(["1, 2, 3, 4, 5,"], SamplingParams(temperature=0, max_tokens=20, stop=["8"]),
                                   use_tqdm=False)[0].outputs
    assert stopped.text == base.text[: base.text.index("8")]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == "8"
    kept = smollm2_llm.generate(["1, 2, 3, 4, 5,"], SamplingParams(temperature=0, max_tokens=20, stop=["8"],
                                                                   include_stop_str_in_output=True),
                                use_tqdm=False)[0].outputs
    assert kept.text.endswith("8")
    k = next(i for i in range(1, len(base.token_ids)) if base.token_ids[i] not in base.token_ids[:i])
    token = base.token_ids[k]
    by_id = smollm2_llm.generate(["1, 2, 3, 4, 5,"], SamplingParams(temperature=0, max_tokens=20,
                                                                    stop_token_ids=[token]), use_tqdm=False)[0].outputs
    assert by_id.token_ids == base.token_ids[:k + 1] and by_id.stop_reason == token


def test_max_min_tokens_and_ignore_eos(smollm2_llm):
    prompt = "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n"
    natural = smollm2_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=200), use_tqdm=False)[0].outputs
    assert natural.finish_reason == "stop" and len(natural.token_ids) < 200
    forced = smollm2_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                                  use_tqdm=False)[0].outputs
    assert len(forced.token_ids) == 40 and forced.finish_reason == "length"
    longer = smollm2_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=60,
                                                           min_tokens=len(natural.token_ids) + 5), use_tqdm=False)[0]
    assert len(longer.outputs.token_ids) >= len(natural.token_ids) + 5


def test_bad_words_are_never_generated(smollm2_llm):
    base = smollm2_llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8),
                                use_tqdm=False)[0].outputs
    assert "Paris" in base.text
    banned = smollm2_llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8,
                                                                               bad_words=["Paris"]),
                                  use_tqdm=False)[0].outputs
    assert "Paris" not in banned.text


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_prompt_logprobs_of_a_chunked_prompt_equal_the_whole_prompts(tiny_llama_dir, async_scheduling):
    """16-token steps split the 40-token prompt over three chunks; every position is reported once."""
    from fastllm import LLM

    prompt = list(range(10, 50))
    params = SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=2)
    engine = dict(load_format="dummy", num_gpu_blocks_override=32, block_size=16)
    whole = LLM(tiny_llama_dir, **engine).generate([prompt], params, use_tqdm=False)[0].prompt_logprobs
    chunked = LLM(tiny_llama_dir, max_num_batched_tokens=16, async_scheduling=async_scheduling,
                  **engine).generate([prompt, [7, 8, 9]], params, use_tqdm=False)[0].prompt_logprobs
    assert len(whole) == len(chunked) == len(prompt) and chunked[0] is None
    for got, want in zip(chunked[1:], whole[1:]):  # on an H200 chunks and whole differ by up to 5e-4
        assert got == pytest.approx(want, **logprob_tolerance(abs=1e-3))
