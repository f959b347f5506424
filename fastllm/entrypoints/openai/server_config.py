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
