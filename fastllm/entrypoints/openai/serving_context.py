"""What the generation endpoints share: model names, admission, engine streams, metrics and request logs."""

from __future__ import annotations

import asyncio
import itertools
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, TypeVar, Union

from fastapi.responses import Response
from pydantic import ValidationError

import fastllm
from fastllm.adapters import LoRARequest
from fastllm.engine.async_llm import AsyncLLM, EngineDeadError
from fastllm.engine.input_processor import RequestError
from fastllm.entrypoints.openai.errors import OpenAIError
from fastllm.entrypoints.openai.server_config import ServerConfig
from fastllm.entrypoints.openai.streaming import OutputStream
from fastllm.metrics import ServingMetrics
from fastllm.outputs import RequestOutput
from fastllm.sampling_params import SamplingParams

logger = logging.getLogger("fastllm")
T = TypeVar("T")
# threads that render and tokenize prompts, so neither the event loop nor the engine thread waits on them
FRONTEND_WORKERS = 4


class ServingContext:
    """One per server; ``draining`` turns new requests away once shutdown has begun."""

    def __init__(self, engine: AsyncLLM, config: ServerConfig, metrics: ServingMetrics):
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.tokenizer = engine.tokenizer
        self.draining = False
        self.system_fingerprint = f"fastllm-{fastllm.__version__}"
        # adapters clients address by name in ``model``; ids count up, never reused
        self.adapters = {name: LoRARequest(name, i + 1, path)
                         for i, (name, path) in enumerate(config.lora_modules.items())}
        self._adapter_ids = itertools.count(len(self.adapters) + 1)
        self.workers = ThreadPoolExecutor(FRONTEND_WORKERS, thread_name_prefix="fastllm-frontend")

    async def off_loop(self, work: Callable[[], T]) -> T:
        """``work()`` on a front-end worker thread; a RequestError it raises is the client's 400."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.workers, work)
        except RequestError as exc:
            raise OpenAIError(exc.code, str(exc)) from exc

    def prompt_token_ids(self, prompts: list[Union[str, list[int]]], params: SamplingParams,
                         add_special_tokens: bool = True) -> list[list[int]]:
        """Every prompt tokenized and admitted (vocabulary, lengths, ``max_tokens`` within
        ``max_model_len``); run it through ``off_loop``."""
        inputs, admitted = self.engine.inputs, []
        for prompt in prompts:
            token_ids = inputs.tokenize(prompt, add_special_tokens) if isinstance(prompt, str) else prompt
            inputs.validate(token_ids, params)
            if params.max_tokens is not None:
                inputs.check_max_tokens(len(token_ids), params.max_tokens)
            admitted.append(token_ids)
        return admitted

    async def admitted_prompts(self, prompts: list[Union[str, list[int]]], params: SamplingParams) -> list[list[int]]:
        """``prompt_token_ids``: on a worker when there is text to tokenize; token ids only are checked
        here on the loop (a scan no longer than parsing the body was), so with the engine's eager
        ``generate`` the request reaches the engine in this handler's turn, not after every other
        handler's first step."""
        if any(isinstance(prompt, str) for prompt in prompts):
            return await self.off_loop(lambda: self.prompt_token_ids(prompts, params))
        try:
            return self.prompt_token_ids(prompts, params)
        except RequestError as exc:
            raise OpenAIError(exc.code, str(exc)) from exc

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
        if requested is None or requested == "" or requested == self.engine.config.model:
            return self.config.served_model_names[0]  # the model's path still works, though never listed
        if requested not in self.config.served_model_names and requested not in self.adapters:
            raise OpenAIError(404, f"the model `{requested}` does not exist; this server serves "
                                   f"{', '.join([*self.config.served_model_names, *self.adapters])}",
                              "model", "model_not_found")
        return requested

    def lora_request(self, model: str) -> Optional[LoRARequest]:
        """The adapter a request's (checked) model name picks, or None for the base model."""
        return self.adapters.get(model)

    async def load_adapter(self, name: str, path: str) -> str:
        """Check and load an adapter on the engine, then serve it under ``name``."""
        if name in self.adapters or name in self.config.served_model_names:
            raise OpenAIError(400, f"the model name `{name}` is already in use", "lora_name")
        request = LoRARequest(name, next(self._adapter_ids), path)
        await self._on_engine(self.engine.add_adapter(request))
        self.adapters[name] = request
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload_adapter(self, name: str) -> str:
        if name not in self.adapters:
            raise OpenAIError(404, f"no LoRA adapter is named `{name}`", "lora_name", "model_not_found")
        await self._on_engine(self.engine.remove_adapter(self.adapters[name].lora_int_id))
        del self.adapters[name]
        return f"Success: LoRA adapter '{name}' removed successfully."

    async def _on_engine(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except RequestError as exc:
            raise OpenAIError(exc.code, str(exc)) from exc
        except EngineDeadError as exc:
            raise OpenAIError(503, str(exc)) from exc

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

    def log_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Sizes and knobs only: prompt text, stop strings and grammars are the client's data."""
        if not self.config.disable_log_requests:
            logger.info("Received request %s: %d prompt tokens, params: %s", request_id, len(prompt_token_ids),
                        params.model_dump(exclude_defaults=True, exclude={"stop", "bad_words", "guided_decoding",
                                                                          "logit_bias"}))

    def stream(self, request_id: str, prompt: Optional[str], prompt_token_ids: Optional[list[int]],
               params: SamplingParams, chat_template_kwargs: Optional[dict[str, Any]] = None,
               lora_request: Optional[LoRARequest] = None, group: Optional[str] = None,
               multimodal_data: Optional[dict[str, Any]] = None,
               tool_call_parser: Optional[str] = None) -> OutputStream:
        """The engine's outputs for one request, engine errors as OpenAIErrors, metrics on finish.

        An engine whose ``generate`` sends the request at once (the core client) has it now, so the
        first request reaches the engine before later handlers run. Closing the stream before the
        request finished, iterated or not (a client that left, a shutdown that ran out of time),
        aborts the request; that is counted as an abort.
        """
        try:
            outputs = self.engine.generate(request_id, prompt, prompt_token_ids, params, chat_template_kwargs,
                                           lora_request, group, multimodal_data, tool_call_parser)
        except (RequestError, EngineDeadError) as exc:
            raise self._engine_error(exc) from exc
        return EngineStream(self, outputs, lora_request and lora_request.lora_name)

    def _engine_error(self, exc: RequestError | EngineDeadError) -> OpenAIError:
        if isinstance(exc, RequestError):
            return OpenAIError(exc.code, str(exc))
        return OpenAIError(500 if self.engine.dead_error else 503, str(exc))


class EngineStream:
    """``ServingContext.stream``'s outputs: the engine's, with errors translated and metrics counted."""

    def __init__(self, ctx: ServingContext, outputs: AsyncIterator[RequestOutput], adapter: Optional[str]):
        self._ctx = ctx
        self._outputs = outputs
        self._adapter = adapter
        self._finished = False

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._finished:
            raise StopAsyncIteration
        try:
            output = await anext(self._outputs)
        except (RequestError, EngineDeadError) as exc:
            self._finished = True
            raise self._ctx._engine_error(exc) from exc
        except asyncio.CancelledError:
            await self.aclose()
            raise
        if output.finished:
            self._finished = True
            self._ctx.metrics.on_engine_request_finished(output, self._adapter)
        return output

    async def aclose(self) -> None:
        if not self._finished:
            self._finished = True
            self._ctx.metrics.on_engine_request_aborted()
        await self._outputs.aclose()
