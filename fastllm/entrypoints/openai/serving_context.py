"""What the generation endpoints share: model names, admission, engine streams, metrics and request logs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Optional

from fastapi.responses import Response
from pydantic import ValidationError

import fastllm
from fastllm.engine.async_llm import AsyncLLM, EngineDeadError
from fastllm.engine.input_processor import RequestError
from fastllm.entrypoints.openai.errors import OpenAIError
from fastllm.entrypoints.openai.server_config import ServerConfig
from fastllm.entrypoints.openai.streaming import OutputStream
from fastllm.metrics import ServingMetrics
from fastllm.sampling_params import SamplingParams

logger = logging.getLogger("fastllm")
LOGGED_PROMPT_CHARS = 200


class ServingContext:
    """One per server; ``draining`` turns new requests away once shutdown has begun."""

    def __init__(self, engine: AsyncLLM, config: ServerConfig, metrics: ServingMetrics):
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.tokenizer = engine.tokenizer
        self.draining = False
        self.system_fingerprint = f"fastllm-{fastllm.__version__}"

    async def counted(self, handling: Awaitable[Response]) -> Response:
        """Count one HTTP request as received, and as failed if handling it raises (any error, 4xx or 5xx).

        A streamed response counts its own success or failure when its stream ends.
        """
        self.metrics.on_received()
        try:
            return await handling
        except BaseException:
            self.metrics.on_processed(False)
            raise

    def model_name(self, requested: Optional[str]) -> str:
        """The name to answer with; a name this server does not serve is a 404."""
        if requested is None or requested == "":
            return self.config.served_model_names[0]
        if requested not in self.config.served_model_names:
            raise OpenAIError(404, f"the model `{requested}` does not exist; this server serves "
                                   f"{', '.join(self.config.served_model_names)}", "model", "model_not_found")
        return requested

    def admit(self) -> None:
        """Refuse work the server cannot take now: shutting down, engine dead, or queue full."""
        if self.engine.dead_error is not None:
            raise OpenAIError(500, str(self.engine.dead_error))
        if self.draining:
            raise OpenAIError(503, "the server is shutting down")
        limit = self.config.max_waiting_requests
        if limit is not None and self.engine.num_pending >= limit:
            raise OpenAIError(429, f"too many requests are waiting ({self.engine.num_pending}, limit {limit}); "
                                   "retry later")

    @staticmethod
    def sampling_params(build: Callable[[], SamplingParams]) -> SamplingParams:
        """Values the request model let through but SamplingParams refuses are still the client's 400."""
        try:
            return build()
        except (ValidationError, ValueError) as exc:
            raise OpenAIError(400, str(exc)) from exc

    def log_request(self, request_id: str, prompt: Any, params: SamplingParams) -> None:
        if not self.config.disable_log_requests:
            logger.info("Received request %s: prompt: %r, params: %s", request_id,
                        str(prompt)[:LOGGED_PROMPT_CHARS], params.model_dump(exclude_defaults=True))

    async def stream(self, request_id: str, prompt: Optional[str], prompt_token_ids: Optional[list[int]],
                     params: SamplingParams, chat_template_kwargs: Optional[dict[str, Any]] = None,
                     multimodal_data: Optional[dict[str, Any]] = None) -> OutputStream:
        """The engine's outputs for one request, engine errors as OpenAIErrors, metrics on finish.

        Closing or cancelling this stream before the request finished (a client that left,
        a shutdown that ran out of time) aborts the request; that is counted as an abort.
        """
        finished = False
        try:
            async for output in self.engine.generate(request_id, prompt, prompt_token_ids, params,
                                                     chat_template_kwargs, multimodal_data):
                if output.finished:
                    finished = True
                    self.metrics.on_engine_request_finished(output)
                yield output
        except RequestError as exc:
            raise OpenAIError(exc.code, str(exc)) from exc
        except EngineDeadError as exc:
            raise OpenAIError(500 if self.engine.dead_error else 503, str(exc)) from exc
        except (GeneratorExit, asyncio.CancelledError):
            if not finished:
                self.metrics.on_engine_request_aborted()
            raise
