"""300 concurrent streams, a third of them hanging up mid-stream: no 5xx, and every KV block comes back."""

from __future__ import annotations

import asyncio

import pytest
import requests

from tests.server.conftest import MODEL, wait_idle

NUM_REQUESTS = 300
LONG = 200  # the requests that hang up ask for far more than they read, so only an abort ends them early
ABORTED = 'fastllm:request_success_total{finished_reason="abort"}'


async def one_request(client, index: int) -> str:
    """'done' or 'hung up'; any HTTP error propagates with its status."""
    hangs_up = index % 3 == 0
    stream = await client.completions.create(model=MODEL, prompt=f"Story number {index}:", temperature=0.8,
                                             seed=index, max_tokens=LONG if hangs_up else 4 + index % 5,
                                             stream=True, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if hangs_up and chunk.choices[0].text:
            await stream.close()
            return "hung up"
    return "done"


async def run_all(server) -> list:
    client = server.async_client(timeout=600)
    try:
        return await asyncio.gather(*(one_request(client, i) for i in range(NUM_REQUESTS)), return_exceptions=True)
    finally:
        await client.close()


def test_many_streams_with_disconnects_leave_nothing_behind(engine, server):
    failed_before = server.metric("fastllm:request_process_fail_total")
    aborted_before = server.metric(ABORTED)
    results = asyncio.run(run_all(server))
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    assert results.count("hung up") == NUM_REQUESTS // 3

    wait_idle(engine)
    assert server.metric("fastllm:num_requests_running") == 0
    assert server.metric("fastllm:num_requests_waiting") == 0
    assert server.metric("fastllm:kv_cache_usage_perc") == 0
    assert server.metric("fastllm:request_process_fail_total") - failed_before == NUM_REQUESTS // 3
    assert server.metric(ABORTED) - aborted_before == NUM_REQUESTS // 3  # ended by an abort, not by running out
    kv_cache = engine.engine.kv_cache
    assert kv_cache.num_free_blocks == kv_cache.pool.num_usable_blocks


def test_non_streaming_client_that_leaves_aborts_its_request(engine, server):
    failed_before = server.metric("fastllm:request_process_fail_total")
    aborted_before = server.metric(ABORTED)
    body = {"model": MODEL, "prompt": "A very long story:", "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(requests.ReadTimeout):
        requests.post(f"{server.url}/v1/completions", json=body, timeout=1.5)
    wait_idle(engine)
    assert server.metric("fastllm:request_process_fail_total") - failed_before == 1
    assert server.metric(ABORTED) - aborted_before == 1
    assert engine.engine.kv_cache.usage() == 0
