"""Request and response models shared by the OpenAI endpoints, following OpenAI's schema.

Ranges are OpenAI's (temperature 0..2, penalties -2..2, ...), tighter than what
SamplingParams accepts, so a request the OpenAI API would refuse is refused here
with a 400 as well. Unknown fields are ignored, as OpenAI-compatible servers do.
Request models are strict: ``true`` is not an integer and ``"3"`` is not a number,
and text holding a lone surrogate (which no tokenizer and no JSON encoder takes) is
refused before anything else looks at it.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fastllm.outputs import RequestOutput
from fastllm.sampling_params import GuidedDecodingParams, SamplingParams


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class RequestModel(OpenAIModel):
    """What a client sends: no type coercion (a bool is no int, a string no number)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True)


def check_unicode(value: Any) -> Any:
    """Refuse any string (value or key, at any depth) that is not encodable Unicode."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("text must be valid Unicode; lone surrogates (\\ud800-\\udfff) are refused") from None
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return value


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
    parent: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(OpenAIModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoadLoRAAdapterRequest(RequestModel):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoRAAdapterRequest(RequestModel):
    lora_name: str = Field(min_length=1)


class StreamOptions(RequestModel):
    include_usage: bool = False


class JsonSchemaFormat(RequestModel):
    name: str = "response"
    description: Optional[str] = None
    json_schema: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class SamplingRequest(RequestModel):
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

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        return check_unicode(value)

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _bias_keys(cls, value: Any) -> Any:
        """JSON object keys are strings: a key is a token id written in decimal digits."""
        if not isinstance(value, dict):
            return value
        keys = {key: int(key) if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 19 else key
                for key in value}
        if any(not isinstance(key, int) for key in keys.values()):
            raise ValueError("logit_bias keys must be token ids written as decimal integers")
        return {keys[key]: bias for key, bias in value.items()}

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> "SamplingRequest":
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self

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
                        prompt_logprobs: Optional[int] = None, n: Optional[int] = None) -> SamplingParams:
        """Only the fields the client set, so SamplingParams' defaults stay the defaults."""
        given = {key: getattr(self, key) for key in (
            "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty") if getattr(self, key) is not None}
        return SamplingParams(
            **given, n=n or self.n, seed=self.seed, max_tokens=max_tokens, min_tokens=self.min_tokens,
            stop=self.stop, stop_token_ids=list(self.stop_token_ids or []),
            include_stop_str_in_output=self.include_stop_str_in_output, ignore_eos=self.ignore_eos,
            logit_bias=self.logit_bias or {}, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens, guided_decoding=self.guided_decoding())
