"""The server's engine compiles a guided request's grammar on a worker thread: other requests
keep stepping meanwhile, a compile past the timeout fails only its own request, and a refusal
is still the request's RequestError (its 400)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from fastllm import SamplingParams
from fastllm.config import EngineConfig
from fastllm.engine.async_llm import AsyncLLM
from fastllm.engine.input_processor import RequestError
from fastllm.sampling_params import GuidedDecodingParams

pytest.importorskip("fastllm_xgrammar")

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@pytest.fixture(scope="module")
def engine(smollm2_path):
    engine = AsyncLLM(EngineConfig(model=smollm2_path, max_model_len=256, block_size=16, cpu_kv_cache_gib=0.1,
                                   structured_output_compile_timeout=3.0))
    # build every backend now (the first can take seconds), so only the test's own delay counts
    engine.engine.compile_grammar(GuidedDecodingParams(json={"not": {}}, strict=False))
    yield engine
    engine.shutdown(timeout=10)


async def collect(engine: AsyncLLM, request_id: str, params: SamplingParams):
    final = None
    async for output in engine.generate(request_id, "Answer in JSON:", None, params):
        final = output
    return final


def test_a_slow_compile_holds_only_its_request_and_times_out_alone(engine, monkeypatch):
    release = threading.Event()
    compile_grammar = engine.engine.compile_grammar

    def slow(spec):
        if spec.regex == "slow":
            release.wait(30)
        return compile_grammar(spec)

    monkeypatch.setattr(engine.engine, "compile_grammar", slow)

    async def scenario():
        stuck = asyncio.ensure_future(collect(engine, "stuck", SamplingParams(
            max_tokens=4, guided_decoding={"regex": "slow"})))
        plain = await collect(engine, "plain", SamplingParams(max_tokens=8, ignore_eos=True))
        assert not stuck.done()  # the unguided request finished while the grammar compiled
        guided = await collect(engine, "guided", SamplingParams(temperature=0.0, max_tokens=16,
                                                                guided_decoding={"json": SCHEMA}))
        with pytest.raises(RequestError, match="took longer than 3 s"):
            await stuck
        return plain, guided

    try:
        plain, guided = asyncio.run(scenario())
    finally:
        release.set()
    assert len(plain.outputs.token_ids) == 8
    assert guided.outputs.finish_reason == "stop" and guided.outputs.text in ('{"ok": true}', '{"ok": false}')


def test_a_refused_spec_is_the_requests_error(engine):
    params = SamplingParams(max_tokens=4, guided_decoding={"json": {"type": "integer", "not": {"const": 1}}})
    with pytest.raises(RequestError, match="'not' at /"):
        asyncio.run(collect(engine, "refused", params))
