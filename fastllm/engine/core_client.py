"""The server's engine: ``AsyncLLM``'s interface over an engine core in its own process.

In one process the event loop (HTTP, chat templates, SSE chunks) and the engine loop take turns
on one GIL, and the engine waits for the front end's Python work. Here the engine loop runs in
a child process (``fastllm.engine.core_process``); this process tokenizes, sends requests down a
pipe, and a reader thread turns each iteration's deltas back into cumulative ``RequestOutput``s
for the event loops that asked. A request's outputs reach its client as the core sends them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from fastllm.adapters import LoRARequest
from fastllm.config import EngineConfig
from fastllm.engine.async_llm import EngineDeadError, QueuedOutputs
from fastllm.engine.core_process import run_engine_core
from fastllm.engine.input_processor import InputProcessor, RequestError
from fastllm.engine.llm_engine import load_model_files
from fastllm.engine.output_deltas import DeltaDecoder, decode_error, is_last
from fastllm.engine.stats import EngineStats
from fastllm.sampling_params import SamplingParams

logger = logging.getLogger("fastllm")


@dataclass
class _Stream:
    """Where one request's outputs go: a queue of the event loop that asked, and the decoder that
    rebuilds them."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    decoder: DeltaDecoder


class EngineCoreClient:
    """What the server needs of an engine (``AsyncLLM``'s interface), with the engine in a child
    process. The child's death, or its engine loop's, fails every request in flight and runs
    the ``on_dead`` callbacks once, as ``AsyncLLM`` does."""

    def __init__(self, config: EngineConfig, request_window: Optional[int] = None, start_timeout: float = 3600.0):
        context = multiprocessing.get_context("spawn")  # the parent may hold threads and a device
        self._conn, child = context.Pipe()
        self._process = context.Process(target=run_engine_core, name="fastllm-engine-core", daemon=False,
                                        args=(config, request_window, child, logging.getLogger().level))
        self._process.start()
        child.close()
        self.config = config
        try:
            _, _, hf_config, self.tokenizer = load_model_files(config)  # while the core loads the weights
            self.max_model_len = self._wait_ready(start_timeout)
        except BaseException:
            self._process.kill()
            raise
        self.inputs = InputProcessor(self.tokenizer, self.max_model_len, hf_config.vocab_size)
        self.stats = EngineStats()
        self.dead_error: Optional[BaseException] = None
        self.on_dead: list[Callable[[], None]] = []
        self._streams: dict[str, _Stream] = {}
        self._calls: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._call_ids = itertools.count()
        self._lock = threading.Lock()  # guards the pipe's sending end, _streams, _calls and the counters
        self._stopping = False
        self._closed = False
        self._num_added = 0
        self._core_pending = (0, 0)  # the core's pending requests, and how many adds it had seen then
        self._reader = threading.Thread(target=self._read, name="fastllm-core-reader", daemon=True)
        self._reader.start()

    def _wait_ready(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while not self._conn.poll(1.0):
            if not self._process.is_alive():
                raise RuntimeError(f"the engine core process exited with code {self._process.exitcode} "
                                   "while starting; see its log above")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the engine core did not start within {timeout:g} s")
        try:
            message = self._conn.recv()
        except EOFError:
            raise RuntimeError("the engine core process exited while starting; see its log above") from None
        if message[0] == "failed":
            _, kind, text = message
            raise (ValueError if kind == "value" else RuntimeError)(text)
        return message[1]

    # ---- event-loop side ---------------------------------------------------------------------
    @property
    def num_pending(self) -> int:
        """Requests not yet scheduled: the core's last count, plus those sent since it counted."""
        pending, seen = self._core_pending
        return pending + self._num_added - seen

    def _send(self, message: tuple) -> None:
        """Under ``_lock``: refused once the engine is dead or shutting down."""
        if self._closed or self._stopping or self.dead_error is not None:
            raise EngineDeadError(str(self.dead_error or "the engine is shutting down"))
        self._conn.send(message)

    def generate(self, request_id: str, prompt: Optional[str], prompt_token_ids: Optional[list[int]],
                 params: SamplingParams, chat_template_kwargs: Optional[dict[str, Any]] = None,
                 lora_request: Optional[LoRARequest] = None, group: Optional[str] = None,
                 multimodal_data: Optional[dict[str, Any]] = None,
                 tool_call_parser: Optional[str] = None) -> QueuedOutputs:
        """The request's latest outputs until it finishes; raises RequestError for bad input.

        The request goes to the core now, not when the outputs are first asked for: a server
        with hundreds of handlers in turn would otherwise send it only after all of them ran."""
        arrival_time = time.time()
        decoder = DeltaDecoder(request_id, arrival_time, prompt, list(prompt_token_ids or []))
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), decoder)
        with self._lock:
            if request_id in self._streams:
                raise RequestError(f"request id {request_id!r} is already in use")
            # the core needs the text only to tokenize it: its outputs get the prompt here, from the decoder
            self._send(("add", request_id, prompt if prompt_token_ids is None else None, prompt_token_ids, params,
                        arrival_time, chat_template_kwargs, lora_request, group, multimodal_data, tool_call_parser))
            self._streams[request_id] = stream
            self._num_added += 1
        return QueuedOutputs(stream.queue, lambda: self.abort(request_id))

    def abort(self, request_id: str) -> None:
        with self._lock:
            if self._streams.pop(request_id, None) is not None and not self._closed:
                self._conn.send(("abort", request_id))

    async def add_adapter(self, lora_request: LoRARequest) -> None:
        await self._call("add_adapter", lora_request)

    async def remove_adapter(self, adapter_id: int) -> bool:
        return await self._call("remove_adapter", adapter_id)

    async def start_profile(self) -> None:
        await self._call("start_profile")

    async def stop_profile(self) -> None:
        await self._call("stop_profile")

    async def _call(self, method: str, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            call_id = next(self._call_ids)
            self._send(("call", call_id, method, args))
            self._calls[call_id] = (loop, future)
        return await future

    def shutdown(self, timeout: float = 30.0) -> None:
        """Refuse new requests, let running ones finish for up to ``timeout`` s, abort the rest."""
        with self._lock:
            stopping, self._stopping = self._stopping, True
            if not stopping and not self._closed:
                self._conn.send(("shutdown", timeout))
        self._reader.join(timeout + 30)
        self._process.join(10)
        if self._process.is_alive():
            logger.warning("the engine core did not exit; killing it")
            self._process.kill()
            self._process.join()

    # ---- reader thread -----------------------------------------------------------------------
    def _read(self) -> None:
        error: BaseException = EngineDeadError("the engine process exited unexpectedly; see the server log")
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "out":
                _, deltas, self.stats, pending, seen = message
                self._core_pending = (pending, seen)
                self._deliver(deltas)
            elif kind == "result":
                self._settle(*message[1:])
            elif kind == "dead":
                error = EngineDeadError(message[1])
                break
            elif kind == "bye":
                error = None
                break
        self._close(error)

    def _deliver(self, deltas: list[tuple[str, tuple]]) -> None:
        """Decode the deltas and hand each output to its event loop: one wake-up per loop."""
        with self._lock:
            streams = [self._streams.get(request_id) for request_id, _ in deltas]
            for (request_id, (kind, payload)), stream in zip(deltas, streams):
                if stream is not None and is_last(kind, payload):
                    del self._streams[request_id]
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
        for (_, (kind, payload)), stream in zip(deltas, streams):
            if stream is not None:  # else aborted meanwhile
                item = decode_error(payload) if kind == "error" else stream.decoder.decode(payload)
                batches.setdefault(stream.loop, []).append((stream.queue, item))
        for loop, items in batches.items():
            _post(loop, _put_all, items)

    def _settle(self, call_id: int, result: Any, error: Optional[tuple]) -> None:
        with self._lock:
            loop, future = self._calls.pop(call_id)
        _post(loop, _settle_now, future, result, None if error is None else decode_error(error))

    def _close(self, error: Optional[BaseException]) -> None:
        """The core is gone: a clean shutdown, or (``error``) a death that takes the server down."""
        with self._lock:
            self._closed = True
            self._conn.close()  # the core, if still there, sees the end of its input and exits
            streams, self._streams = list(self._streams.values()), {}
            calls, self._calls = list(self._calls.values()), {}
        self.dead_error = error
        failure = error or EngineDeadError("the engine shut down")
        for stream in streams:
            _post(stream.loop, stream.queue.put_nowait, failure)
        for loop, future in calls:
            _post(loop, _settle_now, future, None, failure)
        if error is not None:
            logger.error("the engine core stopped: %s", error)
            for callback in self.on_dead:
                callback()


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    if not loop.is_closed():  # a server that already stopped has nobody to tell
        loop.call_soon_threadsafe(fn, *args)


def _put_all(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


def _settle_now(future: asyncio.Future, result: Any, error: Optional[BaseException]) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
