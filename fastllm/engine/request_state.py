"""Everything the engine tracks about one request beyond its sequences' tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

from fastllm.engine.detokenizer import Detokenizer
from fastllm.engine.sequence import Sequence
from fastllm.engine.stop_strings import find_stop, partial_stop_len
from fastllm.outputs import CompletionOutput, RequestMetrics, RequestOutput


@dataclass
class SampleState:
    """Detokenized text and parsed parts of one of the request's samples."""

    seq: Sequence
    detokenizer: Optional[Detokenizer]
    reasoning_stream: Any = None
    reasoning_content: str = ""
    content: str = ""
    parsed_chars: int = 0
    send_idx: int = 0

    def split_reasoning(self, text: str) -> tuple[str, str]:
        """Feed the reasoning parser the visible text it has not seen yet."""
        if len(text) > self.parsed_chars:
            self._take(self.reasoning_stream.feed(text[self.parsed_chars:]))
            self.parsed_chars = len(text)
        if self.seq.is_finished and self.reasoning_stream is not None:
            self._take(self.reasoning_stream.finish())
            self.reasoning_stream = None
        return self.reasoning_content, self.content

    def _take(self, delta: Any) -> None:
        self.reasoning_content += delta.reasoning_content or ""
        self.content += delta.content or ""


@dataclass
class RequestState:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    samples: list[SampleState]
    metrics: RequestMetrics
    error_code: int = 200
    error_msg: str = ""
    final_output_only: bool = False

    @property
    def num_draft_tokens(self) -> int:
        return self.metrics.num_draft_tokens

    @property
    def num_accepted_tokens(self) -> int:
        return self.metrics.num_accepted_tokens

    @property
    def finished(self) -> bool:
        return all(s.seq.is_finished for s in self.samples)

    def on_tokens(self, sample: SampleState, new_token_ids: list[int]) -> None:
        """Detokenize new tokens; a stop string ends the sample and trims the text."""
        seq = sample.seq
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = time.time()
        if sample.detokenizer is None:
            return
        delta = sample.detokenizer.add(new_token_ids)
        stops = seq.sampling_params.stop
        if delta and stops and seq.num_tokens > seq.num_prompt_tokens:
            hit = find_stop(sample.detokenizer.text, len(delta), stops)
            if hit is not None:
                index, stop = hit
                end = index + len(stop) if seq.sampling_params.include_stop_str_in_output else index
                sample.detokenizer.text = sample.detokenizer.text[:end]
                seq.finish("stop", stop_reason=stop)

    def visible_text(self, sample: SampleState) -> str:
        """Text safe to show now: a possible start of a stop string is held back until decided."""
        if sample.detokenizer is None:
            return ""
        text = sample.detokenizer.text
        if not sample.seq.is_finished and sample.seq.sampling_params.stop:
            text = text[: len(text) - partial_stop_len(text, sample.seq.sampling_params.stop)]
        return text

    def texts(self, sample: SampleState) -> tuple[str, str]:
        """The sample's (text, reasoning content) safe to show now."""
        text = self.visible_text(sample)
        reasoning = ""
        if sample.reasoning_stream is not None or sample.parsed_chars:
            reasoning, text = sample.split_reasoning(text)
        return text, reasoning

    def skip_output(self) -> None:
        """An output not built still counts in ``send_idx``: it numbers the request's steps."""
        for sample in self.samples:
            sample.send_idx += 1

    def to_output(self) -> RequestOutput:
        completions = []
        for sample in self.samples:
            seq = sample.seq
            text, reasoning = self.texts(sample)
            completions.append(CompletionOutput(
                index=seq.index, send_idx=sample.send_idx, token_ids=list(seq.output_token_ids),
                text=text, reasoning_content=reasoning, cumulative_logprob=seq.cumulative_logprob,
                logprobs=list(seq.output_logprobs) if seq.sampling_params.logprobs is not None else None,
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
            sample.send_idx += 1
        first = self.samples[0].seq
        return RequestOutput(
            request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
            outputs=completions[0], completions=completions, finished=self.finished,
            metrics=self.metrics, num_cached_tokens=first.num_cached_tokens,
            prompt_logprobs=first.prompt_logprobs if first.sampling_params.prompt_logprobs is not None else None,
            error_code=self.error_code, error_msg=self.error_msg)
