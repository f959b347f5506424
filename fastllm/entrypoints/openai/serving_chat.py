"""POST /v1/chat/completions: render the conversation with the chat template, generate, answer.

The template and the tool parser are chosen once at start-up (fastllm.chat's
resolution order), so a bad ``--chat-template`` or ``--tool-call-parser`` stops
the server before it listens; a request may still bring its own template text
(never a path: only the operator's ``--chat-template`` may name a file).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fastllm.chat import ResolvedTemplate, template_source, template_variables
from fastllm.chat.inputs import ChatInputs
from fastllm.chat.sandbox import TemplateRenderer
from fastllm.entrypoints.openai.chat_choice import ChoiceStream
from fastllm.entrypoints.openai.chat_tools import check_tool_choice, forced_guided_decoding
from fastllm.entrypoints.openai.errors import OpenAIError, error_body
from fastllm.entrypoints.openai.logprobs import chat_logprobs, finite
from fastllm.entrypoints.openai.protocol import UsageInfo
from fastllm.entrypoints.openai.protocol_chat import (ChatChoice, ChatCompletionRequest, ChatCompletionResponse,
                                                      ChatMessage)
from fastllm.entrypoints.openai.serving_context import ServingContext
from fastllm.entrypoints.openai.streaming import SSE_DONE, OutputStream, cancel_on_disconnect, collect, merge, sse, \
    start_all
from fastllm.engine.input_processor import RequestError
from fastllm.multimodal.chat import has_media, split_media
from fastllm.multimodal.media import fetch_allowed
from fastllm.outputs import CompletionOutput, RequestOutput
from fastllm.sampling_params import SamplingParams


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: text parts joined, tool-call arguments as objects."""
    rendered = []
    for message in messages:
        item = message.model_dump(exclude_none=True)
        if isinstance(message.content, list) and has_media([item]):
            pass  # image/video parts stay: split_media hands them to the template and the engine
        elif isinstance(message.content, list):
            if any(part.get("type") != "text" for part in message.content):
                raise OpenAIError(400, "only text content parts are supported", "messages")
            item["content"] = "\n".join(part.get("text", "") for part in message.content)
        for call in item.get("tool_calls", []):
            try:
                call["function"]["arguments"] = json.loads(call["function"].get("arguments") or "{}")
            except ValueError:
                pass  # not JSON: the template gets the text as the client sent it
        rendered.append(item)
    return rendered


