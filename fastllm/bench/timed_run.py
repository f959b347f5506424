"""Drive an engine through a batch of benchmark requests, stamping when each request's tokens arrive.

``RequestMetrics`` keeps the arrival, first-token and finish times of a request, not one time per
token, so inter-token latency is observed here, around ``engine.step()``: a request's gap is the
time between two steps that each gave it new tokens. A speculative step that yields several tokens
is one gap, as one streamed chunk is in vLLM's serving benchmark.
"""

from __future__ import annotations

import time
from itertools import pairwise
from typing import Any

from tqdm import tqdm

from fastllm.bench.datasets import BenchRequest
from fastllm.bench.stats import RequestResult
from fastllm.outputs import RequestOutput
from fastllm.sampling_params import SamplingParams


def greedy_params(request: BenchRequest) -> SamplingParams:
    """Exactly ``output_len`` tokens: greedy, eos ignored."""
    return SamplingParams(temperature=0.0, max_tokens=request.output_len, ignore_eos=True)


def run_timed(engine: Any, requests: list[BenchRequest], progress: bool = False) -> list[RequestResult]:
    """One result per request, in order; all requests are queued at once, then stepped to the end."""
    ids = [f"bench-{i}" for i in range(len(requests))]
    for request_id, request in zip(ids, requests):
        engine.add_request(request_id, None, request.prompt_token_ids, greedy_params(request))
    stamps: dict[str, list[float]] = {request_id: [] for request_id in ids}
    seen = dict.fromkeys(ids, 0)
    finished: dict[str, RequestOutput] = {}
    with tqdm(total=len(ids), desc="Processed prompts", disable=not progress) as bar:
        while engine.has_unfinished_requests():
            outputs = engine.step()
            now = time.time()
            for output in outputs:
                count = len(output.outputs.token_ids)
                if count > seen[output.request_id]:
                    seen[output.request_id] = count
                    stamps[output.request_id].append(now)
                if output.finished:
                    finished[output.request_id] = output
                    bar.update(1)
    return [to_result(finished[request_id], stamps[request_id]) for request_id in ids]


def to_result(output: RequestOutput, stamps: list[float]) -> RequestResult:
    """TTFT and end-to-end latency from the engine's metrics; ITL from the step stamps."""
    m = output.metrics
    ok = output.error_code == 200 and m.first_token_time is not None and m.finished_time is not None
    if not ok:
        return RequestResult(error=output.error_msg or "no tokens", prompt_tokens=len(output.prompt_token_ids))
    return RequestResult(ok=True, prompt_tokens=len(output.prompt_token_ids),
                         output_tokens=len(output.outputs.token_ids), ttft=m.first_token_time - m.arrival_time,
                         latency=m.finished_time - m.arrival_time,
                         itl=[b - a for a, b in pairwise(stamps)])
