"""Turns processed logits into target distributions and tokens: greedy, temperature, top-k,
top-p, min-p, per-request seeds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from fastllm.sampling.batch import SamplingBatch
from fastllm.sampling.logits_processors import apply_logit_edits


@dataclass
class Distribution:
    """Per row: the probabilities to sample from (one-hot for greedy rows; None when every row
    is greedy) and what the reported logprobs come from: the processed logits, before
    temperature and truncation, less their log-sum-exp."""

    probs: Optional[torch.Tensor]
    logits: torch.Tensor
    logsumexp: torch.Tensor
    greedy_tokens: torch.Tensor


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
    """Logits ``[rows, vocab]`` (float32) -> one token per row, with optional top logprobs."""

    def distribution(self, logits: torch.Tensor, batch: SamplingBatch,
                     structured_output: Any = None) -> Distribution:
        if structured_output is not None and any(m is not None for m in batch.matchers):
            logits = self._edit_and_mask(logits, batch, structured_output)
        else:
            logits = apply_logit_edits(logits, batch)
        logsumexp = logits.logsumexp(dim=-1)
        greedy_tokens = logits.argmax(dim=-1)
        probs = None
        if not batch.all_greedy:
            greedy = batch.temperature == 0.0
            scaled = logits / torch.where(greedy, 1.0, batch.temperature)[:, None]
            probs = mask_top_k_top_p_min_p(scaled, batch).softmax(dim=-1)
            one_hot = torch.zeros_like(probs).scatter_(-1, greedy_tokens[:, None], 1.0)
            probs = torch.where(greedy[:, None], one_hot, probs)
        return Distribution(probs, logits, logsumexp, greedy_tokens)

    @staticmethod
    def _edit_and_mask(logits: torch.Tensor, batch: SamplingBatch, structured_output: Any) -> torch.Tensor:
        """Edits, then the grammar's mask; where the edits banned every token the grammar allows
        (min_tokens against a finished grammar that only allows EOS), the grammar wins."""
        raw = logits.clone()
        logits = apply_logit_edits(logits, batch)
        structured_output.apply_bitmask(logits, batch.matchers)
        dead = torch.isneginf(logits).all(dim=-1)
        if bool(dead.any()):
            structured_output.apply_bitmask(raw, batch.matchers)
            logits = torch.where(dead[:, None], raw, logits)
        return logits

    def sample(self, dist: Distribution, batch: SamplingBatch) -> torch.Tensor:
        """argmax(p / E), E ~ Exp(1): an exact draw from p (the argmax itself for greedy rows)."""
        if batch.all_greedy:
            return dist.greedy_tokens
        noise = exponential_noise(dist.probs.shape, batch, dist.probs.device)
        sampled = (dist.probs / noise).argmax(dim=-1)
        return torch.where(batch.temperature == 0.0, dist.greedy_tokens, sampled)