class ChatServing:
    """``auto`` tool choice is on with --enable-auto-tool-choice, or when the template matched from
    MODEL_ID / CONV_TEMPLATE brings its own tool parser (what Angel-vLLM's automatic set-up does)."""

    def __init__(self, ctx: ServingContext):
        self.ctx = ctx
        config = ctx.engine.config
        self.chat = ChatInputs(ctx.tokenizer, config.model, config.chat_template, config.tool_call_parser)
        self.template, self.tool_parser = self.chat.template, self.chat.tool_parser
        if ctx.config.enable_auto_tool_choice and self.tool_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")
        self.auto_tools = self.tool_parser is not None and (
            ctx.config.enable_auto_tool_choice or self.template.tool_call_parser is not None)
        self.renderer = TemplateRenderer(max_chars=ctx.engine.inputs.max_text_chars)

    async def create(self, request: ChatCompletionRequest, raw: Request) -> Response:
        return await self.ctx.counted(self._create(request, raw))

    def _prompt(self, request: ChatCompletionRequest) -> tuple[str, ResolvedTemplate, dict[str, list[Any]]]:
        """Rendered in the template sandbox (``fastllm.chat.sandbox``), media parts set aside;
        blocks, so run it off the loop."""
        try:
            # a request's template is template text, never a file or a name: only the operator's may be
            template = ResolvedTemplate(request.chat_template, None) if request.chat_template else self.template
            tools = ([tool.model_dump(exclude_none=True) for tool in request.tools]
                     if request.tools and request.effective_tool_choice != "none" else None)
            tokenizer = self.ctx.tokenizer
            messages, media = split_media(template_messages(request.messages))
            prompt = self.renderer.render(template_source(tokenizer, template, tools), messages, tools,
                                          template_variables(tokenizer, request.chat_template_kwargs))
        except OpenAIError:
            raise
        except Exception as exc:  # a template error is the request's (or the template's): report, keep serving
            raise OpenAIError(400, f"cannot apply the chat template: {exc}", "messages") from exc
        return prompt, template, media

    def _check_size(self, request: ChatCompletionRequest) -> None:
        """Messages whose text alone is longer than any prompt that fits are refused before rendering."""
        chars = sum(len(m.content) if isinstance(m.content, str)
                    else sum(len(str(part.get("text", ""))) for part in m.content)
                    for m in request.messages if m.content)
        if chars > self.renderer.max_chars:
            raise OpenAIError(400, f"the messages hold {chars} characters, more than max_model_len="
                                   f"{self.ctx.engine.max_model_len} tokens can hold", "messages")

    def _params(self, request: ChatCompletionRequest, template: ResolvedTemplate, prompt_len: int) -> SamplingParams:
        max_tokens = (request.max_completion_tokens or request.max_tokens
                      or max(1, self.ctx.engine.max_model_len - prompt_len))
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        params = self.ctx.sampling_params(lambda: request.sampling_params(max_tokens, logprobs))
        params = self.chat.sampling_params(params, template, self._parses_tools(request))
        if (forced := forced_guided_decoding(request)) is not None:
            params = params.model_copy(update={"guided_decoding": forced})
        return params

    def _parses_tools(self, request: ChatCompletionRequest) -> bool:
        return bool(request.tools) and request.effective_tool_choice == "auto" and self.tool_parser is not None

    def _choice_stream(self, request: ChatCompletionRequest) -> ChoiceStream:
        return ChoiceStream(request.effective_tool_choice)

    async def _create(self, request: ChatCompletionRequest, raw: Request) -> Response:
        ctx = self.ctx
        model = ctx.model_name(request.model)
        ctx.admit()
        check_tool_choice(request, self.auto_tools)
        self._check_size(request)
        prompt, template, media = await ctx.off_loop(lambda: self._prompt(request))
        if media:
            try:
                media = await asyncio.to_thread(fetch_allowed, media, ctx.engine.config.allowed_media_domains)
            except RequestError as exc:
                raise OpenAIError(exc.code, str(exc), "messages") from exc
        prompt_token_ids = await ctx.off_loop(lambda: ctx.engine.inputs.tokenize(prompt, add_special_tokens=False))
        params = self._params(request, template, len(prompt_token_ids))
        await ctx.off_loop(lambda: ctx.prompt_token_ids([prompt_token_ids], params))
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        ctx.log_request(request_id, prompt_token_ids, params)
        streams = [ctx.stream(request_id, prompt, prompt_token_ids, params, request.chat_template_kwargs,
                              ctx.lora_request(model), multimodal_data=media,
                              tool_call_parser=self.chat.parser_name if self._parses_tools(request) else None)]
        if request.stream:
            firsts = await cancel_on_disconnect(raw, start_all(streams))
            return StreamingResponse(self._events(request_id, model, request, firsts, streams),
                                     media_type="text/event-stream")
        final = (await cancel_on_disconnect(raw, collect(streams)))[0]
        ctx.metrics.on_processed(True)
        choices = []
        for completion in final.completions:
            choice_stream = self._choice_stream(request)
            message = choice_stream.message(completion)
            choices.append(self._choice(request, completion, message, completion.logprobs or [],
                                        choice_stream.finish_reason(completion), as_message=True))
        response = ChatCompletionResponse(id=request_id, model=model, system_fingerprint=ctx.system_fingerprint,
                                          choices=choices, usage=UsageInfo.of([final]))
        return JSONResponse(response.model_dump(exclude_none=True))

    def _choice(self, request: ChatCompletionRequest, completion: CompletionOutput, content: ChatMessage,
                new_logprobs: list, finish_reason: Optional[str], as_message: bool) -> ChatChoice:
        """A response choice (``as_message``) or a stream-chunk choice carrying ``content`` as its delta."""
        start = len(completion.token_ids) - len(new_logprobs)
        logprobs = (chat_logprobs(self.ctx.tokenizer, completion.token_ids[start:], new_logprobs,
                                  request.top_logprobs or 0) if request.logprobs and new_logprobs else None)
        return ChatChoice(index=completion.index, message=content if as_message else None,
                          delta=None if as_message else content, logprobs=logprobs, finish_reason=finish_reason,
                          stop_reason=completion.stop_reason if finish_reason else None,
                          sentence_length=len(completion.text), cum_log_probs=finite(completion.cumulative_logprob))

    async def _events(self, request_id: str, model: str, request: ChatCompletionRequest,
                      firsts: list[RequestOutput], streams: list[OutputStream]) -> AsyncIterator[str]:
        def chunk(choices: list[ChatChoice], usage: Optional[UsageInfo] = None) -> str:
            return sse(ChatCompletionResponse(id=request_id, object="chat.completion.chunk", model=model,
                                              system_fingerprint=self.ctx.system_fingerprint, choices=choices,
                                              usage=usage), exclude_none=True)

        choice_streams = {c.index: self._choice_stream(request) for c in firsts[0].completions}
        sent_tokens = dict.fromkeys(choice_streams, 0)
        final, ok = firsts[0], False
        try:
            yield chunk([ChatChoice(index=i, delta=ChatMessage(role="assistant", content=""))
                         for i in choice_streams])
            async for _, output in merge(firsts, streams):
                final = output
                for completion in output.completions:
                    stream = choice_streams[completion.index]
                    if stream.finished:
                        continue
                    new_logprobs = (completion.logprobs or [])[sent_tokens[completion.index]:]
                    sent_tokens[completion.index] = len(completion.token_ids)
                    delta = stream.delta(completion)
                    finish_reason = stream.finish_reason(completion)
                    if delta.content or delta.reasoning_content or delta.tool_calls or finish_reason or (
                            request.logprobs and new_logprobs):
                        yield chunk([self._choice(request, completion, delta, new_logprobs, finish_reason,
                                                  as_message=False)])
            if request.stream_options is not None and request.stream_options.include_usage:
                yield chunk([], UsageInfo.of([final]))
            ok = True
        except OpenAIError as exc:
            yield sse(json.dumps(error_body(exc.status, exc.message, exc.param, exc.code)))
        finally:
            self.ctx.metrics.on_processed(ok)
        yield SSE_DONE
