"""Gauges and engine-side counters, read from the engine thread's latest stats snapshot at scrape time."""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fastllm.engine.stats import EngineStats


class EngineStatsCollector(Collector):
    """Scrapes never touch the engine: they read the snapshot ``stats()`` returns."""

    def __init__(self, stats: Callable[[], EngineStats]):
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats()
        yield GaugeMetricFamily("fastllm:num_requests_running", "Number of requests in the running batch.",
                                stats.num_requests_running)
        yield GaugeMetricFamily("fastllm:num_requests_waiting", "Number of requests waiting to be scheduled.",
                                stats.num_requests_waiting)
        yield GaugeMetricFamily("fastllm:kv_cache_usage_perc",
                                "Fraction of KV-cache blocks in use (1 means 100 percent).", stats.kv_cache_usage)
        yield GaugeMetricFamily("fastllm:lora_count", "Number of LoRA adapters in the running batch.",
                                stats.num_running_adapters)
        yield CounterMetricFamily("fastllm:num_preemptions", "Cumulative number of preemption from the engine.",
                                  stats.num_preemptions)
        yield CounterMetricFamily("fastllm:spec_decode_num_draft_tokens",
                                  "Draft tokens proposed by speculative decoding (counted when a request ends).",
                                  stats.spec_num_draft_tokens)
        yield CounterMetricFamily("fastllm:spec_decode_num_accepted_tokens",
                                  "Draft tokens accepted by verification (counted when a request ends).",
                                  stats.spec_num_accepted_tokens)
