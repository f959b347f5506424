"""A step queued on the device: its sampled tokens and their logprobs, read on the host later.

The runner returns one as soon as the step is queued; the engine reads it after queueing the
next step, so preparing step n+1 on the host overlaps with running step n on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from fastllm.outputs import Logprobs
from fastllm.platforms.transfer import HostCopy
from fastllm.worker.input_batch import SequenceState


@dataclass(slots=True)
class SequenceResult:
    """What one step produced for one sequence."""

    new_token_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    logprobs: list[Optional[Logprobs]] = field(default_factory=list)
    num_accepted_drafts: int = 0
    prompt_logprobs: list[Optional[Logprobs]] = field(default_factory=list)
    prompt_logprobs_start: int = 0  # the prompt position of the first entry
    grammar_terminated: bool = False  # its grammar ended with this token (set when the engine reads it)


@dataclass(slots=True)
class SampledRows:
    """The rows of the step's token tensor that belong to one sequence, from ``start`` on; its
    tokens join the runner's state of it when they are read.

    A sequence that verified drafts owns ``num_accepted[draft_group] + 1`` rows (see
    ``fastllm.spec_decode.verify``); any other owns one.
    """

    seq: SequenceState
    start: int
    draft_group: Optional[int] = None


class PendingStep:
    """Sampled tokens ``[rows]`` and the logits ``[rows, vocab]`` they came from, still on the device.

    A logprob is a logit less its row's ``logsumexp``: only the chosen and the top-k ones are
    computed. ``top_k[row]`` is how many alternatives that row's request asked for (None: none).
    ``num_accepted`` (drafts accepted per draft group) comes back in the same copy.
    """

    def __init__(self, results: dict[int, SequenceResult], owners: list[SampledRows] = (),
                 tokens: Optional[torch.Tensor] = None, logits: Optional[torch.Tensor] = None,
                 logsumexp: Optional[torch.Tensor] = None, top_k: list[Optional[int]] = (),
                 num_accepted: Optional[torch.Tensor] = None, chosen: Optional[torch.Tensor] = None):
        self._results, self._owners, self._top_k = results, list(owners), list(top_k)
        self._copy = None
        if tokens is not None:
            if chosen is None:  # else the chosen tokens' logprobs came without the logits
                chosen = logits.gather(-1, tokens[:, None]).squeeze(-1) - logsumexp
            wanted = max((k for k in self._top_k if k is not None), default=None)
            top = []
            if wanted is not None:
                values, ids = logits.topk(max(wanted, 1), dim=-1)
                top = [values - logsumexp[:, None], ids]
            accepted = [] if num_accepted is None else [num_accepted]
            self._copy = HostCopy([tokens, chosen, *accepted, *top])
            self._has_drafts = num_accepted is not None

    def results(self) -> dict[int, SequenceResult]:
        """Every sequence's tokens and logprobs; waits for the device where they are not back yet."""
        if self._copy is None:
            return self._results
        tensors, self._copy = [t.tolist() for t in self._copy.wait()], None
        tokens, chosen = tensors[0], tensors[1]
        num_accepted = tensors[2] if self._has_drafts else []
        top_values, top_ids = tensors[2 + self._has_drafts:] or (None, None)
        results, top_k = self._results, self._top_k
        for owner in self._owners:
            seq, start = owner.seq, owner.start
            result = results[seq.seq_id]
            seq.num_pending_tokens -= 1
            if owner.draft_group is None:  # one token: no ranges, no slices
                token = tokens[start]
                result.new_token_ids = [token]
                seq.output_token_ids.append(token)
                result.token_logprobs = [chosen[start]]
                result.logprobs = [None if top_k[start] is None
                                   else self._alternatives(start, tokens, chosen, top_values, top_ids)]
                continue
            count = num_accepted[owner.draft_group] + 1
            result.new_token_ids = tokens[start:start + count]
            seq.output_token_ids += result.new_token_ids
            result.num_accepted_drafts = count - 1
            rows = range(start, start + count)
            result.token_logprobs = [chosen[r] for r in rows]
            result.logprobs = [self._alternatives(r, tokens, chosen, top_values, top_ids) for r in rows]
        return results

    def _alternatives(self, row: int, tokens: list[int], chosen: list[float],
                      top_values: Optional[list], top_ids: Optional[list]) -> Optional[Logprobs]:
        """The row's top-k logprobs with the chosen token always among them, if its request asked."""
        k = self._top_k[row]
        if k is None:
            return None
        entry = dict(zip(top_ids[row][:k], top_values[row][:k]))
        entry[tokens[row]] = chosen[row]
        return entry
