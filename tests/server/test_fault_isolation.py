"""A step that raises fails the requests it touched with a generic 500 and the engine goes on;
an engine whose recovery fails too stops and says so, so that its server exits."""

from __future__ import annotations

import asyncio

import pytest

from fastllm.config import EngineConfig
from fastllm.engine.async_llm import AsyncLLM, EngineDeadError
from fastllm.engine.input_processor import RequestError
from fastllm.sampling_params import SamplingParams
from tests.server.conftest import MODEL, wait_idle

SECRET = "secret-internals-4711"


def _raise_once(target, name: str):
    original = getattr(target, name)
    calls = []

    def broken(*args, **kwargs):
        if not calls:
            calls.append(1)
            raise IndexError(SECRET)
        return original(*args, **kwargs)

    return broken


def test_a_failing_step_fails_its_request_with_a_generic_500(engine, server, monkeypatch):
    monkeypatch.setattr(engine.engine.runner, "execute_model", _raise_once(engine.engine.runner, "execute_model"))
    response = server.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4})
    assert response.status_code == 500, response.text
    message = response.json()["error"]["message"]
    assert "internal error while running request cmpl-" in message and SECRET not in response.text
    monkeypatch.undo()
    wait_idle(engine)
    assert engine.dead_error is None and server.get("/health").status_code == 200
    assert server.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}).ok
    kv = engine.engine.kv_cache
    assert kv.num_free_blocks == kv.pool.num_usable_blocks


def test_an_engine_that_cannot_recover_stops_and_calls_on_dead(tiny_llama_dir):
    engine = AsyncLLM(EngineConfig(model=tiny_llama_dir, load_format="dummy", max_model_len=64, block_size=16,
                                   num_gpu_blocks_override=8))
    died = []
    engine.on_dead.append(lambda: died.append(True))

    def broken(*args, **kwargs):
        raise IndexError(SECRET)

    engine.engine.runner.execute_model = broken
    engine.engine.abort_request = broken

    async def run() -> None:
        async for _ in engine.generate("r1", None, [5, 6, 7], SamplingParams(max_tokens=2)):
            pass

    with pytest.raises((RequestError, EngineDeadError)) as failed:
        asyncio.run(run())
    assert SECRET not in str(failed.value)
    engine._thread.join(timeout=30)
    assert died == [True] and SECRET not in str(engine.dead_error)
    with pytest.raises(EngineDeadError):
        asyncio.run(run())
    engine.shutdown(timeout=1)
