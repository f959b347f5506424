"""Validated engine configuration: every ``LLM(...)`` / ``fastllm serve`` knob in one place."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

DType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]


class EngineConfig(BaseModel):
    """What the engine is asked to be; derived values (dtype, block count) live elsewhere.

    Field names and defaults follow the seeds (FastDeploy's offline API, AIAK's server flags).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str
    tokenizer: Optional[str] = None
    load_format: Literal["auto", "safetensors", "gguf", "dummy"] | str = "auto"
    dtype: DType = "auto"
    seed: int = 0
    max_model_len: Optional[int] = Field(None, gt=0)
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)  # layers split over stages of tensor_parallel_size ranks each
    data_parallel_size: int = Field(1, ge=1)  # engine replicas, each on its own devices
    distributed_executor_backend: Literal["mp", "ray"] = "mp"  # ranks 1..N-1: local processes or Ray actors
    enable_expert_parallel: bool = False  # MoE experts placed whole over the tensor-parallel ranks, not sliced
    block_size: int = Field(64, gt=0)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: Optional[int] = Field(None, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    cpu_kv_cache_gib: float = Field(2.0, gt=0.0)
    num_gpu_blocks_override: Optional[int] = Field(None, gt=0)
    kv_cache_ratio: float = Field(0.75, gt=0.0, le=1.0)
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False
    tp_cuda_graphs: bool = True  # CUDA graphs under tensor parallelism too (enforce_eager turns all off)
    async_scheduling: Optional[bool] = None  # None: where launches return early (CUDA)
    quantization: Optional[str] = None
    quantize_lm_head: bool = False  # the LM head quantized too, by the registered lm_head_quantizers plugin
    reasoning_parser: Optional[str] = None
    tool_call_parser: Optional[str] = None
    chat_template: Optional[str] = None
    attention_backend: Optional[str] = None
    platform: Optional[str] = None
    speculative_config: Optional[dict[str, Any]] = None
    structured_output_backend: str = "auto"
    structured_output_strict: bool = True  # a request's guided_decoding.strict overrides it
    structured_output_compile_timeout: float = Field(30.0, gt=0.0)  # seconds; the server fails that request
    hf_overrides: dict[str, Any] = Field(default_factory=dict)
    # Adapters (served by the plugin registered as ``adapter_managers: lora``): how many distinct
    # adapters one step may run (device slots), their largest rank, and how many stay on the host.
    enable_lora: bool = False
    max_loras: int = Field(1, ge=1)
    max_lora_rank: int = Field(16, ge=1)
    max_cpu_loras: Optional[int] = Field(None, ge=1)  # None: max_loras
    merge_lora: Optional[str] = None  # a PEFT adapter directory merged into the weights at load
    enable_mm: bool = False  # accepted for FastDeploy: multimodal is on whenever the model is a VL model
    limit_mm_per_prompt: dict[str, int] = Field(default_factory=lambda: {"image": 16, "video": 1})
    allowed_local_media_path: Optional[str] = None  # media files readable by path (LLM: any)
    allowed_media_domains: Optional[list[str]] = None  # the server fetches remote media only from these

    @model_validator(mode="after")
    def _block_size_power_of_two(self) -> "EngineConfig":
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        return self
