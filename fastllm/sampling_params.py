"""Per-request decoding parameters, validated so a bad value fails that request alone."""

from __future__ import annotations

from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

# what one request may ask for: each sample's seed (seed + sample index) must fit the sampler's int64
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_TOKEN_ID_LIST = 4096  # stop_token_ids and logit_bias entries
StopString = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS)]


class GuidedDecodingParams(BaseModel):
    """Constrain the output to a JSON schema, any JSON object, a regex, an EBNF grammar or a choice."""

    model_config = ConfigDict(extra="forbid")

    json_schema: Optional[Union[dict[str, Any], str]] = Field(None, alias="json")
    json_object: bool = False
    regex: Optional[str] = None
    grammar: Optional[str] = None
    choice: Optional[list[str]] = Field(None, min_length=1)
    # True: refuse (400) what the backend would enforce only approximately; False: accept the
    # approximation knowingly; None: the engine's structured_output_strict
    strict: Optional[bool] = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "GuidedDecodingParams":
        given = [self.json_schema is not None, self.json_object, self.regex is not None,
                 self.grammar is not None, self.choice is not None]
        if sum(given) != 1:
            raise ValueError("guided_decoding needs exactly one of json, json_object, regex, grammar, choice")
        return self


class SamplingParams(BaseModel):
    """How to pick tokens and when to stop; names and meaning follow vLLM / FastDeploy."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    n: int = Field(1, ge=1, le=128)
    best_of: Optional[int] = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    seed: Optional[int] = Field(None, ge=SEED_MIN, le=SEED_MAX)
    max_tokens: Optional[int] = Field(16, ge=1)
    min_tokens: int = Field(0, ge=0)
    stop: list[StopString] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    stop_token_ids: list[int] = Field(default_factory=list, max_length=MAX_TOKEN_ID_LIST)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    bad_words: list[StopString] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    logit_bias: dict[int, float] = Field(default_factory=dict, max_length=MAX_TOKEN_ID_LIST)
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    prompt_logprobs: Optional[int] = Field(None, ge=0, le=20)
    skip_special_tokens: bool = True
    guided_decoding: Optional[GuidedDecodingParams] = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else (value or [])

    @field_validator("guided_decoding", mode="before")
    @classmethod
    def _guided_from_dict(cls, value: Any) -> Any:
        return GuidedDecodingParams(**value) if isinstance(value, dict) else value

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, value: dict[int, float]) -> dict[int, float]:
        for token_id, bias in value.items():
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias[{token_id}]={bias} is outside [-100, 100]")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "SamplingParams":
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) must be >= n ({self.n})")
        if self.seed is not None and self.seed + max(self.n, self.best_of or 1) - 1 > SEED_MAX:
            raise ValueError(f"seed must be at most {SEED_MAX} minus the number of samples")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def needs_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)
