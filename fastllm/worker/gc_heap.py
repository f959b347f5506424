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
"""

from __future__ import annotations

import atexit
import gc

_frozen = False
_thawed = False


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


# Interpreter shutdown collects only what is not frozen; extension types (Triton's) report
# the rest as leaked.
atexit.register(thaw_heap)
