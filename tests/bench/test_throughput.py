"""``fastllm bench throughput`` end to end on the tiny random Llama: random and ShareGPT prompts, vs HF."""

from __future__ import annotations

import json

from fastllm.entrypoints.cli.main import main
from tests.bench.conftest import (
    SHAREGPT,
    SHAREGPT_ANSWER_TOKENS,
    SHAREGPT_PROMPT_TOKENS,
    engine_flags,
)

LABELS = ["Successful requests:", "Benchmark duration (s):", "Total input tokens:", "Total generated tokens:",
          "Request throughput (req/s):", "Output token throughput (tok/s):", "Total Token throughput (tok/s):",
          "Mean TTFT (ms):", "Median TTFT (ms):", "P99 TTFT (ms):", "Mean TPOT (ms):", "P99 TPOT (ms):",
          "Mean ITL (ms):", "Median ITL (ms):", "P99 ITL (ms):"]


def _check_timings(result: dict) -> None:
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < result[f"median_{name}_ms"] <= result[f"p99_{name}_ms"], name
    assert result["p99_ttft_ms"] <= result["p99_e2el_ms"]
    for key in ("duration", "request_throughput", "output_throughput", "total_token_throughput"):
        assert result[key] > 0, key


def test_throughput_random_prompts_vs_hf_subset(tiny_llama_dir, tmp_path, capsys):
    path = tmp_path / "throughput.json"
    assert main(["bench", "throughput", *engine_flags(tiny_llama_dir), "--num-prompts", "6", "--input-len", "10",
                 "--output-len", "5", "--range-ratio", "0", "--compare", "hf", "--hf-num-prompts", "2", "--quiet",
                 "--output-json", str(path)]) == 0
    out = capsys.readouterr().out
    for label in LABELS:
        assert label in out, label
    assert "hf on the first 2 only" in out
    result = json.loads(path.read_text())
    assert (result["completed"], result["failed"]) == (6, 0)
    assert (result["total_input_tokens"], result["total_output_tokens"]) == (6 * 10, 6 * 5)
    _check_timings(result)
    # the batch defaults to all of HF's prompts (fewer than --max-num-seqs); tokens are the requested ones
    assert (result["hf_num_prompts"], result["hf_batch_size"], result["hf_output_tokens"]) == (2, 2, 2 * 5)
    assert result["speedup_vs_hf"] == result["output_throughput"] / result["hf_output_tokens_per_s"]
    assert "mfu_pct" not in result  # CUDA only


def test_throughput_sharegpt_dataset(tiny_dir_with_tokenizer, tmp_path, capsys):
    path = tmp_path / "throughput.json"
    assert main(["bench", "throughput", *engine_flags(tiny_dir_with_tokenizer), "--dataset", SHAREGPT,
                 "--num-prompts", "8", "--quiet", "--output-json", str(path)]) == 0
    assert "Successful requests:                    2" in capsys.readouterr().out
    result = json.loads(path.read_text())
    assert result["total_input_tokens"] == SHAREGPT_PROMPT_TOKENS
    assert result["total_output_tokens"] == SHAREGPT_ANSWER_TOKENS
    _check_timings(result)
