"""Turns processed logits into target distributions and tokens: greedy, temperature, top-k,
top-p, min-p, per-request seeds.

Every sampled row is an exponential race, ``argmax(z - log E)`` with ``E ~ Exp(1)`` per token.
On CUDA (with fastllm-kernels) top-k / top-p rows go through the Triton sampler, which finds
each row's cut without sorting the vocabulary, with noise from Philox keyed by the row's seed
and output position. Each row's argmax and log-sum-exp (every step needs both) come from one
pass of its kernels too. min_p rows and CPU tensors use the torch path, whose seeded rows race
the same Philox noise (``fastllm.sampling.noise``); its other rows take fresh noise. Draft
verification samples its rows here too (``fastllm.spec_decode.verify``).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Optional, Protocol

import torch

from fastllm.sampling.batch import SamplingBatch
from fastllm.sampling.logits_processors import apply_logit_edits, has_logit_edits
from fastllm.sampling.noise import philox_exponential


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


def scaled_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """``z = logits * (1 / temperature)`` (as the Triton sampler computes it; greedy rows
    unscaled), -inf outside each row's top-k / top-p / min-p set: the target is ``softmax(z)``."""
    inverse = torch.where(batch.temperature == 0.0, 1.0, batch.temperature).reciprocal()
    return mask_top_k_top_p_min_p(logits * inverse[:, None], batch)


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


def race_noise(shape: torch.Size, batch: SamplingBatch, device: torch.device) -> torch.Tensor:
    """Exp(1) noise per row and token: for a seeded row, Philox keyed by its seed and output
    position, so its token depends on nothing else (not the batch, not whether drafts came
    before it); fresh draws for the other rows."""
    noise = torch.empty(shape, device=device)
    if batch.num_seeded < shape[0]:
        noise.exponential_()
    if batch.num_seeded:
        rows = batch.seeded_rows
        noise[rows] = philox_exponential(batch.seeds[rows], batch.offsets[rows], shape[1])
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
        return Distribution(logits, logsumexp, greedy_tokens)

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
        """argmax(z - log E), E ~ Exp(1): an exact draw from softmax(z) (the argmax itself for
        greedy rows). Rows are drawn independently, draft rows too."""
        if batch.all_greedy:
            return dist.greedy_tokens
        kernels = self.kernels
        if kernels is not None and not batch.any_min_p:
            return kernels.sample_top_k_top_p(dist.logits, batch.temperature, batch.top_k, batch.top_p,
                                              batch.seeds, batch.offsets)
        scaled = scaled_logits(dist.logits, batch)
        sampled = (scaled - race_noise(scaled.shape, batch, scaled.device).log()).argmax(dim=-1)
        return torch.where(batch.temperature == 0.0, dist.greedy_tokens, sampled)
