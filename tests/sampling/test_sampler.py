"""Sampler units on small vocabularies: truncation sets, exact distributions, penalties."""

from __future__ import annotations

import pytest
import torch

from fastllm.engine.grammars import GrammarMasks
from fastllm.sampling.batch import SamplingBatch, SamplingRow
from fastllm.sampling.logits_processors import apply_logit_edits
from fastllm.sampling.noise import philox_exponential
from fastllm.sampling.sampler import Sampler, mask_top_k_top_p_min_p, scaled_logits
from fastllm.sampling_params import SamplingParams
from fastllm.worker.input_batch import SequenceState


def _batch(params: list[SamplingParams], outputs: list[list[int]] | None = None, prompt=(5, 6)) -> SamplingBatch:
    rows = []
    for i, p in enumerate(params):
        out = (outputs or [[]] * len(params))[i]
        seed = 0 if p.seed is None else p.seed
        seq = SequenceState(i, "r", 0, list(prompt), p, seed, eos_token_ids=frozenset({0}), output_token_ids=list(out))
        rows.append(SamplingRow(seq, list(out)))
    return SamplingBatch.build(rows, torch.device("cpu"))


def test_top_k_top_p_min_p_sets():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]] * 3))
    batch = _batch([SamplingParams(top_k=2), SamplingParams(top_p=0.8), SamplingParams(min_p=0.25)])
    kept = torch.isfinite(mask_top_k_top_p_min_p(logits, batch))
    assert kept[0].tolist() == [True, True, False, False, False]
    assert kept[1].tolist() == [True, True, True, False, False]  # 0.5+0.2 < 0.8 <= 0.85
    assert kept[2].tolist() == [True, True, True, False, False]  # >= 0.25 * 0.5


def test_sampling_matches_target_distribution():
    torch.manual_seed(0)
    logits = torch.randn(1, 8) * 2
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=6)
    batch = _batch([params])
    target = mask_top_k_top_p_min_p(logits / 0.7, batch).softmax(-1)[0]
    sampler = Sampler()
    draws = 20000
    counts = torch.zeros(8)
    big = _batch([params] * draws)
    dist = sampler.distribution(logits.repeat(draws, 1), big)
    for token in sampler.sample(dist, big).tolist():
        counts[token] += 1
    tv = 0.5 * (counts / draws - target).abs().sum().item()
    assert tv < 0.02, f"total variation {tv:.4f} between sampled and target distribution"
    assert counts[target == 0].sum() == 0


def test_seeded_rows_do_not_depend_on_the_batch():
    sampler = Sampler()
    logits = torch.randn(3, 50)
    alone = _batch([SamplingParams(temperature=1.0, seed=7)])
    mixed = _batch([SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, seed=7), SamplingParams()])
    a = sampler.sample(sampler.distribution(logits[1:2].clone(), alone), alone)
    b = sampler.sample(sampler.distribution(logits.clone(), mixed), mixed)
    assert a.item() == b[1].item()


def test_seeded_noise_is_exact_and_keyed_by_seed_and_position_alone():
    """The exponential race with a seeded row's noise, over many output positions, draws the
    target distribution; the same (seed, position) gives the same noise in any batch."""
    torch.manual_seed(2)
    logits = torch.randn(1, 8) * 2
    params = SamplingParams(temperature=0.8, top_k=6, seed=11)
    target = scaled_logits(logits, _batch([params]))[0].softmax(-1)
    draws = 20000
    noise = philox_exponential(torch.full((draws,), 11), torch.arange(draws), 8)
    tokens = (scaled_logits(logits, _batch([params]))[0] - noise.log()).argmax(dim=-1)
    empirical = torch.bincount(tokens, minlength=8).double() / draws
    assert 0.5 * (empirical - target).abs().sum().item() < target.sqrt().sum().item() / draws ** 0.5
    assert empirical[target == 0].sum() == 0
    some = philox_exponential(torch.tensor([3, 11, 11]), torch.tensor([5, 17, 2**40 + 17]), 8)
    assert torch.equal(some[1], noise[17]) and not torch.equal(some[0], noise[5])
    assert not torch.equal(some[2], noise[17])


