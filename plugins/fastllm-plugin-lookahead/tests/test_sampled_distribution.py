"""Sampled requests keep their distribution through the whole engine: a tiny random model
samples thousands of short continuations with and without lookahead (drafts forced on every
step), and a two-sample chi-square test compares the sequences; seeded ones are the same."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from fastllm import LLM, SamplingParams

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 16, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
}
PROMPT = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
NUM_SAMPLES = 3000
LENGTH = 4


def two_sample_p_value(a: Counter, b: Counter, min_expected: float = 5.0) -> float:
    """Chi-square test that two samples come from one distribution; rare categories are pooled."""
    total_a, total_b = sum(a.values()), sum(b.values())
    cells, rare = [], [0, 0]
    for key in set(a) | set(b):
        pooled = (a[key] + b[key]) / (total_a + total_b)
        if pooled * min(total_a, total_b) < min_expected:
            rare[0] += a[key]
            rare[1] += b[key]
        else:
            cells.append((a[key], b[key]))
    if rare[0] + rare[1]:
        cells.append(tuple(rare))
    statistic = 0.0
    for count_a, count_b in cells:
        pooled = (count_a + count_b) / (total_a + total_b)
        statistic += (count_a - pooled * total_a) ** 2 / (pooled * total_a)
        statistic += (count_b - pooled * total_b) ** 2 / (pooled * total_b)
    dof = torch.tensor(float(len(cells) - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, torch.tensor(statistic, dtype=torch.float64) / 2))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny_llama")
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(folder)


SPEC = {"method": "lookahead", "num_speculative_tokens": 2, "min_chain_prob": 1e-9,
        "max_batch_draft_tokens": 4 * NUM_SAMPLES}


def generate(model: str, speculative_config, params) -> list:
    llm = LLM(model, load_format="dummy", max_model_len=256, num_gpu_blocks_override=512, block_size=16,
              max_num_seqs=512, speculative_config=speculative_config)
    return llm.generate([PROMPT] * NUM_SAMPLES, params, use_tqdm=False)


def sample(model: str, speculative_config, params: SamplingParams) -> tuple[Counter, int]:
    outputs = generate(model, speculative_config, params)
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    return Counter(tuple(o.outputs.token_ids) for o in outputs), accepted


# Dummy weights give logits of a few hundredths; a low temperature sharpens them so that drafts
# hold often enough for both outcomes of verification (accept; reject and keep the row's own token).
@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.02, max_tokens=LENGTH, ignore_eos=True),
    SamplingParams(temperature=0.015, top_k=5, top_p=0.9, max_tokens=LENGTH, ignore_eos=True),
], ids=["temperature", "top-k-top-p"])
def test_sampled_sequences_keep_their_distribution(tiny_model, params):
    plain, _ = sample(tiny_model, None, params)
    lookahead, accepted = sample(tiny_model, SPEC, params)
    assert accepted > NUM_SAMPLES // 10, "too few drafts held for the test to say anything"
    assert two_sample_p_value(plain, lookahead) > 1e-3


def test_seeded_sequences_are_the_same_with_drafts(tiny_model):
    variants = [{"temperature": 0.02}, {"temperature": 0.015, "top_k": 5, "top_p": 0.9},
                {"temperature": 0.03, "min_p": 0.2}]
    params = [SamplingParams(seed=i, max_tokens=LENGTH, ignore_eos=True, **variants[i % len(variants)])
              for i in range(NUM_SAMPLES)]
    plain, lookahead = generate(tiny_model, None, params), generate(tiny_model, SPEC, params)
    assert sum(o.metrics.num_accepted_tokens for o in lookahead) > NUM_SAMPLES // 10
    assert [o.outputs.token_ids for o in lookahead] == [o.outputs.token_ids for o in plain]
    assert len({tuple(o.outputs.token_ids) for o in plain}) > 20
