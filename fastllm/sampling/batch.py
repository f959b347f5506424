"""The sampling parameters of one step's rows, as tensors, built once per step."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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
    edit_rows: tuple[int, ...] = ()  # rows with a logit bias, bad words or min_tokens still counting
    may_edit: tuple[int, ...] = ()  # rows whose request has a logit bias, bad words or min_tokens
    seeded: list[int] = field(default_factory=list)  # seeded_rows on the host

    @property
    def num_seeded(self) -> int:
        return len(self.seeded)

    @classmethod
    def build(cls, rows: list[SamplingRow], device: torch.device,
              previous: Optional["SamplingBatch"] = None) -> "SamplingBatch":
        """The step's columns, in one copy to the device. Where ``previous`` (the step before's
        batch) sampled the same sequences in the same rows, as decode steps mostly do, its columns
        are the step's: only the output positions (and min_tokens still counting) change."""
        if previous is not None and len(previous.rows) == len(rows) and all(
                a.seq is b.seq for a, b in zip(previous.rows, rows)):
            randomness = None if previous.all_greedy else _randomness(rows, previous.seeded, device)
            return replace(previous, rows=rows, edit_rows=_edit_rows(rows, previous.may_edit),
                           **_random_columns(randomness, len(rows)))
        n = len(rows)
        params = [r.seq.sampling_params for r in rows]
        temperature = [0.0 if p.greedy else p.temperature for p in params]
        top_p = [p.top_p for p in params]
        top_k = [max(p.top_k, 0) for p in params]
        min_p = [p.min_p for p in params]
        seeded = [i for i, (p, t) in enumerate(zip(params, temperature)) if p.seed is not None and t > 0.0]
        may_edit = tuple(i for i, (r, p) in enumerate(zip(rows, params))
                         if p.logit_bias or r.seq.bad_words_token_ids or p.min_tokens)
        # one copy for the four columns; float32 holds every top_k below 2**24 exactly
        pad = _pad(n)
        table = to_device(temperature + pad + top_p + pad + top_k + pad + min_p + pad,
                          torch.float32, device).view(4, n + len(pad))[:, :n]
        all_greedy = not any(temperature)
        randomness = None if all_greedy else _randomness(rows, seeded, device)
        return cls(
            rows=rows,
            temperature=table[0],
            top_p=table[1],
            top_k=table[2].long(),
            min_p=table[3],
            all_greedy=all_greedy,
            any_top_p=min(top_p) < 1.0,
            any_top_k=max(top_k) > 0,
            any_min_p=max(min_p) > 0.0,
            any_penalties=any(p.needs_penalties for p in params),
            **_random_columns(randomness, n),
            edit_rows=_edit_rows(rows, may_edit),
            may_edit=may_edit,
            seeded=seeded,
        )


def _pad(n: int) -> list[int]:
    """Columns start 16 bytes apart at least: Triton compiles a kernel once per pointer alignment,
    so without the padding a new row count could cost a compile mid-serving."""
    return [0] * (-n % 4)


def _randomness(rows: list[SamplingRow], seeded: list[int], device: torch.device) -> torch.Tensor:
    """Seeds, output positions and seeded rows, one copy."""
    pad = _pad(len(rows))
    positions = [len(r.output_token_ids) + r.seq.num_pending_tokens for r in rows]
    return to_device([r.seq.seed for r in rows] + pad + positions + pad + seeded, torch.int64, device)


def _random_columns(randomness: Optional[torch.Tensor], n: int) -> dict[str, Optional[torch.Tensor]]:
    width = n + len(_pad(n))
    if randomness is None:
        return {"seeds": None, "offsets": None, "seeded_rows": None}
    return {"seeds": randomness[:n], "offsets": randomness[width:width + n], "seeded_rows": randomness[2 * width:]}


def _edit_rows(rows: list[SamplingRow], may_edit: tuple[int, ...]) -> tuple[int, ...]:
    """Of the rows that may, those whose logits ``apply_logit_edits`` changes this step."""
    return tuple(i for i in may_edit if rows[i].seq.sampling_params.logit_bias or rows[i].seq.bad_words_token_ids
                 or len(rows[i].output_token_ids) < rows[i].seq.sampling_params.min_tokens)
