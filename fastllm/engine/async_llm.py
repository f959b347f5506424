"""An asyncio front over one LLMEngine whose ``step()`` loop runs in a background thread.

The engine is not thread-safe, so every engine call happens on that one thread:
requests come in through a thread-safe inbox, and each request's outputs go back
to the event loop that asked for them through its own asyncio queue
(``loop.call_soon_threadsafe``). Several event loops (several servers) may share
one ``AsyncLLM``.

The one exception is a guided request's grammar: it compiles on a worker thread (a large
schema can take seconds), and the request comes back through the inbox once it is compiled,
while the others keep stepping; one that outlasts the compile timeout fails alone.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

from fastllm.config import EngineConfig
from fastllm.engine.input_processor import RequestError
from fastllm.engine.llm_engine import LLMEngine
from fastllm.engine.request_state import RequestState
from fastllm.outputs import RequestOutput
from fastllm.sampling_params import SamplingParams

logger = logging.getLogger("fastllm")


class EngineDeadError(RuntimeError):
    """The engine loop stopped (a step raised, or the engine shut down); no request can run."""


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the engine thread publishes after every iteration, safe to read anywhere."""

    num_requests_running: int = 0
    num_requests_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_free_blocks: int = 0
    num_usable_blocks: int = 0
    num_preemptions: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0


