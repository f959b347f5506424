"""Vocabulary-parallel token embedding and LM head."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from fastllm.distributed.parallel_state import (all_gather_last_dim, all_reduce, gather_over_ranks, greedy_over_shards,
                                                tp_rank, tp_size)
from fastllm.layers.fused import current_kernels


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary."""

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.shard_size = -(-vocab_size // tp_size())
        self.start = tp_rank() * self.shard_size
        self.weight = nn.Parameter(torch.empty(self.shard_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        shard = loaded[self.start:self.start + self.shard_size]
        param.data.zero_()
        param.data[: shard.shape[0]].copy_(shard)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if tp_size() == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        inside = (local >= 0) & (local < self.shard_size)
        out = F.embedding(local.clamp(0, self.shard_size - 1), self.weight) * inside.unsqueeze(-1)
        return all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Hidden states -> logits over the full vocabulary (gathered across ranks).

    ``quantized``, when a quantizer set it (``quantize_lm_head``), computes this rank's logits
    in the float weight's place. The platform's kernels, where it has them, run the float product:
    at batch-1 decode a one-row GEMV streams the head faster than a BLAS call."""

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__(vocab_size, hidden_size)
        self.quantized: Optional[nn.Module] = None
        self.kernels = current_kernels()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = all_gather_last_dim(self._local_logits(hidden))
        return logits[..., : self.vocab_size]

    def greedy(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's argmax over the whole vocabulary (int64) and its logprob (float32), the
        ranks exchanging three numbers a row of their shards instead of the logits."""
        local = self._local_logits(hidden)
        vocab = min(local.shape[-1], self.vocab_size - self.start)  # no padding columns
        if self.kernels is not None:  # two launches on the shard as it is, one to combine
            stats = self.kernels.greedy_stats(local, vocab, self.start)
            return self.kernels.combine_greedy_stats(gather_over_ranks(stats))
        local = local[:, :vocab].float()
        lse, token = local.logsumexp(dim=-1), local.argmax(dim=-1)
        stats = torch.stack([local.gather(-1, token[:, None]).squeeze(-1), (token + self.start).float(), lse])
        return greedy_over_shards(gather_over_ranks(stats))

    def _local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the logits (padding columns included)."""
        if self.quantized is not None:
            return self.quantized(hidden)
        if self.kernels is not None:
            return self.kernels.linear(hidden, self.weight)
        return F.linear(hidden, self.weight)
