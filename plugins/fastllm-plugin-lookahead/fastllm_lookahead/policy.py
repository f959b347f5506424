"""How many drafts a sequence may propose: its own acceptance history, and the batch's size.

A draft the target model rejects still costs a slot in the forward pass, and on small
batches a step with drafts goes through the slower multi-token attention path. So a
sequence whose drafts keep failing proposes fewer, down to none, and only probes now and
then (ever more rarely while probes fail) to notice when its text turns copyable again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Steps without drafts before the first probe; doubled after each failed probe.
FIRST_PROBE_INTERVAL = 4
# A probe waits for a context suffix of this many tokens seen before: copying shows up as long
# matches, while free text matches a token or two by chance and would waste the probe.
PROBE_MIN_MATCH = 3


@dataclass
class AcceptanceTracker:
    """Decayed estimate of the chance that a sequence's next draft token is accepted.

    Each verified draft token before the first rejection is a success, the rejected one
    a failure; drafts after a rejection were never tried. ``decay`` forgets old steps so
    a request that moves from free text to quoting (or back) is followed within a few steps.
    ``allowed`` only reads, so it may be asked any number of times a step; ``update`` counts
    every step, with drafts or without.
    """

    max_drafts: int
    min_chain_prob: float
    decay: float = 0.7
    max_probe_interval: int = 64
    # The prior, 0.7: a new sequence drafts a few tokens, and all of them after one full success.
    successes: float = 0.7
    trials: float = 1.0
    idle_steps: int = 0  # steps without drafts since the last verification, while backed off
    probe_interval: int = FIRST_PROBE_INTERVAL
    # _chain_length() of the current estimate: asked every step, changed only by a verification
    chain: int = field(init=False)

    def __post_init__(self) -> None:
        self.chain = self._chain_length()

    @property
    def acceptance(self) -> float:
        return self.successes / self.trials

    def allowed(self) -> tuple[int, bool]:
        """Drafts worth proposing next step: as many as keep the chance that all are accepted
        above ``min_chain_prob``; when that is none, one now and then as a probe. The flag says
        whether this is a probe (see ``PROBE_MIN_MATCH``)."""
        if self.chain > 0:
            return self.chain, False
        return (1, True) if self._probe_due else (0, False)

    def update(self, num_proposed: int, num_accepted: int) -> None:
        """Fold in one step that yielded tokens, of which ``num_accepted`` were drafts out of
        ``num_proposed`` verified (none: a step without drafts, which brings a probe closer)."""
        if num_proposed == 0:
            if self.chain == 0:
                self.idle_steps += 1
            return
        was_probe = self.chain == 0 and self._probe_due
        failed = num_accepted < num_proposed
        self.successes = self.decay * self.successes + num_accepted
        self.trials = self.decay * self.trials + num_accepted + failed
        self.chain = self._chain_length()
        if was_probe:
            self.probe_interval = (min(2 * self.probe_interval, self.max_probe_interval) if failed
                                   else FIRST_PROBE_INTERVAL)
        self.idle_steps = 0

    def _chain_length(self) -> int:
        """The most drafts whose chance of all being accepted stays above ``min_chain_prob``."""
        rate = self.acceptance
        if rate >= 1.0:
            return self.max_drafts
        wanted = int(math.log(self.min_chain_prob) / math.log(rate)) if rate > 0.0 else 0
        return min(wanted, self.max_drafts)

    @property
    def _probe_due(self) -> bool:
        """The next step is the ``probe_interval``-th without drafts; a probe waits until it is made."""
        return self.idle_steps + 1 >= self.probe_interval


def share_drafts(wanted: list[int], priority: list[float], max_batch_drafts: int) -> list[int]:
    """Split the step's draft budget: an equal cap per sequence, the most promising first.

    With a few sequences each gets what it wants; with many, ``max_batch_drafts`` bounds the
    extra tokens of the step, since a large batch already keeps the hardware busy.
    """
    cap = max(1, max_batch_drafts // max(1, len(wanted)))
    budget = max_batch_drafts
    granted = [0] * len(wanted)
    for i in sorted(range(len(wanted)), key=lambda i: -priority[i]):
        granted[i] = min(wanted[i], cap, budget)
        budget -= granted[i]
        if budget <= 0:
            break
    return granted
