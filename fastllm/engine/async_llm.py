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
from collections import deque
from contextlib import aclosing
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional

from fastllm.adapters import LoRARequest
from fastllm.config import EngineConfig
from fastllm.engine.fair_admission import FairAdmission
from fastllm.engine.input_processor import RequestError
from fastllm.engine.llm_engine import LLMEngine
from fastllm.engine.output_processor import OutputKind
from fastllm.outputs import RequestOutput
from fastllm.sampling_params import SamplingParams

logger = logging.getLogger("fastllm")


class EngineDeadError(RuntimeError):
    """The engine loop stopped (it could not recover from an error, or the engine shut down)."""


def internal_error(request_id: str) -> RequestError:
    """What a client hears when its request failed inside the engine: a 500 naming only the request;
    the exception itself goes to the log, never to the client."""
    return RequestError(f"internal error while running request {request_id}; see the server log", code=500)


class QueuedOutputs:
    """A request's outputs from its queue until it finishes (an exception put there is raised).

    The request is in the engine before the first output is asked for, so leaving early calls
    ``abort``: closing this before the last output, iterated or not, or a cancelled wait.
    Outputs are cumulative, so a backlog skips to the newest."""

    def __init__(self, queue: asyncio.Queue, abort: Callable[[], None]):
        self._queue = queue
        self._abort = abort
        self._finished = False

    def __aiter__(self) -> QueuedOutputs:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._finished:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:
            await self.aclose()
            raise
        while not self._queue.empty():
            item = self._queue.get_nowait()
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        self._finished = item.finished
        return item

    async def aclose(self) -> None:
        if not self._finished:
            self._finished = True
            self._abort()


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
    lora_request: Optional[LoRARequest] = None
    group: Optional[str] = None  # the client request it belongs to, for fair admission
    multimodal_data: Optional[dict[str, Any]] = None
    multimodal: Any = None  # MultimodalInputs, when the media were processed before queueing
    grammar: Any = None  # the compiled grammar of a guided request, once compiled off the engine thread
    output_kind: OutputKind = OutputKind.CUMULATIVE  # DELTA for the engine-core process's streams
    tool_call_parser: Optional[str] = None  # the tool_parsers entry that splits its tool calls


