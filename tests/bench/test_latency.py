"""``fastllm bench latency`` end to end on the tiny random Llama: the table and a sane results file."""

from __future__ import annotations

import json

import pytest

from fastllm.entrypoints.cli.main import main
from tests.bench.conftest import engine_flags


def test_latency_cli_writes_sane_numbers(tiny_llama_dir, tmp_path, capsys):
    path = tmp_path / "latency.json"
    assert main(["bench", "latency", *engine_flags(tiny_llama_dir), "--batch-size", "1", "3", "--input-len", "12",
                 "--output-len", "6", "--num-iters", "3", "--output-json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "decode tok/s/seq" in out and "roofline" in out
    result = json.loads(path.read_text())
    assert (result["device"], result["input_len"], result["output_len"]) == ("cpu", 12, 6)
    assert [b["batch_size"] for b in result["batches"]] == [1, 3]
    for batch in result["batches"]:
        assert len(batch["latencies_s"]) == 3 and min(batch["latencies_s"]) > 0
        assert 0 < batch["latency_median_s"] <= batch["latency_p99_s"] <= max(batch["latencies_s"])
        assert 0 < batch["ttft_median_ms"] <= batch["ttft_p99_ms"] < 1000 * batch["latency_p99_s"]
        assert batch["decode_tok_s_per_seq"] > 0
        expected = batch["batch_size"] * 6 / batch["latency_mean_s"]
        assert abs(batch["output_tok_s"] - expected) < 1e-6 * expected
    assert "roofline_batch1_tok_s" not in result  # CUDA only


def test_latency_cli_rejects_a_single_output_token(tiny_llama_dir):
    with pytest.raises(SystemExit, match="--output-len"):
        main(["bench", "latency", *engine_flags(tiny_llama_dir), "--output-len", "1"])
