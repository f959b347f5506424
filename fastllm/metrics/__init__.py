"""Prometheus metrics of the OpenAI server: per-request histograms and engine gauges.

Every metric lives on a registry the caller passes in, so several servers can run
in one process (as the tests do) without their series colliding.
"""

from fastllm.metrics.engine_collector import EngineStatsCollector
from fastllm.metrics.serving_metrics import ServingMetrics

__all__ = ["EngineStatsCollector", "ServingMetrics"]