@dataclass
class _Call:
    """Run ``fn(engine)`` on the engine thread (adapter loads): nothing else touches the engine."""

    fn: Callable[[LLMEngine], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future

    def settle(self, result: Any = None, error: Optional[BaseException] = None) -> None:
        def settle_now() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(settle_now)


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

    A step that raises fails the requests it may have touched (a 500 each) and the loop
    goes on; only when cleaning up after it fails too does the loop stop, and then every
    ``on_dead`` callback runs once, so a server can exit and be restarted by its supervisor
    instead of answering 503 forever.
    """

    def __init__(self, config: EngineConfig, request_window: Optional[int] = None,
                 on_iteration: Optional[Callable[[], None]] = None):
        """``request_window``: sequences one client request (a ``group``) may have in the engine
        at once (default: a sixteenth of ``max_num_seqs``, at least 4): a request arriving behind
        a big one shares the batch with only that many of its sequences, so its steps stay short;
        see ``fastllm.engine.fair_admission``. ``on_iteration``: called on the engine thread after
        every loop iteration (the engine-core process sends the iteration's outputs from there)."""
        if config.data_parallel_size > 1:
            raise ValueError("data_parallel_size > 1 runs offline (LLM, fastllm bench) only, not in the server yet")
        self.engine = LLMEngine(config)
        self.config = config
        self.tokenizer = self.engine.tokenizer
        self.inputs = self.engine.inputs  # thread-safe: the server validates and tokenizes on its workers
        self.max_model_len = self.engine.max_model_len
        self.stats = self.engine.stats()
        self.dead_error: Optional[BaseException] = None
        self._inbox: queue.SimpleQueue[_Add | _Compiled | _Abort | _Call | None] = queue.SimpleQueue()
        self._compiling: dict[str, _Add] = {}  # guided requests whose grammar is compiling; guarded by _lock
        self._compiler = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fastllm-grammar")
        self._streams: dict[str, _Stream] = {}
        self._stopping = False
        self._closed = False  # set by the engine thread as it exits; guarded by _lock with every hand-in
        self._lock = threading.Lock()
        self.on_dead: list[Callable[[], None]] = []
        self.admission = FairAdmission(request_window or max(4, config.max_num_seqs // 16))
        self._on_iteration = on_iteration or (lambda: None)
        self._thread = threading.Thread(target=self._run, name="fastllm-engine", daemon=True)
        self._thread.start()

    # ---- event-loop side ---------------------------------------------------------------------
    @property
    def num_pending(self) -> int:
        """Requests not yet scheduled: the last snapshot's waiting ones, the held, those in the
        inbox and those still compiling their grammar."""
        return (self.stats.num_requests_waiting + self.admission.num_held + self._inbox.qsize()
                + len(self._compiling))

    async def generate(self, request_id: str, prompt: Optional[str], prompt_token_ids: Optional[list[int]],
                       params: SamplingParams, chat_template_kwargs: Optional[dict[str, Any]] = None,
                       lora_request: Optional[LoRARequest] = None, group: Optional[str] = None,
                       multimodal_data: Optional[dict[str, Any]] = None,
                       tool_call_parser: Optional[str] = None) -> AsyncIterator[RequestOutput]:
        """Yield the request's latest output until it finishes; raises RequestError for bad input.
        Requests of one ``group`` are admitted a window at a time (``fastllm.engine.fair_admission``)."""
        multimodal = None
        if multimodal_data and prompt_token_ids is not None:  # media work stays off the engine's thread
            prompt_token_ids, multimodal = await asyncio.to_thread(self.engine.process_media, prompt_token_ids,
                                                                   multimodal_data)
            multimodal_data = None
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self.submit(_Add(request_id, prompt, prompt_token_ids, params, time.time(), chat_template_kwargs, stream,
                         lora_request, group, multimodal_data, multimodal, tool_call_parser=tool_call_parser))
        async with aclosing(QueuedOutputs(stream.queue, lambda: self.abort(request_id))) as outputs:
            async for output in outputs:
                yield output

    def submit(self, item: _Add | _Call) -> None:
        """Hand a request (its outputs go to ``item.stream``) or a call to the engine thread."""
        with self._lock:
            if self._closed or self._stopping or self.dead_error is not None:
                raise EngineDeadError(str(self.dead_error or "the engine is shutting down"))
            self._inbox.put(item)

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    async def add_adapter(self, lora_request: LoRARequest) -> None:
        await self.call(lambda engine: engine.add_adapter(lora_request))

    async def remove_adapter(self, adapter_id: int) -> bool:
        return await self.call(lambda engine: engine.remove_adapter(adapter_id))

    async def start_profile(self) -> None:
        await self.call(lambda engine: engine.start_profile())

    async def stop_profile(self) -> None:
        await self.call(lambda engine: engine.stop_profile())

    async def call(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """``fn(engine)`` run between two steps on the engine thread; its result or its exception."""
        loop = asyncio.get_running_loop()
        item = _Call(fn, loop, loop.create_future())
        self.submit(item)
        return await item.future

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
                    try:
                        self._step()
                    except Exception:
                        logger.exception("engine step failed; failing the requests it touched")
                        self._fail_touched()
                self._on_iteration()
        except Exception:  # the recovery itself failed: the engine's state is unknown
            logger.exception("engine loop failed; failing every in-flight request")
            self.dead_error = EngineDeadError("the engine stopped after an internal error; see the server log")
        with self._lock:  # from here on nothing new gets in, so what is queued now is all that is left
            self._closed = True
        error = self.dead_error or EngineDeadError("the engine shut down")
        for held in self.admission.held():
            held.stream.put(error)
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if isinstance(item, _Add):
                item.stream.put(error)
            elif isinstance(item, _Call):
                item.settle(error=error)
        with self._lock:
            compiling, self._compiling = list(self._compiling.values()), {}
        for item in compiling:
            item.stream.put(error)
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()
        self._compiler.shutdown(wait=False, cancel_futures=True)
        if self.dead_error is not None:
            for callback in self.on_dead:
                callback()

    def _drain_inbox(self, block: bool) -> None:
        item = self._inbox.get() if block else self._next_nowait()
        while item is not None or not self._inbox.empty():
            if isinstance(item, _Add):
                self._add(item)
            elif isinstance(item, _Compiled):
                self._add_compiled(item)
            elif isinstance(item, _Abort):
                self._abort(item)
            elif isinstance(item, _Call):
                self._call(item)
            item = self._next_nowait()

    def _call(self, item: _Call) -> None:
        try:
            item.settle(item.fn(self.engine))
        except Exception as exc:  # the caller's error (a bad adapter); the engine is unchanged
            item.settle(error=exc)

    def _next_nowait(self) -> _Add | _Abort | _Call | None:
        try:
            return self._inbox.get_nowait()
        except queue.Empty:
            return None

    def _add(self, item: _Add) -> None:
        """A guided request compiles its grammar first (``_compile``); then fair admission."""
        if (item.params.guided_decoding is not None and item.grammar is None
                and self.engine.structured_output is not None):
            self._compile(item)
            return
        if self.admission.offer(item):
            self._enter_all([item])

    def _leave(self, request_id: str) -> None:
        """A request left the engine: let in the held requests its room admits."""
        self._enter_all(self.admission.leave(request_id))

    def _enter_all(self, items: list[_Add]) -> None:
        """Add admitted requests to the engine; one refused there frees its room for the next."""
        pending = deque(items)
        while pending:
            item = pending.popleft()
            try:
                self.engine.add_request(item.request_id, item.prompt, item.prompt_token_ids, item.params,
                                        item.arrival_time, item.chat_template_kwargs,
                                        lora_request=item.lora_request, multimodal_data=item.multimodal_data,
                                        multimodal=item.multimodal, grammar=item.grammar,
                                        output_kind=item.output_kind, tool_call_parser=item.tool_call_parser)
            except Exception as exc:  # a bad request or a bug: this request fails alone, a bug's details logged
                if not isinstance(exc, RequestError):
                    logger.exception("adding request %s failed", item.request_id)
                item.stream.put(exc if isinstance(exc, RequestError) else internal_error(item.request_id))
                pending.extend(self.admission.leave(item.request_id))
                continue
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
            error = result.error
            result.add.stream.put(error if isinstance(error, RequestError) else internal_error(result.add.request_id))
            return
        result.add.grammar = result.grammar
        self._add(result.add)

    def _abort(self, item: _Abort) -> None:
        held = self.admission.withdraw(item.request_id)
        if held is not None:
            if item.notify:
                held.stream.put(EngineDeadError("the engine shut down"))
            return
        with self._lock:
            self._compiling.pop(item.request_id, None)
        output = self.engine.abort_request(item.request_id)
        self._leave(item.request_id)
        stream = self._streams.pop(item.request_id, None)
        if output is not None:
            logger.info("Aborted request %s", item.request_id)
            if item.notify and stream is not None:
                stream.put(output)

    def _step(self) -> None:
        """One engine step; the stats snapshot is updated before any client hears of the step's outputs,
        so a client that reacts to an output (or a server admitting the next request) never reads older stats."""
        outputs = self.engine.step()
        for output in outputs:
            if output.finished:
                self._leave(output.request_id)
        self._publish_stats()
        for output in outputs:
            stream = self._streams.pop(output.request_id, None) if output.finished else self._streams.get(
                output.request_id)
            if stream is not None:
                stream.put(output)

    def _fail_touched(self) -> None:
        """After a step raised: drop the step in flight and fail every request with a sequence past
        admission (running, computed or with a token in flight); requests still waiting untouched
        keep their place, unless none was touched (then the fault lies with those)."""
        self.engine.in_flight = None
        running = set(map(id, self.engine.scheduler.running))
        touched = [request_id for request_id, state in self.engine.requests.items()
                   if any(s.seq.num_computed_tokens or s.seq.num_pending_tokens or s.seq.output_token_ids
                          or id(s.seq) in running for s in state.samples)]
        for request_id in touched or list(self.engine.requests):
            self.engine.abort_request(request_id)
            self._leave(request_id)
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.put(internal_error(request_id))
        self._publish_stats()

    def _publish_stats(self) -> None:
        self.stats = self.engine.stats()
