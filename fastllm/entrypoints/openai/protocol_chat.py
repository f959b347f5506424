"""/v1/chat/completions request and response models (OpenAI's chat schema, plus reasoning_content).

``ChatMessage`` is at once a request message, a response message and a stream
delta: the three differ only in which fields are set.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Optional, Union

from pydantic import Field, model_validator

from fastllm.entrypoints.openai.protocol import OpenAIModel, RequestModel, SamplingRequest, UsageInfo

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class FunctionCall(RequestModel):
    name: Optional[str] = None
    arguments: Optional[str] = None


class ToolCall(RequestModel):
    index: Optional[int] = None
    id: Optional[str] = None
    type: Optional[Literal["function"]] = "function"
    function: FunctionCall


class ChatMessage(RequestModel):
    role: Optional[str] = None
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    reasoning_content: Optional[str] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None


class FunctionDefinition(RequestModel):
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None


class Tool(RequestModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: bool = True
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None

    @model_validator(mode="after")
    def _consistent(self) -> "ChatCompletionRequest":
        if any(message.role not in ROLES for message in self.messages):
            raise ValueError(f"every message needs a role, one of {', '.join(sorted(ROLES))}")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in {
                tool.function.name for tool in self.tools}:
            raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools")
        return self

    @property
    def effective_tool_choice(self) -> Union[str, NamedToolChoice]:
        """OpenAI's default: ``auto`` when tools are given, else ``none``."""
        return self.tool_choice or ("auto" if self.tools else "none")


class TopLogprob(OpenAIModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(OpenAIModel):
    content: Optional[list[TokenLogprob]] = None


class ChatChoice(OpenAIModel):
    """A response choice (``message``) or a stream-chunk choice (``delta``); the last two are AIAK's extras."""

    index: int
    message: Optional[ChatMessage] = None
    delta: Optional[ChatMessage] = None
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None
    sentence_length: Optional[int] = None
    cum_log_probs: Optional[float] = None


class ChatCompletionResponse(OpenAIModel):
    """A whole response (``chat.completion``) or one stream chunk (``chat.completion.chunk``)."""

    id: str
    object: Literal["chat.completion", "chat.completion.chunk"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[ChatChoice]
    usage: Optional[UsageInfo] = None
