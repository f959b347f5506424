"""Per-request timings turned into a benchmark's numbers: mean, median and p99 of TTFT, TPOT, ITL, E2EL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RequestResult:
    """What one request took, however it was observed (a streaming client or the engine loop); seconds."""

    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)

    @property
    def tpot(self) -> float:
        """Time per output token after the first; 0 for a single-token answer."""
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


def distribution(values: Sequence[float]) -> dict[str, float]:
    """mean, median and p99 (numpy's linear interpolation); zeros for no values."""
    if not len(values):
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    return {"mean": float(np.mean(values)), "median": float(np.median(values)),
            "p99": float(np.percentile(values, 99))}


def summarize(results: list[RequestResult], duration: float) -> dict[str, Any]:
    """vLLM's benchmark keys: counts, throughputs, and ``{mean,median,p99}_{ttft,tpot,itl,e2el}_ms``."""
    done = [r for r in results if r.ok]
    input_tokens = sum(r.prompt_tokens for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    ms = {
        "ttft": [r.ttft * 1000 for r in done],
        "tpot": [r.tpot * 1000 for r in done if r.output_tokens > 1],
        "itl": [gap * 1000 for r in done for gap in r.itl],
        "e2el": [r.latency * 1000 for r in done],
    }
    summary: dict[str, Any] = {
        "completed": len(done), "failed": len(results) - len(done), "duration": duration,
        "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration, "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
    }
    for name, values in ms.items():
        for stat, value in distribution(values).items():
            summary[f"{stat}_{name}_ms"] = value
    return summary
