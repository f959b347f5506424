"""Turns processed logits into target distributions and tokens: greedy, temperature, top-k,
top-p, min-p, per-request seeds.

On CUDA (with fastllm-kernels) top-k / top-p rows go through the Triton sampler, which finds
each row's cut without sorting the vocabulary; its randomness is Philox keyed by the row's
seed and its token count. Each row's argmax and log-sum-exp (every step needs both) come from
one pass of its kernels too. min_p rows, CPU tensors and draft verification use the torch path.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from types import ModuleType
from typing import Optional, Protocol

import torch

from fastllm.sampling.batch import SamplingBatch
from fastllm.sampling.logits_processors import apply_logit_edits, has_logit_edits


class GrammarMask(Protocol):
    """One step's grammar masks, filled where the grammars live (the engine's requests)."""

    def apply(self, logits: torch.Tensor, seq_ids: list[int]) -> None:
        """Set to -inf, in place, every token row ``i`` of ``logits`` may not take next, where
        ``seq_ids[i]`` (row i's sequence) is guided; other rows stay untouched."""
        ...


@dataclass
class Distribution:
    """Per row: the processed logits (edits and grammar applied, before temperature and
    truncation), their log-sum-exp, which the reported logprobs come from, and the argmax."""

    logits: torch.Tensor
    logsumexp: torch.Tensor
    greedy_tokens: torch.Tensor
    batch: SamplingBatch

    @cached_property
    def probs(self) -> Optional[torch.Tensor]:
        """The target probabilities, one-hot for greedy rows (None when every row is greedy).

        Computed only when asked for: the sort behind top-k / top-p is the costly part of a
        step's sampling, and the Triton sampler and greedy batches never need it."""
        batch = self.batch
        if batch.all_greedy:
            return None
        greedy = batch.temperature == 0.0
        scaled = self.logits / torch.where(greedy, 1.0, batch.temperature)[:, None]
        probs = mask_top_k_top_p_min_p(scaled, batch).softmax(dim=-1)
        one_hot = torch.zeros_like(probs).scatter_(-1, self.greedy_tokens[:, None], 1.0)
        return torch.where(greedy[:, None], one_hot, probs)


def mask_top_k_top_p_min_p(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Set to -inf every token outside each row's top-k, nucleus (top-p) and min-p sets."""
    if batch.any_top_k or batch.any_top_p:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
        if batch.any_top_k:
            ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
            drop |= (ranks >= batch.top_k[:, None]) & (batch.top_k[:, None] > 0)
        if batch.any_top_p:
            probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
            mass_before = probs.cumsum(dim=-1) - probs
            drop |= mass_before >= batch.top_p[:, None]
        drop[:, 0] = False
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    if batch.any_min_p:
        probs = logits.softmax(dim=-1)
        threshold = batch.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    return logits


def exponential_noise(shape: torch.Size, batch: SamplingBatch, device: torch.device) -> torch.Tensor:
    """Exp(1) noise per row; a seeded row draws only from its own generator, so its tokens
    do not depend on the rest of the batch."""
    noise = torch.empty(shape, device=device)
    seeded = [i for i, row in enumerate(batch.rows) if row.seq.generator is not None]
    if len(seeded) < len(batch.rows):
        noise.exponential_()
    for i in seeded:
        noise[i].exponential_(generator=batch.rows[i].seq.generator)
    return noise


class Sampler:
    """Logits ``[rows, vocab]`` (float32) -> one token per row, with optional top logprobs.
    ``kernels``: the platform's kernel module (``Platform.kernels()``), or None for plain torch."""

    def __init__(self, kernels: Optional[ModuleType] = None):
        self.kernels = kernels

    def distribution(self, logits: torch.Tensor, batch: SamplingBatch,
                     grammar: Optional[GrammarMask] = None) -> Distribution:
        if grammar is not None:
            logits = self._mask_and_edit(logits, batch, grammar)
        else:
            logits = apply_logit_edits(logits, batch)
        kernels = self.kernels
        if kernels is not None:  # two launches, the vocabulary spread over the GPU
            logsumexp, greedy_tokens = kernels.logsumexp_argmax(logits)
        else:
            logsumexp, greedy_tokens = logits.logsumexp(dim=-1), logits.argmax(dim=-1)
        return Distribution(logits, logsumexp, greedy_tokens, batch)

    @staticmethod
    def _mask_and_edit(logits: torch.Tensor, batch: SamplingBatch, grammar: GrammarMask) -> torch.Tensor:
        """The grammar's mask, then the edits; where the edits banned every token the grammar
        allows (min_tokens against a finished grammar that only allows EOS), the grammar wins.

        Masking and edits commute (both only add to logits or set them to -inf), so the mask is
        filled once; without edits nothing is copied and nothing waits for the device."""
        grammar.apply(logits, [row.seq.seq_id for row in batch.rows])
        if not has_logit_edits(batch):
            return logits
        edited = apply_logit_edits(logits.clone(), batch)
        dead = torch.isneginf(edited).all(dim=-1, keepdim=True)
        return torch.where(dead, logits, edited)

    def sample(self, dist: Distribution, batch: SamplingBatch) -> torch.Tensor:
        """argmax(p / E), E ~ Exp(1): an exact draw from p (the argmax itself for greedy rows)."""
        if batch.all_greedy:
            return dist.greedy_tokens
        kernels = self.kernels
        if kernels is not None and not batch.any_min_p:
            return kernels.sample_top_k_top_p(dist.logits, batch.temperature, batch.top_k, batch.top_p,
                                              batch.seeds, batch.offsets)
        noise = exponential_noise(dist.probs.shape, batch, dist.probs.device)
        sampled = (dist.probs / noise).argmax(dim=-1)
        return torch.where(batch.temperature == 0.0, dist.greedy_tokens, sampled)
