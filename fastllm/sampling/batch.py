"""The sampling parameters of one step's rows, as tensors, built once per step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import torch

from fastllm.platforms.transfer import to_device
from fastllm.sampling_params import SamplingParams


class SampledSequence(Protocol):
    """What sampling reads of a row's sequence (the runner's ``SequenceState`` is one)."""

    seq_id: int
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int  # the sampler's Philox key (with ``sampling_params.seed``: that seed, plus the sample's index)
    eos_token_ids: frozenset[int]
    bad_words_token_ids: list[list[int]]
    num_pending_tokens: int  # sampled on the device, not read yet: they follow the row's tokens


@dataclass
class SamplingRow:
    """One row of logits to sample: its sequence and the tokens generated before it.

    With speculative decoding a sequence owns several rows; row j sees its accepted
    output plus the first j draft tokens.
    """

    seq: SampledSequence
    output_token_ids: list[int]


@dataclass
class SamplingBatch:
    rows: list[SamplingRow]
    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor
    all_greedy: bool
    any_top_p: bool
    any_top_k: bool
    any_min_p: bool
    any_penalties: bool
    seeds: Optional[torch.Tensor] = None  # int64, each row's sequence seed (None: all greedy)
    offsets: Optional[torch.Tensor] = None  # int64, tokens before the row's: its output position
    seeded_rows: Optional[torch.Tensor] = None  # int64, the sampled rows whose request has a seed
    num_seeded: int = 0

    @classmethod
    def build(cls, rows: list[SamplingRow], device: torch.device) -> "SamplingBatch":
        params = [r.seq.sampling_params for r in rows]
        temperature = [0.0 if p.greedy else p.temperature for p in params]
        top_k = [p.top_k if p.top_k > 0 else 0 for p in params]
        n = len(rows)
        # Columns start 16 bytes apart at least: Triton compiles a kernel once per pointer
        # alignment, so without the padding a new row count could cost a compile mid-serving.
        pad = [0] * (-n % 4)
        width = n + len(pad)
        # one copy for the four columns; float32 holds every top_k below 2**24 exactly
        table = to_device(temperature + pad + [p.top_p for p in params] + pad + top_k + pad
                          + [p.min_p for p in params] + pad, torch.float32, device).view(4, width)[:, :n]
        all_greedy = all(t == 0.0 for t in temperature)
        seeded = [i for i, (p, t) in enumerate(zip(params, temperature)) if p.seed is not None and t > 0.0]
        randomness = None if all_greedy else to_device(
            [r.seq.seed for r in rows] + pad + [len(r.output_token_ids) + r.seq.num_pending_tokens for r in rows]
            + pad + seeded, torch.int64, device)
        return cls(
            rows=rows,
            temperature=table[0],
            top_p=table[1],
            top_k=table[2].long(),
            min_p=table[3],
            all_greedy=all_greedy,
            any_top_p=any(p.top_p < 1.0 for p in params),
            any_top_k=any(k > 0 for k in top_k),
            any_min_p=any(p.min_p > 0.0 for p in params),
            any_penalties=any(p.needs_penalties for p in params),
            seeds=None if randomness is None else randomness[:n],
            offsets=None if randomness is None else randomness[width:width + n],
            seeded_rows=None if randomness is None else randomness[2 * width:],
            num_seeded=len(seeded),
        )
