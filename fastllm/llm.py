"""The offline API of the seeds: ``LLM(model, ...)``, ``generate``, ``chat``."""

from __future__ import annotations

import itertools
from typing import Any, Optional, Sequence, Union

from pydantic import ValidationError
from tqdm import tqdm

from fastllm.adapters import LoRARequest
from fastllm.config import EngineConfig
from fastllm.engine.data_parallel import DataParallelEngine
from fastllm.engine.input_processor import RequestError
from fastllm.engine.llm_engine import LLMEngine
from fastllm.engine.output_processor import OutputKind
from fastllm.multimodal.prefetch import process_prompts_media
from fastllm.outputs import RequestOutput
from fastllm.sampling_params import SamplingParams

PromptType = Union[str, list[int], dict[str, Any]]
ParamsType = Union[SamplingParams, dict[str, Any]]


def _as_prompt_list(prompts: Any) -> list[PromptType]:
    """str | list[str] | list[int] | list[list[int]] | dict | list[dict] -> one entry per request."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]
    return prompts


class LLM:
    """Load a model once, then batch prompts through the engine's continuous batching.

    Every keyword of ``EngineConfig`` is accepted (``max_model_len``, ``block_size``,
    ``max_num_seqs``, ``num_gpu_blocks_override``, ``enable_prefix_caching``, ...); the seeds'
    keywords are named here, and a keyword left out takes ``EngineConfig``'s default (block_size
    64, max_num_seqs 256, gpu_memory_utilization 0.9, kv_cache_ratio 0.75, ...).
    """

    def __init__(self, model: str, tensor_parallel_size: Optional[int] = None, max_model_len: Optional[int] = None,
                 block_size: Optional[int] = None, max_num_seqs: Optional[int] = None,
                 gpu_memory_utilization: Optional[float] = None, num_gpu_blocks_override: Optional[int] = None,
                 max_num_batched_tokens: Optional[int] = None, kv_cache_ratio: Optional[float] = None,
                 enable_prefix_caching: Optional[bool] = None, quantization: Optional[str] = None,
                 reasoning_parser: Optional[str] = None, **kwargs: Any):
        named = dict(tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len, block_size=block_size,
                     max_num_seqs=max_num_seqs, gpu_memory_utilization=gpu_memory_utilization,
                     num_gpu_blocks_override=num_gpu_blocks_override,
                     max_num_batched_tokens=max_num_batched_tokens, kv_cache_ratio=kv_cache_ratio,
                     enable_prefix_caching=enable_prefix_caching, quantization=quantization,
                     reasoning_parser=reasoning_parser)
        kwargs.setdefault("allowed_local_media_path", "/")  # offline, the caller's own files
        self.config = EngineConfig(model=model, **{k: v for k, v in named.items() if v is not None}, **kwargs)
        self.engine = (DataParallelEngine if self.config.data_parallel_size > 1 else LLMEngine)(self.config)
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def start_profile(self) -> None:
        """Record every GPU's (or CPU's) work from now until ``stop_profile``: a torch.profiler
        trace a process, into ``FASTLLM_TORCH_PROFILER_DIR`` (which must be set)."""
        self.engine.start_profile()

    def stop_profile(self) -> None:
        self.engine.stop_profile()

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers or data-parallel replicas, if any; the LLM is unusable afterwards."""
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()

    def generate(self, prompts: Any, sampling_params: Union[ParamsType, Sequence[ParamsType], None] = None,
                 use_tqdm: bool = True, *, chat_template_kwargs: Optional[dict[str, Any]] = None,
                 lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None] = None,
                 tool_call_parser: Optional[str] = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order; a bad request carries error_code/error_msg.
        ``lora_request``: one adapter for every prompt, or a list with one (or None) per prompt.
        ``tool_call_parser``: a ``tool_parsers`` entry that moves the calls out of each text
        into ``CompletionOutput.tool_calls``."""
        prompt_list = _as_prompt_list(prompts)
        params_list = self._params_per_prompt(sampling_params, len(prompt_list))
        adapters = self._per_prompt(lora_request, LoRARequest, len(prompt_list), "lora_request")
        results: dict[str, RequestOutput] = {}
        order = []
        split = [self._split_prompt(prompt) for prompt in prompt_list]
        for (text, token_ids, media), processed, params, adapter in zip(
                split, process_prompts_media(self.engine, split), params_list, adapters):
            request_id = str(next(self._ids))
            order.append(request_id)
            processed_media = {}  # what process_prompts_media made of the media, for the engine to take
            try:
                if isinstance(processed, RequestError):
                    raise processed
                if processed is not None:
                    (token_ids, processed_media["multimodal"]), media = processed, None
                if not isinstance(params, SamplingParams):
                    params = SamplingParams(**params)
                self.engine.add_request(request_id, text, token_ids, params,
                                        chat_template_kwargs=chat_template_kwargs, output_kind=OutputKind.FINAL_ONLY,
                                        lora_request=adapter, multimodal_data=media,
                                        tool_call_parser=tool_call_parser, **processed_media)
            except (RequestError, ValidationError, TypeError) as exc:
                error = exc if isinstance(exc, RequestError) else RequestError(str(exc))
                results[request_id] = LLMEngine.error_output(request_id, text, token_ids, error)
        progress = tqdm(total=len(order), desc="Processed prompts", disable=not use_tqdm)
        progress.update(len(results))
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                if output.finished:
                    results[output.request_id] = output
                    progress.update(1)
        progress.close()
        return [results[request_id] for request_id in order]

    def chat(self, messages: Union[list[dict[str, Any]], list[list[dict[str, Any]]]],
             sampling_params: Union[ParamsType, Sequence[ParamsType], None] = None, use_tqdm: bool = True,
             chat_template_kwargs: Optional[dict[str, Any]] = None, tools: Optional[list[dict]] = None,
             chat_template: Optional[str] = None,
             lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None] = None) -> list[RequestOutput]:
        """Render each conversation with the model's chat template, then generate.

        With ``tools`` and a tool parser (``tool_call_parser=`` or the one the matched template
        brings), the calls the model wrote move from ``text`` to ``CompletionOutput.tool_calls``.
        """
        from fastllm.chat import render_chat
        from fastllm.chat.inputs import ChatInputs
        from fastllm.multimodal.chat import split_media

        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        chat = ChatInputs(self.tokenizer, self.config.model, chat_template or self.config.chat_template,
                          self.config.tool_call_parser)
        conversations, media = zip(*map(split_media, conversations)) if conversations else ((), ())
        prompts = [render_chat(self.tokenizer, chat.template, conv, tools=tools,
                               chat_template_kwargs=chat_template_kwargs) for conv in conversations]
        parses_tools = bool(tools) and chat.tool_parser is not None
        params = [chat.sampling_params(p if isinstance(p, SamplingParams) else SamplingParams(**p), chat.template,
                                       parses_tools)
                  for p in self._params_per_prompt(sampling_params, len(prompts))]
        token_prompts = [{"prompt": p, "prompt_token_ids": chat.tokenize(p), "multimodal_data": m}
                         for p, m in zip(prompts, media)]
        return self.generate(token_prompts, params, use_tqdm, chat_template_kwargs=chat_template_kwargs,
                             lora_request=lora_request, tool_call_parser=chat.parser_name if parses_tools else None)

    @classmethod
    def _params_per_prompt(cls, params: Any, count: int) -> list[ParamsType]:
        if params is None:
            return [SamplingParams() for _ in range(count)]
        return cls._per_prompt(params, (SamplingParams, dict), count, "sampling_params")

    @staticmethod
    def _per_prompt(value: Any, single: Any, count: int, what: str) -> list[Any]:
        """``value`` for every prompt when it is one ``single``; else a list of one per prompt."""
        if value is None or isinstance(value, single):
            return [value] * count
        value = list(value)
        if len(value) != count:
            raise ValueError(f"got {len(value)} {what} for {count} prompts")
        return value

    @staticmethod
    def _split_prompt(prompt: PromptType) -> tuple[Optional[str], Optional[list[int]], Optional[dict[str, Any]]]:
        """(text, token ids, media); media under FastDeploy's ``multimodal_data`` or vLLM's
        ``multi_modal_data``."""
        if isinstance(prompt, str):
            return prompt, None, None
        if isinstance(prompt, dict):
            media = prompt.get("multimodal_data", prompt.get("multi_modal_data"))
            return prompt.get("prompt"), prompt.get("prompt_token_ids"), media
        return None, list(prompt), None
