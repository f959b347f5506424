"""What the HTTP server adds on top of the engine's configuration."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class ServerConfig(BaseModel):
    """Server-only knobs; model, parsers and chat template stay in EngineConfig."""

    model_config = ConfigDict(extra="forbid")

    served_model_names: list[str] = Field(min_length=1)
    api_keys: list[str] = Field(default_factory=list)
    disable_log_requests: bool = False
    enable_auto_tool_choice: bool = False
    max_waiting_requests: Optional[int] = Field(
        None, ge=0, description="answer 429 while this many requests wait to be scheduled; None: no limit")
    max_request_body_bytes: int = Field(16 * 2**20, gt=0)
    shutdown_timeout: float = Field(30.0, ge=0.0, description="seconds in-flight requests get after SIGTERM")
    lora_modules: dict[str, str] = Field(default_factory=dict, description="adapter name -> PEFT directory")
    allow_runtime_lora_updating: bool = False
    max_prompts_per_request: int = Field(4096, gt=0, description="prompts in one /v1/completions request")
    max_sequences_per_request: int = Field(4096, gt=0, description="prompts x max(n, best_of) of one request")
    limit_concurrency: Optional[int] = Field(
        1024, gt=0, description="open connections plus running requests; beyond it uvicorn answers 503")
    timeout_keep_alive: float = Field(5.0, gt=0.0, description="seconds an idle kept-alive connection stays open")
    header_timeout: float = Field(10.0, gt=0.0, description="seconds a connection has to send a request's headers")
    body_timeout: float = Field(30.0, gt=0.0, description="seconds between two parts of a request body")
    enable_docs: bool = Field(False, description="serve /docs, /redoc and /openapi.json even with api_keys")
