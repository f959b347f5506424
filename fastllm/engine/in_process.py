"""The model runner of a single-process engine, for tools that work on the model in place
(offline quantization, weight counts, tests)."""

from __future__ import annotations

from typing import Any

import torch


def engine_runner(llm: Any) -> Any:
    """The ``ModelRunner`` of ``llm`` (an ``LLM``); quantization happens in the process that holds it."""
    executor = llm.engine.runner
    runner = getattr(executor, "runner", executor)
    if not hasattr(runner, "model"):
        raise SystemExit("this tool runs with tensor_parallel_size=1 only")
    return runner


def engine_model(llm: Any) -> torch.nn.Module:
    """The model of a single-process engine."""
    return engine_runner(llm).model
