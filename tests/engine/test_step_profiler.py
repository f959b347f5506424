"""FASTLLM_TORCH_PROFILER_DIR: traces of exactly the configured steps, and of what runs between
``LLM.start_profile()`` and ``stop_profile()``, one a process that holds a shard."""

from __future__ import annotations

import gzip
import json

import pytest

from fastllm import LLM, SamplingParams
from fastllm.platforms.step_profiler import DIR_ENV, STEPS_ENV, parse_windows

PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
PROMPT = [{"prompt_token_ids": [1, 5, 9]}]


def test_windows_parse_in_order_and_bad_specs_are_refused():
    assert parse_windows("100:3, 900:2") == [(100, 3), (900, 2)]
    assert parse_windows("7") == [(7, 1)]
    for bad in ("a:3", "5:0", "-1:2", "10:5,12:1", "10:5,3:1"):
        with pytest.raises(ValueError, match=STEPS_ENV):
            parse_windows(bad)


def _steps(path) -> int:
    """Forward passes in a trace: one embedding lookup each."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sum(1 for event in events if event.get("name", "").startswith("aten::embedding"))


def test_the_engine_traces_its_configured_steps(monkeypatch, tmp_path, tiny_llama_dir):
    monkeypatch.setenv(DIR_ENV, str(tmp_path / "traces"))
    monkeypatch.setenv(STEPS_ENV, "1:2,5:1")
    llm = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", num_gpu_blocks_override=16)
    llm.generate(PROMPT, PARAMS, use_tqdm=False)
    llm.shutdown()
    traces = sorted((tmp_path / "traces").iterdir())
    assert [path.name.split("-")[-1] for path in traces] == ["step1.json.gz", "step5.json.gz"]
    assert [_steps(path) for path in traces] == [2, 1]  # steps 1 and 2, then step 5 alone


@pytest.mark.parametrize("parallel", [{}, {"tensor_parallel_size": 2}, {"data_parallel_size": 2}])
def test_start_and_stop_profile_trace_every_process(monkeypatch, tmp_path, tiny_llama_dir, parallel):
    monkeypatch.setenv(DIR_ENV, str(tmp_path / "traces"))
    monkeypatch.delenv(STEPS_ENV, raising=False)
    llm = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", num_gpu_blocks_override=16, **parallel)
    try:
        llm.generate(PROMPT, PARAMS, use_tqdm=False)
        llm.start_profile()
        llm.generate(PROMPT * 2, PARAMS, use_tqdm=False)  # one request a replica under data parallelism
        llm.stop_profile()
        llm.generate(PROMPT, PARAMS, use_tqdm=False)
    finally:
        llm.shutdown()
    traces = sorted((tmp_path / "traces").glob("*.json.gz"))
    processes = max(parallel.values(), default=1)
    assert len({path.name.rsplit("-", 2)[-2] for path in traces}) == processes  # a trace a process
    assert [_steps(path) for path in traces] == [8] * processes  # the profiled requests' 8 steps


def test_starting_a_profile_without_a_directory_is_an_error(monkeypatch, tiny_llama_dir):
    monkeypatch.delenv(DIR_ENV, raising=False)
    llm = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", num_gpu_blocks_override=16)
    with pytest.raises(RuntimeError, match=DIR_ENV):
        llm.start_profile()
    assert llm.generate(PROMPT, PARAMS, use_tqdm=False)[0].outputs.token_ids  # the engine goes on
