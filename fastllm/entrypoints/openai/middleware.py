"""API-key and body-size checks as a plain ASGI middleware, so they run before any body is read.

A request without a valid key costs the server one header lookup: no JSON parsing,
no tokenization, no engine work. The OpenAI routes (``/v1/...``) and the profiler's switches need
a key; ``/health``, ``/version`` and ``/metrics`` stay open for probes and scrapers.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Optional

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fastllm.entrypoints.openai.errors import error_body

PROTECTED_PREFIXES = ("/v1", "/start_profile", "/stop_profile")


class RequestGuard:
    def __init__(self, app: ASGIApp, api_keys: list[str], max_body_bytes: int, body_timeout: float = 30.0):
        self.app = app
        self.api_keys = [key.encode() for key in api_keys]
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.api_keys and scope["path"].startswith(PROTECTED_PREFIXES) and not self._authorized(headers):
            await _reply(send, 401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                         "invalid_api_key")
            return
        length = _content_length(headers)
        if length is not None and length > self.max_body_bytes:
            await _reply(send, 413, f"request body of {length} bytes exceeds the limit of "
                                    f"{self.max_body_bytes} bytes", "request_too_large")
            return
        await self.app(scope, self._counting(receive), send)

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer":
            token = headers.get(b"x-api-key", b"")
        return any(hmac.compare_digest(token.strip(), key) for key in self.api_keys)

    def _counting(self, receive: Receive) -> Receive:
        """A body sent without Content-Length (chunked) is counted as it arrives; each part of it
        must arrive within ``body_timeout`` seconds (a slow body holds no connection forever)."""
        received = 0
        complete = False

        async def receive_with_limit() -> Message:
            nonlocal received, complete
            if complete:  # after the body only a disconnect can come, whenever it comes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.body_timeout)
            except asyncio.TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within {self.body_timeout} s") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > self.max_body_bytes:
                    raise HTTPException(413, f"request body exceeds the limit of {self.max_body_bytes} bytes")
            return message

        return receive_with_limit


def _content_length(headers: dict[bytes, bytes]) -> Optional[int]:
    raw = headers.get(b"content-length")
    return int(raw) if raw is not None and raw.isdigit() else None


async def _reply(send: Send, status: int, message: str, code: str) -> None:
    body = json.dumps(error_body(status, message, code=code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
