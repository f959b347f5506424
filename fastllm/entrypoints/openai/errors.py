"""OpenAI-style error bodies (``{"error": {message, type, param, code}}``) and the handlers that send them.

Every failure leaves the server through here, with the status OpenAI uses: request
validation is a 400 (FastAPI's default would be 422), an unknown route a 404, and
an unexpected exception a 500 that does not leak a traceback.
"""

from __future__ import annotations

import logging
import uuid
from typing import Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fastllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

logger = logging.getLogger("fastllm")

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
               429: "rate_limit_error", 500: "internal_server_error", 503: "service_unavailable"}


class OpenAIError(Exception):
    """Raise anywhere in a handler to answer with this status and message."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 code: Optional[Union[int, str]] = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code if code is not None else status


def error_body(status: int, message: str, param: Optional[str] = None,
               code: Optional[Union[int, str]] = None) -> dict:
    info = ErrorInfo(message=message, type=ERROR_TYPES.get(status, "invalid_request_error"), param=param,
                     code=code if code is not None else status)
    return ErrorResponse(error=info).model_dump()


def error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error_body(error.status, error.message, error.param, error.code), status_code=error.status)


def _validation_message(exc: RequestValidationError) -> tuple[str, Optional[str]]:
    """The first problem, phrased for a person, and the field it concerns."""
    first = exc.errors()[0] if exc.errors() else {}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    message = first.get("msg", "invalid request")
    return (f"{param}: {message}" if param else message), param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return JSONResponse(error_body(400, message, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        error_id = uuid.uuid4().hex
        logger.exception("internal error %s on %s", error_id, request.url.path)
        return JSONResponse(error_body(500, f"internal server error {error_id}; see the server log"),
                            status_code=500)