@dataclass
class _Stream:
    """Where one request's outputs go: a queue owned by the event loop that asked."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue

    def put(self, item: RequestOutput | BaseException) -> None:
        if not self.loop.is_closed():  # a server that already stopped has nobody to tell
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass
class _Add:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: Optional[list[int]]
    params: SamplingParams
    arrival_time: float
    chat_template_kwargs: Optional[dict[str, Any]]
    stream: _Stream


@dataclass
class _Compiled:
    """A guided request back from its compile: its grammar, or why it has none."""

    add: _Add
    grammar: Any = None
    error: Optional[BaseException] = None


@dataclass
class _Abort:
    request_id: str
    notify: bool = False  # True when the server, not the consumer, ends the request


class AsyncLLM:
    """``generate()`` is an async iterator of cumulative RequestOutputs for one request.

    Leaving the iteration early (a client that disconnects cancels it) aborts the
    request, which frees its KV blocks on the next engine iteration.
    """

    def __init__(self, config: EngineConfig):
        self.engine = LLMEngine(config)
        self.config = config
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self.stats = EngineStats(num_usable_blocks=self.engine.kv_cache.pool.num_usable_blocks,
                                 num_free_blocks=self.engine.kv_cache.num_free_blocks)
        self.dead_error: Optional[BaseException] = None
        self._inbox: queue.SimpleQueue[_Add | _Compiled | _Abort | None] = queue.SimpleQueue()
        self._compiling: dict[str, _Add] = {}  # guided requests whose grammar is compiling; guarded by _lock
        self._compiler = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fastllm-grammar")
        self._streams: dict[str, _Stream] = {}
        self._stopping = False
        self._closed = False  # set by the engine thread as it exits; guarded by _lock with every hand-in
        self._lock = threading.Lock()
        self._spec_retired = (0, 0)
        self._thread = threading.Thread(target=self._run, name="fastllm-engine", daemon=True)
        self._thread.start()

    # ---- event-loop side ---------------------------------------------------------------------
    @property
    def num_pending(self) -> int:
        """Requests not yet scheduled: the last snapshot's waiting ones plus those still in the inbox
        or compiling their grammar."""
        return self.stats.num_requests_waiting + self._inbox.qsize() + len(self._compiling)

    async def generate(self, request_id: str, prompt: Optional[str], prompt_token_ids: Optional[list[int]],
                       params: SamplingParams,
                       chat_template_kwargs: Optional[dict[str, Any]] = None) -> AsyncIterator[RequestOutput]:
        """Yield the request's latest output until it finishes; raises RequestError for bad input."""
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            if self._closed or self._stopping or self.dead_error is not None:
                raise EngineDeadError(str(self.dead_error or "the engine is shutting down"))
            self._inbox.put(_Add(request_id, prompt, prompt_token_ids, params, time.time(),
                                 chat_template_kwargs, stream))
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                while not stream.queue.empty():  # outputs are cumulative: skip to the newest
                    item = stream.queue.get_nowait()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    def shutdown(self, timeout: float = 30.0) -> None:
        """Refuse new requests, let running ones finish for up to ``timeout`` s, abort the rest."""
        self._stopping = True
        self._inbox.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            for request_id in list(self._streams):
                self._inbox.put(_Abort(request_id, notify=True))
            self._inbox.put(None)
            self._thread.join()

    # ---- engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not (self._stopping and not self.engine.has_unfinished_requests()):
                self._drain_inbox(block=not self.engine.has_unfinished_requests())
                self._publish_stats()
                if self.engine.has_unfinished_requests():
                    self._step()
        except Exception as exc:  # a failed step leaves the engine in an unknown state
            logger.exception("engine loop failed; failing every in-flight request")
            self.dead_error = EngineDeadError(f"engine loop failed: {exc!r}")
        with self._lock:  # from here on nothing new gets in, so what is queued now is all that is left
            self._closed = True
        error = self.dead_error or EngineDeadError("the engine shut down")
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if isinstance(item, _Add):
                item.stream.put(error)
        with self._lock:
            compiling, self._compiling = list(self._compiling.values()), {}
        for item in compiling:
            item.stream.put(error)
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()
        self._compiler.shutdown(wait=False, cancel_futures=True)

    def _drain_inbox(self, block: bool) -> None:
        item = self._inbox.get() if block else self._next_nowait()
        while item is not None or not self._inbox.empty():
            if isinstance(item, _Add):
                self._add(item)
            elif isinstance(item, _Compiled):
                self._add_compiled(item)
            elif isinstance(item, _Abort):
                self._abort(item)
            item = self._next_nowait()

    def _next_nowait(self) -> _Add | _Abort | None:
        try:
            return self._inbox.get_nowait()
        except queue.Empty:
            return None

    def _add(self, item: _Add, grammar: Any = None) -> None:
        if item.params.guided_decoding is not None and grammar is None and self.engine.structured_output is not None:
            self._compile(item)
            return
        try:
            self.engine.add_request(item.request_id, item.prompt, item.prompt_token_ids, item.params,
                                    item.arrival_time, item.chat_template_kwargs, grammar=grammar)
        except Exception as exc:  # RequestError for bad input; anything else fails this request only
            if not isinstance(exc, ValueError):
                logger.exception("adding request %s failed", item.request_id)
            item.stream.put(exc)
            return
        self._streams[item.request_id] = item.stream

    def _compile(self, item: _Add) -> None:
        """Compile the request's grammar on a worker; the result, or a timeout, whichever comes
        first, goes back through the inbox (see ``_add_compiled``)."""
        with self._lock:
            self._compiling[item.request_id] = item
        timeout = self.config.structured_output_compile_timeout

        def done(future: Future) -> None:
            error = future.exception()
            self._compiled(_Compiled(item, None if error else future.result(), error))

        timer = threading.Timer(timeout, self._compiled, args=(_Compiled(item, error=RequestError(
            f"invalid guided decoding spec: compiling it took longer than {timeout:g} s"), ),))
        timer.daemon = True
        timer.start()
        future = self._compiler.submit(self.engine.compile_grammar, item.params.guided_decoding)
        future.add_done_callback(done)
        future.add_done_callback(lambda _: timer.cancel())

    def _compiled(self, result: _Compiled) -> None:
        """Any thread: hand a compile's outcome to the engine thread, unless the request already
        has one (compiled or timed out) or was aborted meanwhile."""
        with self._lock:
            if self._compiling.pop(result.add.request_id, None) is not result.add or self._closed:
                return
            self._inbox.put(result)

    def _add_compiled(self, result: _Compiled) -> None:
        if result.error is not None:
            if not isinstance(result.error, ValueError):
                logger.error("compiling the grammar of request %s failed: %r", result.add.request_id, result.error)
            result.add.stream.put(result.error)
            return
        self._add(result.add, grammar=result.grammar)

    def _abort(self, item: _Abort) -> None:
        with self._lock:
            self._compiling.pop(item.request_id, None)
        self._retire(self.engine.requests.get(item.request_id))
        output = self.engine.abort_request(item.request_id)
        stream = self._streams.pop(item.request_id, None)
        if output is not None:
            logger.info("Aborted request %s", item.request_id)
            if item.notify and stream is not None:
                stream.put(output)

    def _step(self) -> None:
        """One engine step; the stats snapshot is updated before any client hears of the step's outputs,
        so a client that reacts to an output (or a server admitting the next request) never reads older stats."""
        live = dict(self.engine.requests) if self.engine.speculator is not None else {}
        outputs = self.engine.step()
        for output in outputs:
            if output.finished:
                self._retire(live.get(output.request_id))
        self._publish_stats()
        for output in outputs:
            stream = self._streams.pop(output.request_id, None) if output.finished else self._streams.get(
                output.request_id)
            if stream is not None:
                stream.put(output)

    def _retire(self, state: Optional[RequestState]) -> None:
        """Fold an ending request's speculative-decoding counts into the running totals."""
        if state is not None and state.num_draft_tokens:
            drafts, accepted = self._spec_retired
            self._spec_retired = (drafts + state.num_draft_tokens, accepted + state.num_accepted_tokens)

    def _publish_stats(self) -> None:
        scheduler, kv_cache = self.engine.scheduler, self.engine.kv_cache
        self.stats = EngineStats(
            num_requests_running=len({seq.request_id for seq in scheduler.running}),
            num_requests_waiting=len({seq.request_id for seq in scheduler.waiting}),
            kv_cache_usage=kv_cache.usage(), num_free_blocks=kv_cache.num_free_blocks,
            num_usable_blocks=kv_cache.pool.num_usable_blocks, num_preemptions=scheduler.num_preemptions,
            spec_num_draft_tokens=self._spec_retired[0], spec_num_accepted_tokens=self._spec_retired[1])
