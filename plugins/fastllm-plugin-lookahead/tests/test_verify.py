"""Verification keeps the longest run of drafts its rows drew, then the token after it: greedy
rows reproduce the argmax run, and rows drawn independently (as the sampler draws them) keep
the target distribution exactly, checked token by token with a chi-square test over many draws."""

from __future__ import annotations

import torch

from fastllm.spec_decode.verify import DraftGroup, verify_drafts

VOCAB = 6


def outputs(tokens: torch.Tensor, groups: list[DraftGroup]) -> list[list[int]]:
    """Each group's accepted drafts and new token, read back as the engine reads them."""
    counts, tokens = verify_drafts(tokens, groups).tolist(), tokens.tolist()
    return [tokens[g.start:g.start + n + 1] for g, n in zip(groups, counts)]


def race(probs: torch.Tensor) -> torch.Tensor:
    """One exact draw per row, independent across rows (the sampler's exponential race)."""
    return (probs.log() - torch.empty_like(probs).exponential_().log()).argmax(dim=-1)


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """P(X >= statistic) for X ~ chi-square with (categories - 1) degrees of freedom."""
    keep = expected_probs > 0
    assert int(observed[~keep].sum()) == 0, "a token of probability zero was drawn"
    expected = expected_probs[keep] * observed.sum()
    statistic = ((observed[keep] - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(keep.sum() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, statistic.double() / 2))


def test_groups_of_different_lengths_keep_the_run_their_rows_drew():
    tokens = torch.tensor([2, 3, 5, 1, 4, 0, 3, 0, 2, 0])  # padding rows read token 0: never a draft
    groups = [DraftGroup(0, [2, 3, 5]), DraftGroup(0, [2, 4, 5]), DraftGroup(0, [0]), DraftGroup(3, []),
              DraftGroup(4, [4, 0]), DraftGroup(7, [3]), DraftGroup(9, [])]
    assert outputs(tokens, groups) == [[2, 3, 5, 1], [2, 3], [2], [1], [4, 0, 3], [0], [0]]


def test_sampled_tokens_follow_the_target_distribution():
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(3, VOCAB) * 1.5, dim=-1)
    probs[1, 4] = 0.0  # a token top-k/top-p masked out must never be drawn after a rejection
    probs[1] /= probs[1].sum()
    drafts = [int(probs[0].argmax()), int(probs[1].argmax())]
    draws = 40000
    out = outputs(race(probs.repeat(draws, 1)), [DraftGroup(3 * i, drafts) for i in range(draws)])
    # Plain sampling: token j ~ probs[j] whenever the tokens before it equal the first j drafts.
    prefix_ok = [True] * draws
    for j, target in enumerate(probs):
        tokens = [o[j] for o, ok in zip(out, prefix_ok) if ok]
        observed = torch.bincount(torch.tensor(tokens), minlength=VOCAB).double()
        assert chi_square_p_value(observed, target.double()) > 1e-3, f"position {j}"
        if j < len(drafts):
            prefix_ok = [ok and o[j] == drafts[j] for o, ok in zip(out, prefix_ok)]
    assert all(len(o) == next((j for j, (t, d) in enumerate(zip(o, drafts)) if t != d), len(drafts)) + 1
               for o in out)


def test_a_draft_holds_with_its_probability_and_leaves_the_output_unchanged():
    torch.manual_seed(1)
    probs = torch.tensor([[0.7, 0.2, 0.1, 0.0, 0.0, 0.0], [0.1, 0.1, 0.1, 0.1, 0.1, 0.5]])
    draws = 30000
    for draft, acceptance in ((2, 0.1), (4, 0.0)):
        out = outputs(race(probs.repeat(draws, 1)), [DraftGroup(2 * i, [draft]) for i in range(draws)])
        observed = torch.bincount(torch.tensor([o[0] for o in out]), minlength=VOCAB).double()
        assert chi_square_p_value(observed, probs[0].double()) > 1e-3
        assert abs(sum(len(o) == 2 for o in out) / draws - acceptance) < 0.01
