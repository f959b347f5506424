"""--max-waiting-requests: a 429 exactly while that many requests wait, and service again once they are gone."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import openai
import pytest

from fastllm.config import EngineConfig
from fastllm.engine.async_llm import AsyncLLM
from tests.server.conftest import MODEL, start_server


@pytest.fixture(scope="module")
def one_seat(smollm2_path):
    """An engine that runs one sequence at a time, so a second request must wait; one waiting fills the queue."""
    engine = AsyncLLM(EngineConfig(model=smollm2_path, max_model_len=256, max_num_seqs=1, block_size=16,
                                   cpu_kv_cache_gib=0.1))
    running = start_server(engine, max_waiting_requests=1)
    yield engine, running
    running.stop()
    engine.shutdown(timeout=10)


async def until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def test_full_queue_is_429_and_drained_queue_serves_again(one_seat):
    engine, server = one_seat
    short = dict(model=MODEL, prompt="Hello", max_tokens=2, extra_body={"ignore_eos": True})

    async def scenario() -> list[openai.RateLimitError]:
        client = server.async_client(timeout=120)
        refused = []
        try:
            assert engine.num_pending == 0
            occupying = await client.completions.create(model=MODEL, prompt="A long story:", max_tokens=200,
                                                        stream=True, extra_body={"ignore_eos": True})
            waiting = asyncio.ensure_future(client.completions.create(**short))
            await until(lambda: engine.num_pending == 1)
            for create in (lambda: client.completions.create(**short),
                           lambda: client.chat.completions.create(model=MODEL, max_tokens=2,
                                                                  messages=[{"role": "user", "content": "hi"}])):
                with pytest.raises(openai.RateLimitError) as refusal:
                    await create()
                refused.append(refusal.value)
            await occupying.close()  # frees the seat: the waiting request runs, the queue empties
            assert (await waiting).usage.completion_tokens == 2
            await until(lambda: engine.num_pending == 0)
            assert (await client.completions.create(**short)).usage.completion_tokens == 2
        finally:
            await client.close()
        return refused

    refused = asyncio.run(scenario())
    assert [error.body["type"] for error in refused] == ["rate_limit_error"] * 2
    assert server.metric("fastllm:request_process_fail_total") == 3  # two refusals and the stream that hung up
