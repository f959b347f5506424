"""``fastllm bench <kind>``: each benchmark is a module with ``register(subparsers)``."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS = (
    "fastllm.bench.throughput",
    "fastllm.bench.latency",
    "fastllm.bench.serve",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks (throughput, latency, serve)")
    kinds = parser.add_subparsers(dest="bench", required=True)
    for module in BENCHMARKS:
        importlib.import_module(module).register(kinds)
