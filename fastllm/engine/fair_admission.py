"""Fair admission: one client request that expands into many engine requests gets a window.

A completion with 2,000 prompts is 2,000 engine requests; handed to the engine at once they
would fill its FCFS queue, and a one-prompt request sent a second later would wait for all
of them. Here the engine requests of one group (one HTTP request) enter the engine only
while the group has fewer than ``window`` sequences in it; the rest are held, and each
departure lets the held requests in round-robin across groups. A request without a group,
or a group's first request, always enters at once. With the window well below the engine's
``max_num_seqs``, a big request never fills the batch: a small one sent behind it finds a
free row, starts at the next step, and its steps are short (on a CPU a step's time grows
with its rows). Many requests together still fill the batch, a window each.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any, Iterator, Optional, Protocol


class Admissible(Protocol):
    request_id: str
    group: Optional[str]
    params: Any  # SamplingParams: ``n`` sequences each


class FairAdmission:
    def __init__(self, window: int):
        self.window = max(1, window)
        self._held: OrderedDict[str, deque[Admissible]] = OrderedDict()
        self._in_engine: dict[str, int] = {}  # group -> its sequences now in the engine
        self._entered: dict[str, tuple[str, int]] = {}  # request id -> (group, sequences)
        self.num_held = 0

    def offer(self, item: Admissible) -> bool:
        """True: add it to the engine now (counted as entered). False: held for later."""
        if item.group is None:
            return True
        if item.group not in self._held and self._fits(item):
            self._enter(item)
            return True
        self._held.setdefault(item.group, deque()).append(item)
        self.num_held += 1
        return False

    def leave(self, request_id: str) -> list[Admissible]:
        """A request left the engine (finished, aborted, failed): the held requests that may enter now."""
        entered = self._entered.pop(request_id, None)
        if entered is None:
            return []
        group, num_seqs = entered
        self._in_engine[group] -= num_seqs
        if not self._in_engine[group]:
            del self._in_engine[group]
        admitted: list[Admissible] = []
        progress = True
        while progress:  # one request per group and round, so groups share what was freed
            progress = False
            for held_group in list(self._held):
                queue = self._held[held_group]
                if self._fits(queue[0]):
                    item = queue.popleft()
                    self.num_held -= 1
                    self._enter(item)
                    admitted.append(item)
                    progress = True
                if not queue:
                    del self._held[held_group]
        return admitted

    def withdraw(self, request_id: str) -> Optional[Admissible]:
        """Take back a held request (its client left); None if it is not held."""
        for group, queue in self._held.items():
            for item in queue:
                if item.request_id == request_id:
                    queue.remove(item)
                    self.num_held -= 1
                    if not queue:
                        del self._held[group]
                    return item
        return None

    def held(self) -> Iterator[Admissible]:
        for queue in self._held.values():
            yield from queue

    def _fits(self, item: Admissible) -> bool:
        in_engine = self._in_engine.get(item.group, 0)
        return in_engine == 0 or in_engine + item.params.n <= self.window

    def _enter(self, item: Admissible) -> None:
        self._in_engine[item.group] = self._in_engine.get(item.group, 0) + item.params.n
        self._entered[item.request_id] = (item.group, item.params.n)
