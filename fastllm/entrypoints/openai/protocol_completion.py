"""/v1/completions request and response models (OpenAI's legacy completions schema).

A stream chunk has the same shape as a response, so one pair of models serves both.
"""

from __future__ import annotations

import time
from typing import Literal, Optional, Union

from pydantic import Field, StrictInt, field_validator, model_validator

from fastllm.entrypoints.openai.protocol import OpenAIModel, SamplingRequest, UsageInfo

PromptInput = Union[str, list[str], list[StrictInt], list[list[StrictInt]]]


class CompletionRequest(SamplingRequest):
    prompt: PromptInput
    max_tokens: Optional[int] = Field(16, ge=1)
    best_of: Optional[int] = Field(None, ge=1, le=128)
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=5)
    suffix: Optional[str] = None

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value: PromptInput) -> PromptInput:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be an empty list")
        return value

    @model_validator(mode="after")
    def _best_of_covers_n(self) -> "CompletionRequest":
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) must be >= n ({self.n})")
        return self

    def prompts(self) -> list[Union[str, list[int]]]:
        """One entry per engine request: a string or a list of token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(item, int) for item in self.prompt):
            return [list(self.prompt)]
        return list(self.prompt)


class CompletionLogprobs(OpenAIModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)


class CompletionChoice(OpenAIModel):
    """One choice of a response or of a stream chunk; the last two fields are AIAK's extras."""

    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None
    sentence_length: int = 0
    cum_log_probs: float = 0.0


class CompletionResponse(OpenAIModel):
    """A whole response, or one stream chunk (then ``usage`` only on the final usage chunk)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None

