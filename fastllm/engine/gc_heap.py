"""The start-up heap kept out of Python's full garbage collections while an engine serves.

A full (oldest-generation) collection walks every tracked object, and once torch, the model and
the plugins are loaded that is most of the process: each one stalls the engine loop far longer
than a decode step, and a large batch allocates enough to start one every few dozen steps.
Overlapped steps cannot hide that: the device idles until the loop comes back (benchmarks/
RESULTS.md, "Offline MFU A/B"). Objects alive once the engine is built (modules, the model,
the cache, the captured graphs) live as long as it does, so they are frozen (``gc.freeze``),
as vLLM's engine core does; later objects (requests, their outputs) are collected as usual.

Once a process: a process that builds a second engine (tests, a notebook) thaws the heap, so
that a dropped engine's cycles (the runner and its captured graphs hold each other) can be
collected, and keeps it thawed.
"""

from __future__ import annotations

import atexit
import gc

_frozen = False
_thawed = False


def freeze_startup_heap() -> None:
    """Collect, then move every live object to the permanent generation (the first engine of
    the process only)."""
    global _frozen
    if _frozen or _thawed:
        return
    gc.collect()
    gc.freeze()
    _frozen = True


def thaw_heap() -> None:
    """Give the frozen objects back to the collector, for good: an engine shut down or dropped
    is then reclaimed by the next collection."""
    global _frozen, _thawed
    if _frozen:
        gc.unfreeze()
        _frozen, _thawed = False, True


# Interpreter shutdown collects only what is not frozen; extension types (Triton's) report
# the rest as leaked.
atexit.register(thaw_heap)
