"""The first runner of a process freezes its start-up heap; shutting the engine down (or building
another) gives it back to the collector, so a dropped engine held in a reference cycle is still
reclaimed."""

from __future__ import annotations

import gc
import weakref

import pytest

from fastllm import LLM, SamplingParams
from fastllm.worker import gc_heap


@pytest.fixture
def first_engine_of_the_process(monkeypatch):
    """As if no engine had been built in this process yet; the heap is thawed again afterwards."""
    gc_heap.thaw_heap()
    monkeypatch.setattr(gc_heap, "_thawed", False)
    yield
    gc_heap.thaw_heap()


def _is_tracked(obj: object) -> bool:
    """Whether the collector walks ``obj`` (frozen objects sit in the permanent generation)."""
    return any(o is obj for o in gc.get_objects())


def test_the_engine_is_frozen_while_it_serves_and_reclaimed_after_shutdown(first_engine_of_the_process,
                                                                           tiny_llama_dir):
    llm = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", num_gpu_blocks_override=16)
    engine = llm.engine
    assert gc.get_freeze_count() > 0 and not _is_tracked(engine)
    out = llm.generate([{"prompt_token_ids": [1, 5, 9]}], SamplingParams(max_tokens=4, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs.token_ids) == 4
    engine.cycle = engine  # the runner and its CUDA graphs hold each other like this
    alive = weakref.ref(engine)
    llm.shutdown()
    assert gc.get_freeze_count() == 0
    del llm, engine
    gc.collect()
    assert alive() is None


def test_a_second_engine_thaws_the_first_and_freezes_nothing(first_engine_of_the_process, tiny_llama_dir,
                                                             monkeypatch):
    first = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", num_gpu_blocks_override=16)
    first.engine.cycle = first.engine
    alive = weakref.ref(first.engine)
    del first
    gc.collect()  # what a caller does to free the first engine; frozen, it stays
    assert alive() is not None
    freezes = []
    freeze = gc.freeze
    monkeypatch.setattr(gc, "freeze", lambda: freezes.append(1) or freeze())
    second = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", num_gpu_blocks_override=16)
    assert alive() is None  # reclaimed while the second was built
    # (the permanent generation's count is no witness: on the lent H100 machines, Python 3.12, a few
    # hundred objects reach it while a runner is built, with no gc.freeze call)
    assert not freezes and _is_tracked(second.engine)


def test_full_collections_are_paced_while_requests_run_and_restored_after(tiny_llama_dir, monkeypatch):
    """While the engine has requests Python starts no full collection (one runs every interval,
    at a step's end); once generate returns, the process's thresholds are back."""
    thresholds = gc.get_threshold()
    llm = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", num_gpu_blocks_override=16)
    seen, collections = [], []
    step = llm.engine.step

    def watched_step():
        outputs = step()
        seen.append(gc.get_threshold())
        return outputs

    monkeypatch.setattr(llm.engine, "step", watched_step)
    monkeypatch.setattr(gc_heap, "FULL_COLLECTION_INTERVAL_S", 0.0)  # every step's end
    monkeypatch.setattr(gc, "collect", lambda generation=2: collections.append(generation))

    llm.generate([{"prompt_token_ids": [1, 5, 9]}] * 2, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)

    assert seen[0] == (*thresholds[:2], gc_heap.NEVER)  # paused while requests ran
    assert seen[-1] == thresholds and gc.get_threshold() == thresholds  # restored by the last step
    assert collections  # and collected at the paced interval meanwhile
