"""The server's default engine: the engine core in a child process (``EngineCoreClient``).

Its outputs equal the in-process ``AsyncLLM``'s token for token; streams that hang up free every
KV block; the core's death fails what is in flight and calls ``on_dead``; a core that cannot
start says why in the front end; the delta codec rebuilds every cumulative output.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from fastllm.config import EngineConfig
from fastllm.engine.async_llm import EngineDeadError
from fastllm.engine.core_client import EngineCoreClient
from fastllm.engine.input_processor import RequestError
from fastllm.engine.output_deltas import DeltaDecoder
from fastllm.engine.output_processor import OutputKind, OutputProcessor
from fastllm.engine.sequence import Sequence
from fastllm.sampling_params import GuidedDecodingParams, SamplingParams
from tests.chat.forced import CALL, CALL_ARGUMENTS
from tests.server.conftest import MODEL, start_server


@pytest.fixture(scope="module")
def core(smollm2_path):
    engine = EngineCoreClient(EngineConfig(model=smollm2_path, max_model_len=512, max_num_seqs=64, block_size=16,
                                           enable_prefix_caching=True, cpu_kv_cache_gib=0.5))
    yield engine
    engine.shutdown(timeout=10)
    assert engine.dead_error is None


@pytest.fixture(scope="module")
def core_server(core):
    running = start_server(core)
    yield running
    running.stop()


def wait_core_idle(core: EngineCoreClient, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while core.stats.num_requests_running or core.stats.num_requests_waiting or core.stats.kv_cache_usage:
        assert time.time() < deadline, f"engine still busy: {core.stats}"
        time.sleep(0.05)


async def _stream(server, index: int, hang_up: bool) -> tuple[str, int]:
    client = server.async_client(timeout=300)
    try:
        stream = await client.completions.create(model=MODEL, prompt=f"Story number {index}:", temperature=0,
                                                 max_tokens=60 if hang_up else 12, stream=True,
                                                 extra_body={"ignore_eos": True})
        text, chunks = "", 0
        async for chunk in stream:
            text += chunk.choices[0].text
            chunks += 1
            if hang_up and text:
                await stream.close()
                break
        return text, chunks
    finally:
        await client.close()


def test_streams_match_the_in_process_engine_and_free_their_blocks(core, core_server, server):
    async def run_all():
        return await asyncio.gather(*(_stream(core_server, i, hang_up=i % 4 == 0) for i in range(24)))

    results = asyncio.run(run_all())
    # the in-process AsyncLLM on the same weights is the reference: one request for every prompt
    read_whole = [index for index in range(len(results)) if index % 4]
    reference = server.client().completions.create(
        model=MODEL, prompt=[f"Story number {index}:" for index in read_whole], temperature=0, max_tokens=12,
        extra_body={"ignore_eos": True})
    expected = {read_whole[choice.index]: choice.text for choice in reference.choices}
    assert sorted(expected) == read_whole
    for index in read_whole:
        text, chunks = results[index]
        assert text == expected[index]
        assert chunks > 2  # the text came token by token, not in one piece
    wait_core_idle(core)
    assert core.stats.num_free_blocks == core.stats.num_usable_blocks
    assert core_server.metric("fastllm:kv_cache_usage_perc") == 0
    assert core_server.metric("fastllm:num_requests_running") == 0


def test_a_bad_request_fails_alone_with_its_message(core, core_server):
    too_long = core_server.post("/v1/completions", json={"model": MODEL, "prompt": [5] * 600, "max_tokens": 4})
    assert too_long.status_code == 400, too_long.text

    async def duplicate() -> None:
        first = core.generate("same-id", None, [5, 6, 7], SamplingParams(max_tokens=50, ignore_eos=True))
        await anext(first)
        with pytest.raises(RequestError, match="already in use"):
            await anext(core.generate("same-id", None, [5, 6], SamplingParams(max_tokens=2)))
        await first.aclose()

    asyncio.run(duplicate())
    assert core_server.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}).ok
    wait_core_idle(core)


def test_a_core_that_dies_fails_its_requests_and_calls_on_dead(tiny_llama_dir):
    engine = EngineCoreClient(EngineConfig(model=tiny_llama_dir, load_format="dummy", max_model_len=64,
                                           block_size=16, num_gpu_blocks_override=8))
    died = []
    engine.on_dead.append(lambda: died.append(True))

    async def run() -> None:
        # ">=": on a loaded machine one output may carry several tokens
        async for output in engine.generate("r1", None, [5, 6, 7], SamplingParams(max_tokens=60, ignore_eos=True)):
            if len(output.outputs.token_ids) >= 2 and engine._process.is_alive():
                engine._process.kill()

    try:
        with pytest.raises(EngineDeadError):
            asyncio.run(run())
        engine._reader.join(timeout=30)
        assert died == [True] and engine.dead_error is not None
        with pytest.raises(EngineDeadError):
            asyncio.run(run())
    finally:
        engine.shutdown(timeout=1)  # a core left alive would fail the next tests' check for stray processes


def test_a_core_that_cannot_start_says_why(tiny_llama_dir):
    with pytest.raises(ValueError, match="max_position_embeddings"):
        EngineCoreClient(EngineConfig(model=tiny_llama_dir, load_format="dummy", max_model_len=4096))


class _Text:
    """A detokenizer whose text the test sets."""

    text = ""


def test_deltas_rebuild_every_cumulative_output():
    """Text that shrinks comes back shortened; logprobs and tokens accumulate; each output is new."""
    processor = OutputProcessor(None)
    states = []
    for kind in (OutputKind.DELTA, OutputKind.CUMULATIVE):
        seq = Sequence("r", 0, [1, 2], SamplingParams(max_tokens=4, logprobs=1), frozenset([0]), 64)
        states.append(processor.new_request("r", "p", [seq], 1.0, True, kind))
        states[-1].samples[0].detokenizer = _Text()
    decoder, previous = DeltaDecoder("r", 1.0), None
    for token, text in ((3, "Hel"), (4, "Hello wo"), (5, "Hello")):
        for state in states:
            seq = state.samples[0].seq
            seq.append_token(token)
            seq.output_logprobs.append({token: -1.0})
            state.samples[0].detokenizer.text = text
            if token == 5:
                seq.finish("stop", stop_reason=5)
        rebuilt, step = decoder.decode(processor.emit(states[0]).payload), processor.emit(states[1])
        assert (rebuilt.outputs.token_ids, rebuilt.outputs.text, rebuilt.outputs.logprobs, rebuilt.finished,
                rebuilt.outputs.send_idx, rebuilt.prompt_token_ids) == (
            step.outputs.token_ids, step.outputs.text, step.outputs.logprobs, step.finished, step.outputs.send_idx,
            [1, 2])
        assert previous is None or previous.outputs.token_ids != rebuilt.outputs.token_ids  # a new object each
        previous = rebuilt
    assert previous.outputs.finish_reason == "stop" and previous.metrics.arrival_time == 1.0


def test_adapter_calls_cross_to_the_core_and_back(core):
    from fastllm.adapters import LoRARequest

    async def calls() -> None:
        assert await core.remove_adapter(3) is False  # nothing loaded: the engine's own answer
        with pytest.raises(RequestError, match="serves no adapters"):
            await core.add_adapter(LoRARequest("a", 1, "/nonexistent"))

    asyncio.run(calls())


def test_a_stream_closed_before_it_was_read_aborts_its_request(core):
    """``generate`` sends the request at once, so closing its outputs unread must take it back out."""
    async def leave() -> None:
        outputs = core.generate("never-read", None, [5, 6, 7], SamplingParams(max_tokens=480, ignore_eos=True))
        assert core.num_pending >= 1
        await outputs.aclose()
        async for _ in core.generate("read", None, [5, 6], SamplingParams(max_tokens=2)):
            pass  # its outputs carry the core's stats from after the abort

    asyncio.run(leave())
    wait_core_idle(core, timeout=2)
    assert core.stats.num_free_blocks == core.stats.num_usable_blocks


def test_stop_strings_over_the_pipe_end_as_in_process(core, smollm2_llm):
    """The core's deltas rebuild outputs whose text only grows, and whose last equals the offline engine's."""
    prompt = "The capital of France is"
    probe = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    text = smollm2_llm.generate(prompt, probe, use_tqdm=False)[0].outputs.text
    params = SamplingParams(n=2, temperature=0, max_tokens=12, ignore_eos=True,
                            stop=[text[len(text) // 2:len(text) // 2 + 4]])
    offline = smollm2_llm.generate(prompt, params, use_tqdm=False)[0]

    async def collect() -> list:
        return [output async for output in core.generate("stop", prompt, None, params)]

    streamed = asyncio.run(collect())
    fields = ("token_ids", "text", "finish_reason", "stop_reason")
    assert [[getattr(c, f) for f in fields] for c in streamed[-1].completions] == \
        [[getattr(c, f) for f in fields] for c in offline.completions]
    assert offline.outputs.finish_reason == "stop" and streamed[-1].finished
    assert all(offline.completions[c.index].text.startswith(c.text) for o in streamed for c in o.completions)


def test_tool_calls_are_split_in_the_core(core):
    """A request naming a tool parser gets its calls out of its text in the core process."""
    params = SamplingParams(temperature=0, max_tokens=64, guided_decoding=GuidedDecodingParams(choice=[CALL]))

    async def collect() -> list:
        return [output async for output in core.generate("tools", f"Reply with exactly this text:\n{CALL}", None,
                                                          params, tool_call_parser="hermes")]

    final = asyncio.run(collect())[-1].outputs
    (call,) = final.tool_calls
    assert (final.text, call.name, json.loads(call.arguments)) == ("", "get_weather", CALL_ARGUMENTS)


def test_outputs_carry_the_front_ends_prompt(core):
    """The core sends no prompt back: outputs carry the front's text and ids, or the ids the core made."""
    async def final(request_id: str, ids) -> object:
        return [output async for output in core.generate(request_id, "Hi", ids, SamplingParams(max_tokens=2))][-1]

    with_ids, text_only = asyncio.run(final("with-ids", [5, 6, 7])), asyncio.run(final("text-only", None))
    assert (with_ids.prompt, with_ids.prompt_token_ids) == ("Hi", [5, 6, 7])
    assert (text_only.prompt, text_only.prompt_token_ids) == ("Hi", core.inputs.tokenize("Hi"))
