import numpy as np
import pytest
import torch

from fastllm_kernels import sampling
from fastllm_kernels.sampling import (combine_greedy_stats, greedy_stats, logsumexp_argmax, sample_top_k_top_p,
                                      top_k_top_p_probs_ref)
from kernel_testing import DEVICE, DTYPES
from philox_noise import exponential_noise


def settings(temperature, top_k, top_p, seeds, offsets):
    return (torch.tensor(temperature, dtype=torch.float32, device=DEVICE),
            torch.tensor(top_k, dtype=torch.int32, device=DEVICE),
            torch.tensor(top_p, dtype=torch.float32, device=DEVICE),
            torch.tensor(seeds, dtype=torch.int64, device=DEVICE),
            torch.tensor(offsets, dtype=torch.int64, device=DEVICE))


def test_greedy_rows_take_the_first_argmax():
    logits = torch.randn(4, 3000, device=DEVICE)
    logits[1, 2500] = logits[1, 700] = 50.0  # a tie across chunks: the first index wins
    logits[2, :1500] = float("-inf")
    args = settings([0.0, 1e-6, 0.0, 0.0], [0, 5, -1, 3], [1.0, 0.5, 1.0, 0.9], [1, 2, 3, 4], [0] * 4)

    tokens = sample_top_k_top_p(logits, *args)

    assert tokens.tolist() == logits.argmax(dim=-1).tolist()
    assert tokens[1] == 700


