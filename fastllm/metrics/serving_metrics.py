"""Per-request counters and histograms: the AIAK / vLLM monitoring table, ``vllm:`` renamed ``fastllm:``.

One HTTP request may carry several prompts (``/v1/completions`` with a list); the
``request_total`` / ``request_process_*`` counters count HTTP requests, the
histograms and ``request_success_total`` count engine requests (one per prompt).
"""

from __future__ import annotations

from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Histogram

from fastllm.outputs import RequestOutput

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
N_BUCKETS = (1, 2, 5, 10, 20)
FINISH_REASONS = ("stop", "length", "abort")


def token_buckets(max_model_len: int) -> list[int]:
    """1-2-5 steps up to the context length: every possible prompt or output length has a bucket."""
    buckets, scale = [], 1
    while True:
        for step in (1, 2, 5):
            if step * scale > max_model_len:
                return buckets + [max_model_len]
            buckets.append(step * scale)
        scale *= 10


class ServingMetrics:
    """The server's own metrics on ``registry``.

    ``fastllm:lora_count`` (adapters in the running batch) is an engine gauge (EngineStatsCollector).
    """

    def __init__(self, registry: CollectorRegistry, max_model_len: int):
        tokens = token_buckets(max_model_len)
        self.request_total = Counter("fastllm:request_total", "Count of successfully receives requests.",
                                     registry=registry)
        self.process_success = Counter("fastllm:request_process_success_total",
                                       "Count of successfully processed requests.", registry=registry)
        self.process_fail = Counter("fastllm:request_process_fail_total",
                                    "Count of failed processed requests (errors and aborted requests).",
                                    registry=registry)
        self.success = Counter("fastllm:request_success_total",
                               "Count of finished engine requests, by finish reason.", ["finished_reason"],
                               registry=registry)
        for reason in FINISH_REASONS:  # exported at zero from the start, so dashboards see every series
            self.success.labels(finished_reason=reason)
        self.e2e_latency = Histogram("fastllm:e2e_request_latency_seconds", "End to end request latency in seconds.",
                                     buckets=LATENCY_BUCKETS, registry=registry)
        self.infer_duration = Histogram("fastllm:inference_compute_infer_duration",
                                        "Inference compute infer duration in seconds (first schedule to finish).",
                                        buckets=LATENCY_BUCKETS, registry=registry)
        self.ttft = Histogram("fastllm:time_to_first_token_seconds", "Time to first token in seconds.",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.tpot = Histogram("fastllm:time_per_output_token_seconds",
                              "Time per output token in seconds (a request's mean after its first token).",
                              buckets=TOKEN_LATENCY_BUCKETS, registry=registry)
        self.prompt_tokens = Histogram("fastllm:request_prompt_tokens", "Prefill tokens processed per request.",
                                       buckets=tokens, registry=registry)
        self.generation_tokens = Histogram("fastllm:request_generation_tokens",
                                           "Generation tokens processed per request.", buckets=tokens,
                                           registry=registry)
        self.params_n = Histogram("fastllm:request_params_n", "The n request parameter.", buckets=N_BUCKETS,
                                  registry=registry)
        self.prompt_tokens_total = Counter("fastllm:prompt_tokens_total", "Number of prefill tokens processed.",
                                           registry=registry)
        self.generation_tokens_total = Counter("fastllm:generation_tokens_total",
                                               "Number of generation tokens processed.", registry=registry)
        self.lora_e2e_latency = Histogram("fastllm:lora_time_e2e_requests",
                                          "Total request time for the LoRA model.", buckets=LATENCY_BUCKETS,
                                          registry=registry)
        self.lora_requests = Counter("fastllm:lora_requests_total", "Finished engine requests per LoRA adapter.",
                                     ["lora_name"], registry=registry)

    def on_received(self) -> None:
        self.request_total.inc()

    def on_processed(self, ok: bool) -> None:
        (self.process_success if ok else self.process_fail).inc()

    def on_engine_request_aborted(self) -> None:
        """An engine request ended before finishing (client gone, shutdown timeout): vLLM's ``abort`` reason."""
        self.success.labels(finished_reason="abort").inc()

    def on_engine_request_finished(self, output: RequestOutput, lora_name: Optional[str] = None) -> None:
        """Record one finished engine request from the timestamps the engine kept."""
        metrics = output.metrics
        if lora_name is not None:
            self.lora_requests.labels(lora_name=lora_name).inc()
            if metrics.finished_time is not None:
                self.lora_e2e_latency.observe(metrics.finished_time - metrics.arrival_time)
        generated = sum(len(c.token_ids) for c in output.completions)
        for completion in output.completions:
            self.success.labels(finished_reason=completion.finish_reason or "abort").inc()
        self.params_n.observe(len(output.completions))
        self.prompt_tokens.observe(len(output.prompt_token_ids))
        self.generation_tokens.observe(generated)
        self.prompt_tokens_total.inc(len(output.prompt_token_ids))
        self.generation_tokens_total.inc(generated)
        if metrics.finished_time is None:
            return
        self.e2e_latency.observe(metrics.finished_time - metrics.arrival_time)
        if metrics.inference_start_time is not None:
            self.infer_duration.observe(metrics.finished_time - metrics.inference_start_time)
        if metrics.first_token_time is not None:
            self.ttft.observe(metrics.first_token_time - metrics.arrival_time)
            longest = max(len(c.token_ids) for c in output.completions)
            if longest > 1:
                self.tpot.observe((metrics.finished_time - metrics.first_token_time) / (longest - 1))
