"""FASTLLM_TORCH_PROFILER_DIR: the engine writes a trace of exactly the configured steps."""

from __future__ import annotations

import gzip
import json

import pytest

from fastllm import LLM, SamplingParams
from fastllm.platforms.step_profiler import DIR_ENV, STEPS_ENV, parse_windows


def test_windows_parse_in_order_and_bad_specs_are_refused():
    assert parse_windows("100:3, 900:2") == [(100, 3), (900, 2)]
    assert parse_windows("7") == [(7, 1)]
    for bad in ("a:3", "5:0", "-1:2", "10:5,12:1", "10:5,3:1"):
        with pytest.raises(ValueError, match=STEPS_ENV):
            parse_windows(bad)


def _step_ops(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [event for event in events if event.get("name", "").startswith("aten::embedding")]


def test_the_engine_traces_its_configured_steps(monkeypatch, tmp_path, tiny_llama_dir):
    monkeypatch.setenv(DIR_ENV, str(tmp_path / "traces"))
    monkeypatch.setenv(STEPS_ENV, "1:2,5:1")
    llm = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", num_gpu_blocks_override=16)
    llm.generate([{"prompt_token_ids": [1, 5, 9]}], SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    llm.shutdown()
    traces = sorted((tmp_path / "traces").iterdir())
    assert [path.name.split("-")[-1] for path in traces] == ["step1.json.gz", "step5.json.gz"]
    # one embedding lookup a step: the first window holds steps 1 and 2, the second step 5 alone
    assert [len(_step_ops(path)) for path in traces] == [2, 1]