def test_every_column_of_the_batch_is_aligned_for_the_kernels():
    """The Triton sampler is compiled once per pointer alignment, so each column of every batch
    starts 16 bytes aligned whatever the row count."""
    for n in range(1, 8):
        batch = _batch([SamplingParams(temperature=0.5, top_p=0.9, min_p=0.1, seed=i) for i in range(n)],
                       outputs=[[1] * i for i in range(n)])
        columns = [batch.temperature, batch.top_p, batch.top_k, batch.min_p, batch.seeds, batch.offsets]
        assert all(c.data_ptr() % 16 == 0 and c.shape == (n,) for c in columns)
        assert batch.offsets.tolist() == list(range(n)) and batch.seeds.tolist() == list(range(n))
        assert batch.seeded_rows.tolist() == list(range(n)) and batch.top_p.tolist() == [pytest.approx(0.9)] * n


def test_penalties_match_reference_formulas():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0]])
    params = SamplingParams(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_logit_edits(logits.clone(), _batch([params], [[3, 3, 4]], prompt=(0, 1)))
    expected = logits.clone()[0]
    for t in {0, 1, 3, 4}:  # prompt + output: HF repetition penalty
        expected[t] = expected[t] / 1.5 if expected[t] > 0 else expected[t] * 1.5
    expected[3] -= 0.25 * 2 + 0.5
    expected[4] -= 0.25 * 1 + 0.5
    torch.testing.assert_close(out[0], expected)


def test_min_tokens_bias_and_bad_words():
    logits = torch.zeros(1, 10)
    params = SamplingParams(min_tokens=3, stop_token_ids=[5], logit_bias={7: 4.0})
    batch = _batch([params], [[1]])
    batch.rows[0].seq.bad_words_token_ids = [[8], [1, 9]]
    out = apply_logit_edits(logits, batch)[0]
    assert out[0] == float("-inf") and out[5] == float("-inf")  # eos and stop id before min_tokens
    assert out[7] == 4.0
    assert out[8] == float("-inf") and out[9] == float("-inf")  # [1, 9]: 1 was just generated


def _seeded_batch(params: SamplingParams, draws: int, outputs: list[int], device: torch.device) -> SamplingBatch:
    """``draws`` rows of ``params`` seeded 0, 1, ..., then a greedy row, each with ``outputs`` generated."""
    batch = _batch([params] * draws + [SamplingParams(temperature=0.0)], outputs=[outputs] * (draws + 1))
    for i, row in enumerate(batch.rows):
        row.seq.seed = i
    return SamplingBatch.build(batch.rows, device)


def test_triton_sampler_path_draws_the_torch_target_distribution():
    """With the kernels forced on (Triton's interpreter here), top-k / top-p rows go through
    fastllm-kernels' sampler: same support and distribution as the torch path, greedy rows
    their argmax, a row's token fixed by its seed and token count alone. The interpreter runs
    a program a row, so the draws are few and the bound loose (about 2.5 times the expected
    total variation); kernels/tests/test_sampling.py checks the distribution itself closely.
    The redraws use the first few seeds only: a row's token depends on neither the batch's
    size nor its other rows, so those rows must repeat (or move) as they would in the full batch."""
    import fastllm_kernels

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # no interpreter where CUDA is
    torch.manual_seed(1)
    logits = (torch.randn(1, 32) * 2).to(device)
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=10)
    draws, redraws = 96, 8
    sampler = Sampler(fastllm_kernels)

    def sample(batch: SamplingBatch) -> torch.Tensor:
        return sampler.sample(sampler.distribution(logits.repeat(len(batch.rows), 1), batch), batch)

    batch = _seeded_batch(params, draws, [], device)
    dist = sampler.distribution(logits.repeat(draws + 1, 1), batch)
    target = scaled_logits(dist.logits, batch)[0].softmax(-1)  # the torch path's distribution
    tokens = sampler.sample(dist, batch)
    assert tokens[-1].item() == logits.argmax().item()
    counts = torch.bincount(tokens[:-1], minlength=32).double()
    assert counts[target == 0].sum() == 0
    tv = 0.5 * (counts / draws - target.double()).abs().sum().item()
    bound = target.double().sqrt().sum().item() / draws ** 0.5
    assert tv < bound, f"total variation {tv:.4f} over the bound {bound:.4f}"
    again = sample(_seeded_batch(params, redraws, [], device))
    assert torch.equal(again[:-1], tokens[:redraws]) and again[-1] == tokens[-1]
    moved = sample(_seeded_batch(params, redraws, [3], device))
    assert not torch.equal(moved[:-1], tokens[:redraws])  # the next token count is a fresh draw


