"""A request's outputs as per-step deltas, so that what crosses the engine-core pipe grows with
the tokens of the step, not with the length of the request.

``DeltaEncoder`` (engine-core side) sends a request's state, or a cumulative ``RequestOutput``, as
what changed since the last it sent for that request, and ``DeltaDecoder`` (front side) rebuilds
the cumulative output from it. Deltas are plain tuples: pickling dataclasses costs
several times more, on the engine's process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from fastllm.engine.async_llm import EngineDeadError
from fastllm.engine.input_processor import RequestError
from fastllm.engine.request_state import RequestState
from fastllm.outputs import CompletionOutput, RequestMetrics, RequestOutput


def _text_delta(previous: str, text: str) -> tuple[int, str]:
    """(characters of ``previous`` kept, what follows them); a stop string may shorten the text."""
    if text.startswith(previous):
        return len(previous), text[len(previous):]
    return 0, text


@dataclass
class _SentSample:
    num_tokens: int = 0
    num_logprobs: int = 0
    text: str = ""
    reasoning: str = ""


@dataclass
class DeltaEncoder:
    """What one request's front end already has; turns each new output into its delta."""

    samples: dict[int, _SentSample] = field(default_factory=dict)
    num_prompt_logprobs: int = -1
    started: bool = False

    def encode(self, output: RequestOutput) -> tuple:
        prompt_logprobs = output.prompt_logprobs
        completions = []
        for completion in output.completions:
            completions.append(self._completion(
                completion.index, completion.send_idx, completion.token_ids, completion.text,
                completion.reasoning_content, completion.cumulative_logprob, completion.logprobs,
                completion.finish_reason, completion.stop_reason))
        return self._delta(output.prompt, output.prompt_token_ids, prompt_logprobs, completions, output.finished,
                           output.num_cached_tokens, output.metrics, output.error_code, output.error_msg)

    def encode_state(self, state: RequestState) -> tuple:
        """``encode(state.to_output())`` without building the output, which copies every token so
        far: what the engine core does for each request that advanced, every step."""
        completions = []
        for sample in state.samples:
            seq = sample.seq
            text, reasoning = state.texts(sample)
            logprobs = seq.output_logprobs if seq.sampling_params.logprobs is not None else None
            completions.append(self._completion(seq.index, sample.send_idx, seq.output_token_ids, text, reasoning,
                                                seq.cumulative_logprob, logprobs, seq.finish_reason,
                                                seq.stop_reason))
            sample.send_idx += 1
        first = state.samples[0].seq
        prompt_logprobs = first.prompt_logprobs if first.sampling_params.prompt_logprobs is not None else None
        return self._delta(state.prompt, state.prompt_token_ids, prompt_logprobs, completions, state.finished,
                           first.num_cached_tokens, state.metrics, state.error_code, state.error_msg)

    def _completion(self, index: int, send_idx: int, token_ids: list[int], text: str, reasoning: str,
                    cumulative_logprob: float, logprobs: Optional[list], finish_reason: Optional[str],
                    stop_reason: Any) -> tuple:
        """One sample's delta; remembers what it sends."""
        sent = self.samples.setdefault(index, _SentSample())
        new_logprobs = None
        if logprobs is not None:
            new_logprobs = logprobs[sent.num_logprobs:]
            sent.num_logprobs = len(logprobs)
        delta = (index, send_idx, token_ids[sent.num_tokens:], _text_delta(sent.text, text),
                 _text_delta(sent.reasoning, reasoning), cumulative_logprob, new_logprobs, finish_reason, stop_reason)
        sent.num_tokens, sent.text, sent.reasoning = len(token_ids), text, reasoning
        return delta

    def _delta(self, prompt_text: Optional[str], prompt_token_ids: list[int], prompt_logprobs: Optional[list],
               completions: list[tuple], finished: bool, num_cached_tokens: int, metrics: RequestMetrics,
               error_code: int, error_msg: str) -> tuple:
        """The request's delta: the prompt the first time, prompt logprobs when they grew."""
        prompt = None
        if not self.started:
            prompt = (prompt_text, prompt_token_ids)
            self.started = True
        if prompt_logprobs is not None and len(prompt_logprobs) != self.num_prompt_logprobs:
            self.num_prompt_logprobs = len(prompt_logprobs)
            prompt_logprobs = list(prompt_logprobs)
        else:
            prompt_logprobs = None
        metrics = metrics if finished else None  # only a finished request's are read
        return (prompt, prompt_logprobs, completions, finished, num_cached_tokens, metrics, error_code, error_msg)


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
    is a new object (a consumer may still hold the previous one)."""

    request_id: str
    arrival_time: float
    prompt: Optional[str] = None
    prompt_token_ids: list[int] = field(default_factory=list)
    prompt_logprobs: Any = None
    completions: dict[int, CompletionOutput] = field(default_factory=dict)

    def decode(self, delta: tuple) -> RequestOutput:
        prompt, prompt_logprobs, completions, finished, num_cached, metrics, error_code, error_msg = delta
        if prompt is not None:
            self.prompt, self.prompt_token_ids = prompt
        if prompt_logprobs is not None:
            self.prompt_logprobs = prompt_logprobs
        for index, send_idx, tokens, text, reasoning, cumulative, logprobs, finish_reason, stop_reason in completions:
            previous = self.completions.get(index) or CompletionOutput(index=index)
            self.completions[index] = CompletionOutput(
                index=index, send_idx=send_idx, token_ids=previous.token_ids + tokens,
                text=previous.text[:text[0]] + text[1], reasoning_content=previous.reasoning_content[:reasoning[0]]
                + reasoning[1], cumulative_logprob=cumulative,
                logprobs=None if logprobs is None else (previous.logprobs or []) + logprobs,
                finish_reason=finish_reason, stop_reason=stop_reason)
        outputs = [self.completions[index] for index in sorted(self.completions)]
        return RequestOutput(request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
                             outputs=outputs[0], completions=outputs, finished=finished,
                             metrics=metrics or RequestMetrics(arrival_time=self.arrival_time),
                             num_cached_tokens=num_cached, prompt_logprobs=self.prompt_logprobs,
                             error_code=error_code, error_msg=error_msg)
