"""Plumbing between engine output streams and HTTP: start, merge, cancel on disconnect, SSE framing.

Every helper closes the engine streams it was given when it stops early, because
closing a stream is what aborts its request and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Protocol, TypeVar

from pydantic import BaseModel
from starlette.requests import Request

from fastllm.entrypoints.openai.errors import OpenAIError
from fastllm.outputs import RequestOutput

T = TypeVar("T")


class OutputStream(Protocol):
    """One request's outputs; closing it before the last one aborts the request."""

    def __aiter__(self) -> OutputStream: ...

    async def __anext__(self) -> RequestOutput: ...

    async def aclose(self) -> None: ...


async def start_all(streams: list[OutputStream]) -> list[RequestOutput]:
    """Wait for every stream's first output, so a rejected request fails before any byte is sent."""
    firsts = [asyncio.ensure_future(anext(stream)) for stream in streams]
    try:
        return list(await asyncio.gather(*firsts))
    except BaseException:
        for task in firsts:
            task.cancel()
        await asyncio.gather(*firsts, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
        raise


async def merge(firsts: list[RequestOutput], streams: list[OutputStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from every stream as they come, starting with the outputs ``start_all`` took."""
    if len(streams) == 1:  # the common request: read it directly, without a pump task and a queue hop per output
        try:
            yield 0, firsts[0]
            if not firsts[0].finished:
                async for output in streams[0]:
                    yield 0, output
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, first: RequestOutput, stream: OutputStream) -> None:
        try:
            await queue.put((index, first))
            if not first.finished:
                async for output in stream:
                    await queue.put((index, output))
        except Exception as exc:  # handed to the consumer, which decides what the client sees
            await queue.put((index, exc))
        await queue.put((index, None))

    pumps = [asyncio.ensure_future(pump(i, first, stream)) for i, (first, stream) in enumerate(zip(firsts, streams))]
    try:
        remaining = len(pumps)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


async def collect(streams: list[OutputStream]) -> list[RequestOutput]:
    """The final output of every stream, in prompt order."""
    firsts = await start_all(streams)
    finals = list(firsts)
    async for index, output in merge(firsts, streams):
        finals[index] = output
    return finals


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Run ``work`` unless the client goes away first; then cancel it (which aborts its requests).

    Raises a 499 (nginx's "client closed request") that nobody will read, so the
    request ends through the error handlers instead of as an unhandled cancellation.
    """
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise OpenAIError(499, "the client disconnected")
    return task.result()


def sse(chunk: BaseModel | str, exclude_none: bool = False) -> str:
    data = chunk if isinstance(chunk, str) else chunk.model_dump_json(exclude_none=exclude_none)
    return f"data: {data}\n\n"


SSE_DONE = "data: [DONE]\n\n"
