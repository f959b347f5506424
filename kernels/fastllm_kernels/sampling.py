"""Top-k / top-p sampling without sorting the vocabulary, exact in distribution.

Each row's top-k set, and the top-p set of what is left (as Hugging Face and vLLM apply
them), is every token whose ``z = logit / temperature`` is at or above some cut. A histogram
over pivots below the row max brackets the cut; the tokens in the bracket (usually a few
hundred) are copied to a small buffer, where a k-ary search finds the exact cut. An
exponential race, ``argmax(p_i / E_i)`` with ``E_i ~ Exp(1)``, then draws token ``i`` with
probability proportional to ``p_i``. Rows are spread over many programs (vocabulary slices),
so even one row uses the whole GPU. Kernels: :mod:`fastllm_kernels.sampling_kernels`.

``E_i`` comes from Philox keyed by the row's seed with counter (token, offset), so a row's
token depends only on its logits, settings, seed and offset, never on the rest of the batch.
"""

from __future__ import annotations

from typing import Optional

import torch

from fastllm_kernels.device import multiprocessors
from fastllm_kernels.host_math import cdiv, next_power_of_2
from fastllm_kernels.sampling_kernels import (_combine_greedy_kernel, _compact_or_race_kernel, _finish_kernel,
                                              _greedy_stats_kernel, _histogram_kernel, _logsumexp_argmax_kernel,
                                              _stats_kernel)

_BLOCK = 1024
_MIN_SLICE_TOKENS = 4096
_HISTOGRAM_BLOCK = 512  # its per-lane tallies are [block, 16] in registers
_NUM_BINS = 16
_NUM_PIVOTS = 8
_MAX_PASSES = 32
_CAPACITY = 8192
_GREEDY_BELOW = 1e-5


def _default_num_slices(logits: torch.Tensor, vocab: int) -> int:
    """About eight programs per multiprocessor, no slice under 4096 tokens."""
    num_sms = multiprocessors(logits.device) if logits.is_cuda else 4
    return max(1, min(cdiv(8 * num_sms, logits.shape[0]), cdiv(vocab, _MIN_SLICE_TOKENS)))


def _slices(logits: torch.Tensor, vocab: int, num_slices: Optional[int]) -> tuple[int, int]:
    """(programs a row, tokens a program) over the first ``vocab`` columns: whole loop blocks, no
    program without tokens."""
    num_slices = num_slices or _default_num_slices(logits, vocab)
    slice_len = cdiv(cdiv(vocab, num_slices), _BLOCK) * _BLOCK
    return cdiv(vocab, slice_len), slice_len


def _slices_pad(vocab: int, num_slices: int) -> int:
    """The constexpr pad of the slice count: set by the vocabulary, not the batch, so that no
    batch size compiles a variant of its own mid-run."""
    return next_power_of_2(max(num_slices, cdiv(vocab, _MIN_SLICE_TOKENS)))


