"""The start-up heap kept out of Python's full garbage collections while an engine serves.

A full (oldest-generation) collection walks every tracked object, and once torch, the model and
the plugins are loaded that is most of the process: each one stalls the engine loop far longer
than a decode step, and a large batch allocates enough to start one every few dozen steps.
Overlapped steps cannot hide that: the device idles until the loop comes back (benchmarks/
RESULTS.md, "Offline MFU A/B"). Objects alive once the runner has its model, cache and graphs
(modules, weights, plugins) live as long as the process serves, so they are frozen
(``gc.freeze``), as vLLM's engine core does, in every process that holds a runner (rank 0,
tensor-parallel workers, data-parallel replicas); later objects (requests, their outputs) are
collected as usual.

Once a process: a process that builds a second runner (tests, a notebook) thaws the heap, so
that a dropped engine's cycles (the runner and its captured graphs hold each other) can be
collected, and keeps it thawed.

The requests in flight are long-lived too (their token lists, outputs kept until they finish): with
a few hundred of them a full collection walks millions of references, tens of milliseconds, and a
batch that size promotes enough objects to start one about every second, each stalling the loop
for a few decode steps. So while an engine has requests, full collections are paced
(``pace_full_collections``): Python starts none itself, one runs every
``FULL_COLLECTION_INTERVAL_S`` at the end of a step (while the device runs the one queued), and the
thresholds come back once the engine is idle. Young generations are collected as usual throughout.
"""

from __future__ import annotations

import atexit
import gc
import time
from typing import Optional

FULL_COLLECTION_INTERVAL_S = 30.0
NEVER = 1 << 30  # a generation-2 threshold no count reaches

_frozen = False
_thawed = False
_thresholds: Optional[tuple[int, int, int]] = None  # the process's own, while full collections are paced
_last_full = 0.0


def freeze_startup_heap() -> None:
    """Collect, then move every live object to the permanent generation: the runner's when it
    is ready, then the engine's (its scheduler and block pool); only while the process has not
    thawed its heap."""
    global _frozen
    if _thawed:
        return
    gc.collect()
    gc.freeze()
    _frozen = True


def thaw_heap(collect: bool = False) -> None:
    """Give the frozen objects back to the collector, for good: an engine shut down or dropped
    is then reclaimed by the next collection, or at once with ``collect`` (before another
    runner allocates: a caller's own ``gc.collect()`` could not reclaim a frozen engine)."""
    global _frozen, _thawed
    if _frozen:
        gc.unfreeze()
        _frozen, _thawed = False, True
        if collect:
            gc.collect()


def pace_full_collections(busy: bool) -> None:
    """Called after every engine step: while ``busy`` (requests in flight), no automatic
    full collection, one every ``FULL_COLLECTION_INTERVAL_S``; idle, the process's thresholds."""
    global _thresholds, _last_full
    now = time.monotonic()
    if busy and _thresholds is None:
        _thresholds, _last_full = gc.get_threshold(), now
        gc.set_threshold(_thresholds[0], _thresholds[1], NEVER)
    elif busy and now - _last_full > FULL_COLLECTION_INTERVAL_S:
        gc.collect()
        _last_full = now
    elif not busy and _thresholds is not None:
        gc.set_threshold(*_thresholds)
        _thresholds = None


# Interpreter shutdown collects only what is not frozen; extension types (Triton's) report
# the rest as leaked.
atexit.register(thaw_heap)
