"""The printed tables of every ``fastllm bench``: vLLM's labelled summary block, and plain columns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

WIDTH = 50
SECTIONS = (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
            ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency"))


def _cell(value: Any, spec: str) -> str:
    return format(value, spec + ".2f") if isinstance(value, float) else format(value, spec)


def print_summary(title: str, summary: dict[str, Any], extra: Sequence[tuple[str, Any]] = ()) -> None:
    """The block of vLLM's benchmark_serving for a ``stats.summarize`` dict; ``extra`` rows follow the
    throughputs."""
    rows = [("Successful requests:", summary["completed"]), ("Failed requests:", summary["failed"]),
            ("Benchmark duration (s):", summary["duration"]), ("Total input tokens:", summary["total_input_tokens"]),
            ("Total generated tokens:", summary["total_output_tokens"]),
            ("Request throughput (req/s):", summary["request_throughput"]),
            ("Output token throughput (tok/s):", summary["output_throughput"]),
            ("Total Token throughput (tok/s):", summary["total_token_throughput"]), *extra]
    print("{s:{c}^{w}}".format(s=f" {title} ", c="=", w=WIDTH))
    for label, value in rows:
        print(f"{label:<40}{_cell(value, '<10')}")
    for key, name in SECTIONS:
        print("{s:{c}^{w}}".format(s=f" {name} ", c="-", w=WIDTH))
        for stat in ("mean", "median", "p99"):
            label = f"{'P99' if stat == 'p99' else stat.capitalize()} {key.upper()} (ms):"
            print(f"{label:<40}{_cell(summary[f'{stat}_{key}_ms'], '<10')}")
    print("=" * WIDTH)


def print_columns(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Right-aligned columns, each as wide as its header or widest cell; floats with two decimals."""
    cells = [[_cell(v, "") for v in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