def logsumexp_argmax(logits: torch.Tensor, *, num_slices: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits.logsumexp(-1), logits.argmax(-1))`` of ``logits [B, V]`` (float32) in two
    launches, the first over (row, vocabulary slice) programs: what every decode step needs
    (the greedy token and the chosen token's logprob), where torch reduces a row in one
    program and launches ~8 kernels. The argmax is the first on ties; NaN is never the max."""
    batch, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(-1) == 1
    lse = logits.new_empty(batch)
    tokens = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return lse, tokens
    stats, argmax, num_slices = _slice_stats(logits, vocab, num_slices)
    _logsumexp_argmax_kernel[(batch,)](stats, argmax, lse, tokens, num_slices=num_slices,
                                       SLICES_PAD=_slices_pad(vocab, num_slices), num_warps=1)
    return lse, tokens


def greedy_stats(logits: torch.Tensor, vocab: int, offset: int) -> torch.Tensor:
    """``[3, B]`` float32: each row's max over the first ``vocab`` columns of ``logits [B, >= vocab]``
    (float32 or 16-bit, read in place), that token's id plus ``offset``, and the log-sum-exp; a
    tensor-parallel rank's share of a greedy token, its vocabulary shard's logits (padding columns
    past ``vocab``) reduced where they are (``combine_greedy_stats`` takes every rank's)."""
    batch = logits.shape[0]
    assert logits.stride(-1) == 1 and 0 < vocab <= logits.shape[1]
    out = torch.empty((3, batch), dtype=torch.float32, device=logits.device)
    if batch:
        stats, argmax, num_slices = _slice_stats(logits, vocab, None)
        _greedy_stats_kernel[(batch,)](stats, argmax, out, batch, offset, num_slices,
                                       SLICES_PAD=_slices_pad(vocab, num_slices), num_warps=1)
    return out


def combine_greedy_stats(gathered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From every rank's ``greedy_stats`` in vocabulary order, ``[ranks, 3, B]`` (contiguous): each
    row's argmax over the whole vocabulary (int64, the lowest id among equal maxima) and its
    logprob (float32)."""
    ranks, _, batch = gathered.shape
    tokens = torch.empty(batch, dtype=torch.int64, device=gathered.device)
    logprobs = torch.empty(batch, dtype=torch.float32, device=gathered.device)
    if batch:
        _combine_greedy_kernel[(cdiv(batch, 128),)](gathered, tokens, logprobs, batch, RANKS=ranks, BLOCK=128,
                                                    num_warps=4)
    return tokens, logprobs


def _slice_stats(logits: torch.Tensor, vocab: int,
                 num_slices: Optional[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Every (row, vocabulary slice)'s max, softmax sum about it and first argmax (``_row_stats``
    combines them), over the first ``vocab`` columns of the logits themselves."""
    batch = logits.shape[0]
    num_slices, slice_len = _slices(logits, vocab, num_slices)
    stats = torch.empty((batch, num_slices, 4), dtype=torch.float32, device=logits.device)
    argmax = torch.empty((batch, num_slices), dtype=torch.int32, device=logits.device)
    _stats_kernel[(batch, num_slices)](logits, logits, logits, logits, stats, argmax, logits.stride(0), vocab,
                                       slice_len, _GREEDY_BELOW, BLOCK=_BLOCK, SCALED=False, num_warps=8)
    return stats, argmax, num_slices


def sample_top_k_top_p(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                       top_p: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor, *,
                       num_slices: Optional[int] = None) -> torch.Tensor:
    """One token per row of ``logits [B, V]`` (float32), as int64 ``[B]``.

    Per row: ``temperature`` < 1e-5 is greedy (argmax, first on ties); otherwise a draw from
    ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens
    (``top_k`` <= 0 is off) and then to the smallest most-likely set of mass >= ``top_p`` of
    what is left (1.0 is off). ``seeds`` and ``offsets`` (int64) are the row's only randomness.
    ``num_slices`` (programs per row) overrides the default, which depends only on shapes.
    """
    batch, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(-1) == 1
    tokens = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return tokens
    num_slices, slice_len = _slices(logits, vocab, num_slices)
    settings = (temperature.to(torch.float32), top_k.to(torch.int32), top_p.to(torch.float32))
    randomness = (seeds.to(torch.int64), offsets.to(torch.int64))
    empty = logits.new_empty
    stats, argmax = empty((batch, num_slices, 4)), empty((batch, num_slices), dtype=torch.int32)
    counts = empty((batch, num_slices, _NUM_BINS), dtype=torch.int32)
    masses = empty((batch, num_slices, _NUM_BINS))
    buffer_z, buffer_token = empty((batch, _CAPACITY)), empty((batch, _CAPACITY), dtype=torch.int32)
    race, race_token = empty((batch, num_slices)), empty((batch, num_slices), dtype=torch.int32)
    grid = (batch, num_slices)
    shared = dict(num_slices=num_slices, SLICES_PAD=_slices_pad(vocab, num_slices),
                  NUM_BINS=_NUM_BINS)

    _stats_kernel[grid](logits, *settings, stats, argmax, logits.stride(0), vocab, slice_len,
                        _GREEDY_BELOW, BLOCK=_BLOCK, SCALED=True, num_warps=8)
    _histogram_kernel[grid](logits, *settings, stats, argmax, counts, masses, logits.stride(0),
                            vocab, slice_len, _GREEDY_BELOW, BLOCK=_HISTOGRAM_BLOCK, **shared,
                            num_warps=8)
    _compact_or_race_kernel[grid](logits, *settings, *randomness, stats, argmax, counts, masses,
                                  buffer_z, buffer_token, race, race_token, logits.stride(0),
                                  vocab, slice_len, _GREEDY_BELOW, CAPACITY=_CAPACITY, BLOCK=_BLOCK,
                                  **shared, num_warps=8)
    _finish_kernel[(batch,)](logits, *settings, *randomness, stats, argmax, counts, masses,
                             buffer_z, buffer_token, race, race_token, tokens, logits.stride(0),
                             vocab, _GREEDY_BELOW, CAPACITY=_CAPACITY, NUM_PIVOTS=_NUM_PIVOTS,
                             MAX_PASSES=_MAX_PASSES, BLOCK=_BLOCK, **shared, num_warps=8)
    return tokens


def top_k_top_p_probs_ref(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                          top_p: torch.Tensor) -> torch.Tensor:
    """The exact distribution :func:`sample_top_k_top_p` draws from, per row (float64;
    one-hot on the argmax for greedy rows)."""
    logits = logits.double()
    greedy = temperature < _GREEDY_BELOW
    scaled = logits / torch.where(greedy, 1.0, temperature.double())[:, None]
    ordered, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    drop = (ranks >= top_k[:, None]) & (top_k[:, None] > 0)
    probs = ordered.masked_fill(drop, float("-inf")).softmax(dim=-1)
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None].double()
    drop[:, 0] = False
    probs = ordered.masked_fill(drop, float("-inf")).softmax(dim=-1)
    probs = torch.empty_like(probs).scatter_(-1, order, probs)
    one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy[:, None], one_hot, probs)
