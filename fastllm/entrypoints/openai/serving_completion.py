"""POST /v1/completions: one engine request per prompt, answered whole or as server-sent events.

Choices are numbered ``prompt_index * n + sample_index`` as OpenAI does. With
``best_of > n`` the engine samples ``best_of`` sequences and the ``n`` with the
highest cumulative logprob are returned (not streamable, as in OpenAI's API).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fastllm.entrypoints.openai.errors import OpenAIError, error_body
from fastllm.entrypoints.openai.logprobs import completion_logprobs, finite
from fastllm.entrypoints.openai.protocol import UsageInfo
from fastllm.entrypoints.openai.protocol_completion import CompletionChoice, CompletionRequest, CompletionResponse
from fastllm.entrypoints.openai.serving_context import ServingContext
from fastllm.entrypoints.openai.streaming import (SSE_DONE, OutputStream, cancel_on_disconnect, collect, merge,
                                                  sse, start_all)
from fastllm.outputs import CompletionOutput, Logprobs, RequestOutput


@dataclass
class ChoiceView:
    """A choice's whole text, tokens and logprobs as the client sees them (prompt first under echo)."""

    text: str
    token_ids: list[int]
    logprobs: list[Optional[Logprobs]]


@dataclass
class Sent:
    """How much of a choice's view a stream has already sent."""

    chars: int = 0
    tokens: int = 0
    done: bool = False


class CompletionServing:
    def __init__(self, ctx: ServingContext):
        self.ctx = ctx

    async def create(self, request: CompletionRequest, raw: Request) -> Response:
        return await self.ctx.counted(self._create(request, raw))

    async def _create(self, request: CompletionRequest, raw: Request) -> Response:
        ctx = self.ctx
        model = ctx.model_name(request.model)
        ctx.admit()
        if request.suffix:
            raise OpenAIError(400, "suffix is not supported", "suffix")
        num_samples = request.best_of or request.n  # best_of >= n is validated
        if request.stream and num_samples > request.n:
            raise OpenAIError(400, "best_of > n cannot be streamed", "best_of")
        echo_logprobs = request.logprobs if request.echo else None
        params = ctx.sampling_params(lambda: request.sampling_params(
            request.max_tokens, request.logprobs, echo_logprobs, n=num_samples))
        request_id = f"cmpl-{uuid.uuid4().hex}"
        prompts = request.prompts()
        limits = ctx.config
        if len(prompts) > limits.max_prompts_per_request:
            raise OpenAIError(400, f"{len(prompts)} prompts exceed the limit of {limits.max_prompts_per_request} "
                                   "per request", "prompt")
        if len(prompts) * num_samples > limits.max_sequences_per_request:
            raise OpenAIError(400, f"{len(prompts)} prompts x {num_samples} samples exceed the limit of "
                                   f"{limits.max_sequences_per_request} sequences per request", "n")
        token_lists = await ctx.admitted_prompts(prompts, params)
        streams: list[OutputStream] = []
        try:
            for index, (prompt, token_ids) in enumerate(zip(prompts, token_lists)):
                ctx.log_request(f"{request_id}-{index}", token_ids, params)
                text = prompt if isinstance(prompt, str) else None
                streams.append(ctx.stream(f"{request_id}-{index}", text, token_ids, params,
                                          lora_request=ctx.lora_request(model), group=request_id))
        except BaseException:  # the prompts already sent leave the engine with this request
            for stream in streams:
                await stream.aclose()
            raise
        if request.stream:
            firsts = await cancel_on_disconnect(raw, start_all(streams))
            return StreamingResponse(self._events(request_id, model, request, firsts, streams),
                                     media_type="text/event-stream")
        finals = await cancel_on_disconnect(raw, collect(streams))
        ctx.metrics.on_processed(True)
        return JSONResponse(self._response(request_id, model, request, finals).model_dump())

    def _view(self, request: CompletionRequest, output: RequestOutput, completion: CompletionOutput) -> ChoiceView:
        logprobs: list[Optional[Logprobs]] = list(completion.logprobs or [])
        if not request.echo:
            return ChoiceView(completion.text, completion.token_ids, logprobs)
        prompt = output.prompt if output.prompt is not None else self.ctx.tokenizer.decode(output.prompt_token_ids)
        prompt_logprobs = list(output.prompt_logprobs or [None] * len(output.prompt_token_ids))
        return ChoiceView(prompt + completion.text, output.prompt_token_ids + completion.token_ids,
                          prompt_logprobs + logprobs)

    def _choice(self, request: CompletionRequest, index: int, view: ChoiceView, sent: Sent,
                completion: CompletionOutput) -> CompletionChoice:
        """The part of ``view`` not sent yet, as one choice."""
        logprobs = None
        if request.logprobs is not None:
            logprobs = completion_logprobs(self.ctx.tokenizer, view.token_ids[sent.tokens:],
                                           view.logprobs[sent.tokens:], sent.chars)
        return CompletionChoice(index=index, text=view.text[sent.chars:], logprobs=logprobs,
                                finish_reason=completion.finish_reason, stop_reason=completion.stop_reason,
                                sentence_length=len(view.text), cum_log_probs=finite(completion.cumulative_logprob))

    def _response(self, request_id: str, model: str, request: CompletionRequest,
                  finals: list[RequestOutput]) -> CompletionResponse:
        choices = []
        for prompt_index, output in enumerate(finals):
            kept = output.completions
            if len(kept) > request.n:  # best_of: the n most likely samples
                kept = sorted(kept, key=lambda c: c.cumulative_logprob, reverse=True)[:request.n]
            for sample_index, completion in enumerate(kept):
                view = self._view(request, output, completion)
                choices.append(self._choice(request, prompt_index * request.n + sample_index, view, Sent(),
                                            completion))
        return CompletionResponse(id=request_id, model=model, system_fingerprint=self.ctx.system_fingerprint,
                                  choices=choices, usage=UsageInfo.of(finals))

    async def _events(self, request_id: str, model: str, request: CompletionRequest,
                      firsts: list[RequestOutput], streams: list[OutputStream]) -> AsyncIterator[str]:
        sent: dict[int, Sent] = {}
        finals = list(firsts)
        ok = False
        try:
            async for prompt_index, output in merge(firsts, streams):
                finals[prompt_index] = output
                for completion in output.completions:
                    index = prompt_index * request.n + completion.index
                    progress = sent.setdefault(index, Sent())
                    view = self._view(request, output, completion)
                    fresh_text = len(view.text) > progress.chars
                    fresh_logprobs = request.logprobs is not None and len(view.token_ids) > progress.tokens
                    if progress.done or not (fresh_text or fresh_logprobs or completion.finish_reason):
                        continue
                    choice = self._choice(request, index, view, progress, completion)
                    progress.chars, progress.tokens = len(view.text), len(view.token_ids)
                    progress.done = completion.finish_reason is not None
                    yield sse(CompletionResponse(id=request_id, model=model, choices=[choice],
                                                 system_fingerprint=self.ctx.system_fingerprint))
            if request.stream_options is not None and request.stream_options.include_usage:
                yield sse(CompletionResponse(id=request_id, model=model, choices=[], usage=UsageInfo.of(finals),
                                             system_fingerprint=self.ctx.system_fingerprint))
            ok = True
        except OpenAIError as exc:
            yield sse(json.dumps(error_body(exc.status, exc.message, exc.param, exc.code)))
        finally:
            self.ctx.metrics.on_processed(ok)
        yield SSE_DONE