@pytest.mark.parametrize("num_slices", [None, 1, 3])
def test_logsumexp_argmax_match_torch(num_slices):
    """Slices' maxima and sums combined: ties across slices (the first index wins), a row of
    -inf (log-sum-exp -inf, token 0, as torch), a row with a single finite logit."""
    logits = 4 * torch.randn(5, 3000, device=DEVICE)
    logits[1, 2500] = logits[1, 700] = 50.0
    logits[2] = float("-inf")
    logits[3] = float("-inf")
    logits[3, 2999] = -7.0
    lse, tokens = logsumexp_argmax(logits, num_slices=num_slices)
    assert tokens.tolist() == logits.argmax(dim=-1).tolist() and tokens[1] == 700
    assert torch.allclose(lse, logits.double().logsumexp(dim=-1).float(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_stats_read_the_shard_in_place(dtype):
    """A vocabulary shard's logits as the LM head leaves them (16-bit, padding columns past the
    vocabulary holding the largest values): max, token id plus the shard's offset, log-sum-exp,
    all over the real columns only, against float64."""
    logits = (4 * torch.randn(4, 5000, device=DEVICE)).to(dtype)
    logits[:, 4600:] = 100.0  # padding: must never win nor count
    logits[1, 4000] = logits[1, 900] = 60.0  # a tie across slices: the first index wins
    logits[2, :4600] = float("-inf")
    real = logits[:, :4600].double()

    stats = greedy_stats(logits, 4600, 10_000)

    assert stats.shape == (3, 4) and stats.dtype == torch.float32
    assert stats[1].long().tolist() == (real.argmax(dim=-1) + 10_000).tolist() and stats[1, 1] == 10_900
    assert torch.equal(stats[0], real.max(dim=-1).values.float())
    assert torch.allclose(stats[2], real.logsumexp(dim=-1).float(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_combined_greedy_stats_equal_one_argmax_over_the_vocabulary(ranks):
    """Every rank's ``greedy_stats`` of its shard, combined: the argmax and its logprob over the
    whole vocabulary; equal maxima in two shards go to the lower ids, as one argmax would."""
    vocab = 700 * ranks
    logits = 3 * torch.randn(300, vocab, device=DEVICE)  # more rows than one program's block
    logits[0, vocab - 1] = logits[0, 0] = 40.0
    logits[1, :] = float("-inf")
    logits[1, vocab - 5] = 2.0
    shards = logits.split(700, dim=-1)
    gathered = torch.stack([greedy_stats(shard, 700, 700 * rank) for rank, shard in enumerate(shards)])

    tokens, logprobs = combine_greedy_stats(gathered)

    reference = logits.double()
    assert tokens.tolist() == reference.argmax(dim=-1).tolist() and tokens[0] == 0
    expected = reference.max(dim=-1).values - reference.logsumexp(dim=-1)
    assert torch.allclose(logprobs.double(), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("num_slices,capacity", [(1, None), (3, None), (2, 64)])
def test_tokens_are_the_race_over_the_reference_distribution(monkeypatch, num_slices, capacity):
    """With the kernel's noise recomputed, each row's token is predicted exactly: the cut
    (top-k, then top-p of what is left) and the race are both checked, row by row. A small
    candidate buffer sends most filtered rows down the whole-row path."""
    if capacity:
        monkeypatch.setattr(sampling, "_CAPACITY", capacity)
    rows, vocab = 12, 2500  # three chunks of the kernel's loop
    logits = 3 * torch.randn(rows, vocab, device=DEVICE)
    logits[3, ::2] = float("-inf")  # masked tokens are never drawn
    temperature = torch.empty(rows).uniform_(0.3, 1.5).tolist()
    top_k = [0, 1, 5, 40, -1, 2500, 7, 0, 100, 3, 0, 20]
    top_p = [1.0, 1.0, 1.0, 0.9, 0.5, 0.8, 0.6, 0.95, 1.0, 0.99, 0.2, 1.0]
    seeds = torch.randint(0, 2**62, (rows,)).tolist()
    offsets = torch.randint(0, 2**40, (rows,)).tolist()
    args = settings(temperature, top_k, top_p, seeds, offsets)

    tokens = sample_top_k_top_p(logits, *args, num_slices=num_slices)

    probs = top_k_top_p_probs_ref(logits, *args[:3]).cpu().numpy()
    for row in range(rows):
        noise = exponential_noise(seeds[row], offsets[row], vocab)
        with np.errstate(divide="ignore"):
            expected = np.argmax(np.log(probs[row]) - np.log(noise))
        assert tokens[row].item() == expected, f"row {row}"


def test_a_row_ignores_the_rest_of_the_batch():
    logits = torch.randn(6, 500, device=DEVICE)
    args = settings([0.9] * 6, [0, 10, 0, 10, 0, 10], [1.0, 1.0, 0.9, 0.9, 0.7, 0.7],
                    [11, 12, 13, 14, 15, 16], [5, 6, 7, 8, 9, 10])
    order = torch.tensor([4, 0, 5, 2, 1, 3], device=DEVICE)

    tokens = sample_top_k_top_p(logits, *args)
    shuffled = sample_top_k_top_p(logits[order], *(a[order] for a in args))
    alone = sample_top_k_top_p(logits[2:3], *(a[2:3] for a in args))

    assert torch.equal(shuffled, tokens[order])
    assert alone.item() == tokens[2].item()


# A fixed row, so these statistics are deterministic. The interpreter is slow: on the CPU
# only the filtered case runs, with few draws; the exact-token test above carries the weight.
ROW = 2 * torch.randn(40, generator=torch.Generator().manual_seed(0))
CASES = [(0.8, 0, 1.0), (1.2, 6, 0.85)] if DEVICE.type == "cuda" else [(1.2, 6, 0.85)]


def total_variation_bound(probs: torch.Tensor, draws: int) -> float:
    """About 2.5 times the expected total variation of ``draws`` exact samples."""
    return probs.sqrt().sum().item() / draws ** 0.5


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_empirical_distribution_matches_the_reference(temperature, top_k, top_p):
    """Many draws of one row with different offsets, against the exact distribution."""
    draws = 20000 if DEVICE.type == "cuda" else 150
    args = settings([temperature] * draws, [top_k] * draws, [top_p] * draws, [7] * draws,
                    list(range(draws)))
    row = ROW.to(DEVICE)

    tokens = sample_top_k_top_p(row.expand(draws, -1).contiguous(), *args)

    probs = top_k_top_p_probs_ref(row[None], *(a[:1] for a in args[:3]))[0].cpu()
    empirical = torch.bincount(tokens.cpu(), minlength=40).double() / draws
    assert 0.5 * (empirical - probs).abs().sum().item() < total_variation_bound(probs, draws)


def test_the_race_with_this_noise_is_exact_in_distribution():
    """The noise the kernel uses (recomputed in NumPy, proven identical above), raced over
    the reference distribution, reproduces it: with the exact-token test, this shows the
    kernel samples exactly."""
    draws = 20000
    probs = top_k_top_p_probs_ref(ROW[None], torch.ones(1), torch.zeros(1, dtype=torch.int32),
                                  torch.ones(1))[0]
    noise = exponential_noise(7, np.arange(draws), 40)
    scores = np.log(probs.numpy())[None, :] - np.log(noise)
    empirical = np.bincount(scores.argmax(axis=1), minlength=40) / draws
    assert 0.5 * np.abs(empirical - probs.numpy()).sum() < total_variation_bound(probs, draws)
