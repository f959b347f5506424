"""The engine core's process: an ``AsyncLLM`` engine loop fed over a pipe by the front end.

The HTTP front end (event loop, chat templates, tokenizing, SSE) and the engine loop no longer
share a GIL: this process does nothing but step the engine, and after every loop iteration
sends what the iteration produced, as per-request deltas (``fastllm.engine.output_deltas``), in
one message together with the engine's stats. Messages are tuples, the first item their kind.

front -> core: ``("add", fields...)``, ``("abort", request_id)``, ``("call", call_id, method,
args)`` (adapter loads only), ``("shutdown", timeout)``.
core -> front: ``("ready", max_model_len)`` or ``("failed", kind, message)`` once at start;
``("out", deltas, stats, num_pending, num_added)``; ``("result", call_id, value, error)``;
``("dead", message)`` when the engine loop died; ``("bye",)`` after a shutdown.
"""

from __future__ import annotations

import logging
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any, Optional

from fastllm.config import EngineConfig
from fastllm.engine.async_llm import AsyncLLM, EngineDeadError, _Add, _Call, internal_error
from fastllm.engine.input_processor import RequestError
from fastllm.engine.output_deltas import encode_error
from fastllm.engine.output_processor import OutputKind, RequestDelta

logger = logging.getLogger("fastllm")

# what the front end may call on the engine, by name: adapter management
ENGINE_CALLS = frozenset({"add_adapter", "remove_adapter", "start_profile", "stop_profile"})


class Outbox:
    """The iteration's deltas, sent as one message by a thread of their own, so the engine never
    waits on the pipe: a front end that reads slowly gets several iterations in one message."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.llm: Optional[AsyncLLM] = None
        self._deltas: list[tuple] = []
        self._messages: list[tuple] = []  # other messages (results, dead, bye), after the deltas before them
        self._state: tuple = ()  # (stats, pending requests, requests added) as of the last flush
        self._sent: tuple = ()
        self._ready = threading.Condition()
        self.num_added = 0
        threading.Thread(target=self._send_loop, name="fastllm-core-sender", daemon=True).start()

    def put(self, request_id: str, delta: tuple) -> None:
        with self._ready:
            self._deltas.append((request_id, delta))

    def flush(self) -> None:
        """Hand the deltas gathered since the last flush, with the current stats, to the sender."""
        llm = self.llm
        if llm is None:
            return
        with self._ready:
            self._state = (llm.stats, llm.num_pending, self.num_added)
            self._ready.notify()

    def send(self, message: tuple) -> None:
        """Send ``message`` after every delta put before it."""
        with self._ready:
            self._messages.append(message)
            self._ready.notify()

    def _next(self) -> tuple[Optional[tuple], list[tuple]]:
        """Under the lock: the ``out`` message due (new deltas or changed stats), and the others."""
        out = None
        if self._state and (self._deltas or self._state != self._sent):
            out = ("out", self._deltas, *self._state)
            self._deltas, self._sent = [], self._state
        messages, self._messages = self._messages, []
        return out, messages

    def _send_loop(self) -> None:
        while True:
            with self._ready:
                out, messages = self._next()
                while out is None and not messages:
                    self._ready.wait()
                    out, messages = self._next()
            try:
                for message in ([out] if out else []) + messages:
                    self.conn.send(message)
            except OSError:  # the front end is gone; the main thread sees it too and stops the engine
                return


class RemoteStream:
    """One request's deltas (its ``OutputKind`` is ``DELTA``), into the outbox (called on the engine thread)."""

    def __init__(self, request_id: str, outbox: Outbox):
        self.request_id = request_id
        self.outbox = outbox

    def put(self, item: RequestDelta | BaseException) -> None:
        if isinstance(item, BaseException):
            self.outbox.put(self.request_id, ("error", encode_error(item)))
        else:
            self.outbox.put(self.request_id, ("output", item.payload))


class RemoteCall(_Call):
    """An engine method the front end called; the result goes back as a ``result`` message."""

    def __init__(self, call_id: int, method: str, args: tuple, outbox: Outbox):
        super().__init__(lambda engine: getattr(engine, method)(*args), None, None)
        self.call_id = call_id
        self.outbox = outbox

    def settle(self, result: Any = None, error: Optional[BaseException] = None) -> None:
        self.outbox.send(("result", self.call_id, result, None if error is None else encode_error(error)))


def run_engine_core(config: EngineConfig, request_window: Optional[int], conn: Connection, log_level: int) -> None:
    """The process's main: build the engine, then hand the front end's messages to its loop until
    the front end says shutdown or goes away."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # the front end decides when the engine stops
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    outbox = Outbox(conn)
    try:
        llm = AsyncLLM(config, request_window, on_iteration=outbox.flush)
    except Exception as exc:
        logger.exception("the engine core failed to start")
        conn.send(("failed", "value" if isinstance(exc, ValueError) else "runtime", str(exc)))
        return
    outbox.llm = llm
    llm.on_dead.append(lambda: (outbox.flush(), outbox.send(("dead", str(llm.dead_error)))))
    conn.send(("ready", llm.max_model_len))
    stopper: Optional[threading.Thread] = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the front end is gone: nobody is left to serve
            llm.shutdown(timeout=0)
            return
        kind = message[0]
        if kind == "add":
            _add(llm, outbox, message[1:])
        elif kind == "abort":
            llm.abort(message[1])
        elif kind == "call":
            _, call_id, method, args = message
            _call(llm, outbox, call_id, method, args)
        elif kind == "shutdown" and stopper is None:
            stopper = threading.Thread(target=_shutdown, args=(llm, outbox, message[1]), name="fastllm-drain")
            stopper.start()


def _add(llm: AsyncLLM, outbox: Outbox, fields: tuple) -> None:
    (request_id, prompt, prompt_token_ids, params, arrival_time, chat_template_kwargs, lora_request, group,
     multimodal_data, tool_call_parser) = fields
    stream = RemoteStream(request_id, outbox)
    multimodal = None
    outbox.num_added += 1
    try:
        if multimodal_data and prompt_token_ids is not None:  # off the engine thread, as in AsyncLLM.generate
            prompt_token_ids, multimodal = llm.engine.process_media(prompt_token_ids, multimodal_data)
            multimodal_data = None
        llm.submit(_Add(request_id, prompt, prompt_token_ids, params, arrival_time, chat_template_kwargs, stream,
                        lora_request, group, multimodal_data, multimodal, output_kind=OutputKind.DELTA,
                        tool_call_parser=tool_call_parser))
    except Exception as exc:  # bad media or an engine that stopped: this request fails alone
        if not isinstance(exc, (EngineDeadError, RequestError)):
            logger.exception("adding request %s failed", request_id)
            exc = internal_error(request_id)
        stream.put(exc)
        outbox.flush()


def _call(llm: AsyncLLM, outbox: Outbox, call_id: int, method: str, args: tuple) -> None:
    call = RemoteCall(call_id, method, args, outbox)
    if method not in ENGINE_CALLS:
        call.settle(error=ValueError(f"no engine call {method!r}"))
        return
    try:
        llm.submit(call)
    except EngineDeadError as exc:
        call.settle(error=exc)


def _shutdown(llm: AsyncLLM, outbox: Outbox, timeout: float) -> None:
    llm.shutdown(timeout)
    outbox.flush()
    outbox.send(("bye",))

