"""A request's outputs as per-step deltas, so that what crosses the engine-core pipe grows with
the tokens of the step, not with the length of the request.

The output processor (``fastllm.engine.output_processor``, engine-core side) emits what changed
since the last delta of a request; ``DeltaDecoder`` (front side) rebuilds the cumulative output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from fastllm.chat.interface import ToolCallDelta, add_tool_calls
from fastllm.engine.async_llm import EngineDeadError
from fastllm.engine.input_processor import RequestError
from fastllm.outputs import CompletionOutput, RequestMetrics, RequestOutput


def is_last(kind: str, payload: tuple) -> bool:
    """Whether a request's delta is its last: an error, or a finished output."""
    return kind == "error" or payload[3]


def encode_error(error: BaseException) -> tuple:
    """A request's failure as plain data: its kind, message and status code."""
    return ("dead" if isinstance(error, EngineDeadError) else "request", str(error), getattr(error, "code", 500))


def decode_error(encoded: tuple) -> BaseException:
    kind, message, code = encoded
    return EngineDeadError(message) if kind == "dead" else RequestError(message, code)


@dataclass
class DeltaDecoder:
    """The front end's copy of one request's output, rebuilt from deltas; every output it returns
    is a new object (a consumer may still hold the previous one). The prompt is the front's own:
    the deltas bring its token ids only when the engine made them (tokenized, media expanded)."""

    request_id: str
    arrival_time: float
    prompt: Optional[str] = None
    prompt_token_ids: list[int] = field(default_factory=list)
    prompt_logprobs: Any = None
    completions: dict[int, CompletionOutput] = field(default_factory=dict)

    def decode(self, delta: tuple) -> RequestOutput:
        prompt_token_ids, prompt_logprobs, completions, finished, num_cached, metrics, error_code, error_msg = delta
        if prompt_token_ids is not None:
            self.prompt_token_ids = prompt_token_ids
        if prompt_logprobs is not None:
            self.prompt_logprobs = prompt_logprobs
        for (index, send_idx, tokens, text, reasoning, cumulative, logprobs, finish_reason, stop_reason,
             tool_parts) in completions:
            previous = self.completions.get(index) or CompletionOutput(index=index)
            self.completions[index] = CompletionOutput(
                index=index, send_idx=send_idx, token_ids=previous.token_ids + tokens,
                text=previous.text[:text[0]] + text[1], reasoning_content=previous.reasoning_content[:reasoning[0]]
                + reasoning[1], cumulative_logprob=cumulative,
                logprobs=None if logprobs is None else (previous.logprobs or []) + logprobs,
                finish_reason=finish_reason, stop_reason=stop_reason,
                tool_calls=None if tool_parts is None else add_tool_calls(
                    previous.tool_calls or [], [ToolCallDelta(*part) for part in tool_parts]))
        outputs = [self.completions[index] for index in sorted(self.completions)]
        return RequestOutput(request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
                             outputs=outputs[0], completions=outputs, finished=finished,
                             metrics=metrics or RequestMetrics(arrival_time=self.arrival_time),
                             num_cached_tokens=num_cached, prompt_logprobs=self.prompt_logprobs,
                             error_code=error_code, error_msg=error_msg)
