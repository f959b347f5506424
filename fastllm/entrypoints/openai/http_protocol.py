"""uvicorn's HTTP protocol (httptools where installed, else h11) plus a deadline for a request's headers.

uvicorn closes an idle kept-alive connection only after a response, and any byte a client
sends cancels that timer: a connection that never sends a request, or sends its headers a
byte at a time, stays open forever. Here each connection must finish the headers of its
next request within ``header_timeout`` seconds of opening, or of its last response.
(Body reads have their own deadline in ``RequestGuard``.)
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

try:  # httptools parses in C: with a few hundred streams h11's Python parsing is the front end's main cost
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as HTTPProtocol
except ImportError:
    from uvicorn.protocols.http.h11_impl import H11Protocol as HTTPProtocol


def header_timeout_protocol(header_timeout: float) -> type[HTTPProtocol]:
    class HeaderTimeoutProtocol(HTTPProtocol):
        _header_deadline: Optional[asyncio.TimerHandle] = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Optional[Exception]) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            self._header_deadline = self.loop.call_later(header_timeout, self._expire, self.cycle)

        def _expire(self, cycle_when_armed: Any) -> None:
            """No request began since the deadline was set (``cycle`` unchanged): close."""
            if self.cycle is cycle_when_armed and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
