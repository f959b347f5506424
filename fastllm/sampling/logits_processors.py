"""Edits to raw logits before sampling: bias, bad words, min_tokens, penalties."""

from __future__ import annotations

import torch

from fastllm.platforms.transfer import to_device
from fastllm.sampling.batch import SamplingBatch

NEG_INF = float("-inf")


def apply_logit_edits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """In place on ``logits [rows, vocab]``; rows are independent of each other."""
    vocab = logits.shape[-1]
    for i in batch.edit_rows:
        row = batch.rows[i]
        params = row.seq.sampling_params
        for token_id, bias in params.logit_bias.items():
            if 0 <= token_id < vocab:
                logits[i, token_id] += bias
        for token_id in _banned_bad_words(row.seq.bad_words_token_ids, row.output_token_ids):
            logits[i, token_id] = NEG_INF
        if len(row.output_token_ids) < params.min_tokens:
            stop_ids = list(row.seq.eos_token_ids) + list(params.stop_token_ids)
            logits[i, [t for t in stop_ids if 0 <= t < vocab]] = NEG_INF
    if batch.any_penalties:
        _apply_penalties(logits, batch)
    return logits


def has_logit_edits(batch: SamplingBatch) -> bool:
    """Whether ``apply_logit_edits`` would change any row, known on the host without the logits."""
    return batch.any_penalties or bool(batch.edit_rows)


def _banned_bad_words(bad_words: list[list[int]], output: list[int]) -> list[int]:
    """The last token of each bad word whose other tokens were just generated."""
    banned = []
    for word in bad_words:
        prefix = word[:-1]
        if not prefix or output[len(output) - len(prefix):] == prefix:
            banned.append(word[-1])
    return banned


def _apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> None:
    """OpenAI presence/frequency penalties on output tokens; HF repetition penalty on all tokens."""
    vocab = logits.shape[-1]
    for i, row in enumerate(batch.rows):
        params = row.seq.sampling_params
        if not params.needs_penalties:
            continue
        output = to_device(row.output_token_ids, torch.int64, logits.device)
        if params.repetition_penalty != 1.0:
            seen = torch.cat([to_device(row.seq.prompt_token_ids, torch.int64, logits.device), output]).unique()
            seen = seen[seen < vocab]
            values = logits[i, seen]
            rp = params.repetition_penalty
            logits[i, seen] = torch.where(values > 0, values / rp, values * rp)
        if output.numel() and (params.presence_penalty or params.frequency_penalty):
            counts = torch.zeros(vocab, dtype=logits.dtype, device=logits.device)
            counts.scatter_add_(0, output, torch.ones_like(output, dtype=logits.dtype))
            logits[i] -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
