"""The benchmark statistics and tables against hand-computed values."""

from __future__ import annotations

import pytest

from fastllm.bench.stats import RequestResult, distribution, summarize
from fastllm.bench.table import print_columns, print_summary


def test_distribution_by_hand():
    # p99 of 5 sorted values interpolates at rank 0.99 * 4 = 3.96: 4 + 0.96 * (100 - 4)
    assert distribution([3.0, 1.0, 100.0, 2.0, 4.0]) == pytest.approx({"mean": 22.0, "median": 3.0, "p99": 96.16})
    assert distribution([]) == {"mean": 0.0, "median": 0.0, "p99": 0.0}


def test_summarize_by_hand():
    results = [
        RequestResult(ok=True, prompt_tokens=10, output_tokens=5, ttft=0.1, latency=0.5, itl=[0.1, 0.1, 0.1, 0.1]),
        RequestResult(ok=True, prompt_tokens=20, output_tokens=3, ttft=0.2, latency=0.6, itl=[0.1, 0.3]),
        RequestResult(ok=True, prompt_tokens=4, output_tokens=1, ttft=0.3, latency=0.3),
        RequestResult(error="boom", prompt_tokens=99),
    ]
    s = summarize(results, duration=2.0)
    assert (s["completed"], s["failed"]) == (3, 1)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (34, 9)
    assert s["request_throughput"] == 1.5 and s["output_throughput"] == 4.5 and s["total_token_throughput"] == 21.5
    assert s["mean_ttft_ms"] == pytest.approx(200.0) and s["median_ttft_ms"] == pytest.approx(200.0)
    # TPOT (latency - ttft) / (n - 1): 100 ms and 200 ms; a one-token answer has none
    assert s["mean_tpot_ms"] == pytest.approx(150.0) and s["p99_tpot_ms"] == pytest.approx(199.0)
    # ITL pools every gap: five of 100 ms, one of 300 ms
    assert s["mean_itl_ms"] == pytest.approx(800 / 6) and s["median_itl_ms"] == pytest.approx(100.0)
    assert s["mean_e2el_ms"] == pytest.approx(1400 / 3)


def test_print_summary_layout(capsys):
    s = summarize([RequestResult(ok=True, prompt_tokens=2, output_tokens=2, ttft=0.5, latency=1.0, itl=[0.5])], 1.0)
    print_summary("Title", s, [("Model FLOPs utilization (%):", 12.345)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "===================== Title ======================" and lines[-1] == "=" * 50
    assert "Successful requests:                    1         " in lines
    assert "Model FLOPs utilization (%):            12.35     " in lines
    assert "Median TPOT (ms):                       500.00    " in lines


def test_print_columns_aligns_right(capsys):
    print_columns(("batch", "tok/s"), [(1, 1234.5), (32, 7.0)])
    assert capsys.readouterr().out.splitlines() == ["batch    tok/s", "    1  1234.50", "   32     7.00"]
