"""Verification keeps the target distribution exactly: greedy runs, and sampled draws checked
against p token by token with a chi-square test over many draws."""

from __future__ import annotations

import torch

from fastllm.spec_decode.verify import DraftGroup
from fastllm.spec_decode.verify import verify_drafts as verify_on_device

VOCAB = 6


def verify_drafts(probs: torch.Tensor, greedy: torch.Tensor, groups: list[DraftGroup]) -> list[list[int]]:
    """Each group's accepted drafts and new token, read back as the engine reads them."""
    verified = verify_on_device(None if all(g.greedy for g in groups) else probs, greedy, groups)
    tokens, counts = verified.tokens.tolist(), verified.num_accepted.tolist()
    return [tokens[g.start:g.start + n + 1] for g, n in zip(groups, counts)]


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """P(X >= statistic) for X ~ chi-square with (categories - 1) degrees of freedom."""
    keep = expected_probs > 0
    assert int(observed[~keep].sum()) == 0, "a token of probability zero was drawn"
    expected = expected_probs[keep] * observed.sum()
    statistic = ((observed[keep] - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(keep.sum() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, statistic.double() / 2))


def test_greedy_accepts_the_longest_run_that_matches_the_argmax():
    probs = torch.eye(VOCAB)[[2, 3, 5, 1]]
    greedy = probs.argmax(dim=-1)
    groups = [DraftGroup(0, [2, 3, 5], True), DraftGroup(0, [2, 4, 5], True), DraftGroup(0, [0], True),
              DraftGroup(3, [], True)]
    assert verify_drafts(probs, greedy, groups) == [[2, 3, 5, 1], [2, 3], [2], [1]]


def test_sampled_tokens_follow_the_target_distribution():
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(3, VOCAB) * 1.5, dim=-1)
    probs[1, 4] = 0.0  # a token top-k/top-p masked out must never come back from the residual
    probs[1] /= probs[1].sum()
    drafts = [int(probs[0].argmax()), int(probs[1].argmax())]
    draws = 40000
    rows = probs.repeat(draws, 1)
    groups = [DraftGroup(3 * i, drafts, False) for i in range(draws)]
    out = verify_drafts(rows, rows.argmax(dim=-1), groups)
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


def test_unlikely_and_impossible_drafts_leave_the_output_unchanged():
    torch.manual_seed(1)
    probs = torch.tensor([[0.7, 0.2, 0.1, 0.0, 0.0, 0.0], [0.1, 0.1, 0.1, 0.1, 0.1, 0.5]])
    draws = 30000
    rows = probs.repeat(draws, 1)
    for draft, acceptance in ((2, 0.1), (4, 0.0)):
        groups = [DraftGroup(2 * i, [draft], False) for i in range(draws)]
        out = verify_drafts(rows, rows.argmax(dim=-1), groups)
        observed = torch.bincount(torch.tensor([o[0] for o in out]), minlength=VOCAB).double()
        assert chi_square_p_value(observed, probs[0].double()) > 1e-3
        assert abs(sum(len(o) == 2 for o in out) / draws - acceptance) < 0.01


def test_seeded_sequences_repeat_their_draws():
    probs = torch.softmax(torch.randn(4, VOCAB), dim=-1)

    def run(seed: int) -> list[list[int]]:
        groups = [DraftGroup(0, [1, 2, 3], False, torch.Generator().manual_seed(seed))]
        return verify_drafts(probs, probs.argmax(dim=-1), groups)

    assert run(7) == run(7)
    assert len({tuple(run(seed)[0]) for seed in range(40)}) > 1


def test_greedy_and_sampled_groups_of_different_lengths_share_one_step():
    """Certain outcomes (probabilities 0 or 1) make a mixed step's answer exact."""
    probs = torch.eye(VOCAB)[[2, 3, 5, 1, 4, 0, 3, 0, 2, 0]]  # one-hot rows; padding reads token 0
    probs[7] = torch.tensor([0.0, 0.5, 0.0, 0.0, 0.0, 0.5])  # sampled, its draft 3 impossible there
    groups = [DraftGroup(0, [2, 3, 0], True), DraftGroup(4, [4, 0], False), DraftGroup(7, [3], False),
              DraftGroup(9, [], False)]
    out = verify_drafts(probs, probs.argmax(dim=-1), groups)
    assert out[:2] == [[2, 3, 5], [4, 0, 3]] and out[3] == [0]
    assert out[2] in ([1], [5])
