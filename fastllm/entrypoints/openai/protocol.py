"""Request and response models shared by the OpenAI endpoints, following OpenAI's schema.

Ranges are OpenAI's (temperature 0..2, penalties -2..2, ...), tighter than what
SamplingParams accepts, so a request the OpenAI API would refuse is refused here
with a 400 as well. Unknown fields are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field

from fastllm.outputs import RequestOutput
from fastllm.sampling_params import GuidedDecodingParams, SamplingParams


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class ErrorInfo(OpenAIModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[Union[int, str]] = None


class ErrorResponse(OpenAIModel):
    error: ErrorInfo


class PromptTokensDetails(OpenAIModel):
    cached_tokens: int = 0


class UsageInfo(OpenAIModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    @classmethod
    def of(cls, outputs: list[RequestOutput]) -> "UsageInfo":
        """Every token the engine read or wrote for these requests (all samples, best_of's too)."""
        prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
        completion_tokens = sum(len(c.token_ids) for o in outputs for c in o.completions)
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(o.num_cached_tokens for o in outputs)))


class ModelCard(OpenAIModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "fastllm"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(OpenAIModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class StreamOptions(OpenAIModel):
    include_usage: bool = False


class JsonSchemaFormat(OpenAIModel):
    name: str = "response"
    description: Optional[str] = None
    json_schema: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class SamplingRequest(OpenAIModel):
    """The sampling fields both /v1/completions and /v1/chat/completions accept."""

    model: Optional[str] = None
    n: int = Field(1, ge=1, le=128)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=-1)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: Optional[float] = Field(None, gt=0.0, le=10.0)
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    include_stop_str_in_output: bool = False
    logit_bias: Optional[dict[int, float]] = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    skip_special_tokens: bool = True
    user: Optional[str] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    response_format: Optional[ResponseFormat] = None
    guided_json: Optional[Union[str, dict[str, Any]]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    guided_strict: Optional[bool] = None  # see GuidedDecodingParams.strict

    def guided_decoding(self) -> Optional[GuidedDecodingParams]:
        """response_format or the guided_* fields as one GuidedDecodingParams (at most one may be set)."""
        spec: dict[str, Any] = {}
        if self.response_format is not None and self.response_format.type == "json_object":
            spec["json_object"] = True
        elif self.response_format is not None and self.response_format.type == "json_schema":
            schema = self.response_format.json_schema
            spec["json"] = schema.json_schema if schema is not None and schema.json_schema else {"type": "object"}
            if schema is not None and schema.strict is not None:
                spec["strict"] = schema.strict
        for key, value in (("json", self.guided_json), ("regex", self.guided_regex),
                           ("choice", self.guided_choice), ("grammar", self.guided_grammar)):
            if value is not None:
                spec[key] = value
        if spec and self.guided_strict is not None:
            spec["strict"] = self.guided_strict
        return GuidedDecodingParams(**spec) if spec else None

    def sampling_params(self, max_tokens: Optional[int], logprobs: Optional[int] = None,
                        prompt_logprobs: Optional[int] = None, n: Optional[int] = None,
                        extra_stop_token_ids: Sequence[int] = ()) -> SamplingParams:
        """Only the fields the client set, so SamplingParams' defaults stay the defaults."""
        given = {key: getattr(self, key) for key in (
            "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty") if getattr(self, key) is not None}
        return SamplingParams(
            **given, n=n or self.n, seed=self.seed, max_tokens=max_tokens, min_tokens=self.min_tokens,
            stop=self.stop, stop_token_ids=list(self.stop_token_ids or []) + list(extra_stop_token_ids),
            include_stop_str_in_output=self.include_stop_str_in_output, ignore_eos=self.ignore_eos,
            logit_bias=self.logit_bias or {}, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens, guided_decoding=self.guided_decoding())