def test_seeded_rows_draw_the_same_tokens_on_the_torch_and_triton_paths():
    """Both paths race Philox noise keyed by the seed and the output position, so a seeded row's
    token does not depend on which one drew it (a min_p row elsewhere sends a whole CUDA batch
    down the torch path)."""
    import fastllm_kernels

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(3)
    rows = 24
    logits = (torch.randn(rows, 64) * 2).to(device)
    params = [SamplingParams(temperature=0.5 + 0.05 * i, top_k=(0, 5, 20)[i % 3], top_p=(1.0, 0.9)[i % 2],
                             seed=1000 + i) for i in range(rows)]
    batch = _batch(params, outputs=[[1] * (i % 5) for i in range(rows)])
    batch = SamplingBatch.build(batch.rows, device)
    drawn = [sampler.sample(sampler.distribution(logits.clone(), batch), batch)
             for sampler in (Sampler(), Sampler(fastllm_kernels))]
    assert torch.equal(drawn[0], drawn[1])
    assert len(set(drawn[0].tolist())) > 5


class _AllowList:
    """A structured-output backend whose matcher is just the set of tokens it allows."""

    def __init__(self):
        self.calls = 0

    def apply_bitmask(self, logits: torch.Tensor, matchers) -> None:
        self.calls += 1
        for row, allowed in enumerate(matchers):
            if allowed is not None:
                banned = [t for t in range(logits.shape[-1]) if t not in allowed]
                logits[row, banned] = float("-inf")


def test_grammar_mask_with_edits_equals_edits_then_mask_and_the_grammar_wins_a_dead_row():
    params = [SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5),
              SamplingParams(logit_bias={2: 3.0, 4: -1.0}),
              SamplingParams(min_tokens=4, stop_token_ids=[3]),  # the grammar allows only 0 and 3: dead
              SamplingParams(),
              SamplingParams(min_tokens=4)]
    allowed = [{1, 2, 5}, {2, 3, 4}, {0, 3}, None, {0, 6}]
    batch = _batch(params, [[1, 5, 1], [], [2], [], [6]])
    logits = torch.randn(len(params), 8, generator=torch.Generator().manual_seed(3))
    reference = apply_logit_edits(logits.clone(), batch)
    _AllowList().apply_bitmask(reference, allowed)
    grammar_only = logits.clone()
    _AllowList().apply_bitmask(grammar_only, allowed)
    reference[2] = grammar_only[2]
    backend = _AllowList()
    grammar = GrammarMasks(backend, {row.seq.seq_id: tokens for row, tokens in zip(batch.rows, allowed) if tokens})
    dist = Sampler().distribution(logits.clone(), batch, grammar)
    torch.testing.assert_close(dist.logits, reference)
    assert backend.calls == 1
    assert dist.greedy_tokens[2].item() in {0, 3}


def test_grammar_rows_without_edits_are_masked_in_place():
    batch = _batch([SamplingParams(), SamplingParams()])
    logits = torch.randn(2, 6, generator=torch.Generator().manual_seed(4))
    raw = logits.clone()
    dist = Sampler().distribution(logits, batch, GrammarMasks(_AllowList(), {batch.rows[0].seq.seq_id: {1, 2}}))
    assert dist.logits.data_ptr() == logits.data_ptr()
    assert torch.isfinite(dist.logits[0]).nonzero().flatten().tolist() == [1, 2]
    assert torch.equal(dist.logits[1], raw[1])
