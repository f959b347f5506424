"""``fastllm bench serve`` against a live server: the metric table of the Angel-vLLM docs and a result file."""

from __future__ import annotations

import json

from fastllm.entrypoints.cli.main import main

TABLE_LABELS = ["Successful requests:", "Benchmark duration (s):", "Total input tokens:", "Total generated tokens:",
                "Request throughput (req/s):", "Output token throughput (tok/s):", "Total Token throughput (tok/s):",
                "Mean TTFT (ms):", "Median TTFT (ms):", "P99 TTFT (ms):", "Mean TPOT (ms):", "Median TPOT (ms):",
                "P99 TPOT (ms):", "Mean ITL (ms):", "Median ITL (ms):", "P99 ITL (ms):"]


def test_bench_serve_prints_the_table_and_saves_results(server, tmp_path, capsys):
    code = main(["bench", "serve", "--base-url", server.url, "--num-prompts", "8", "--random-input-len", "16",
                 "--random-output-len", "4", "--ignore-eos", "--request-rate", "20", "--max-concurrency", "4",
                 "--save-result", "--result-dir", str(tmp_path), "--result-filename", "run.json",
                 "--metadata", "purpose=test"])
    out = capsys.readouterr().out
    assert code == 0
    for label in TABLE_LABELS:
        assert label in out, label
    result = json.loads((tmp_path / "run.json").read_text())
    assert result["completed"] == 8 and result["failed"] == 0
    assert result["total_input_tokens"] == 8 * 16 and result["total_output_tokens"] == 8 * 4
    assert result["metadata"] == {"purpose": "test"} and result["model"] == "smol"


def test_bench_serve_sharegpt_on_the_chat_endpoint(server, tmp_path, capsys):
    turns = [("Tell me a short joke about cats.", "Why did the cat sit on the computer? To keep an eye on the mouse."),
             ("What is the boiling point of water?", "Water boils at 100 degrees Celsius at sea level pressure."),
             ("hi", "hello")]  # too short: skipped, as vLLM's sampler does
    data = [{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]} for q, a in turns]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    assert main(["bench", "serve", "--base-url", server.url, "--endpoint", "/v1/chat/completions",
                 "--dataset-name", "sharegpt", "--dataset-path", str(path), "--num-prompts", "3",
                 "--sharegpt-output-len", "4", "--ignore-eos"]) == 0
    out = capsys.readouterr().out
    assert "Successful requests:                    2" in out
    assert "Total generated tokens:                 8" in out
