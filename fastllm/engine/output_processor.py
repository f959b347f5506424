"""The output stage: the one owner of what a request's new tokens mean to its client.

``OutputProcessor`` decides when and why a sample finishes (eos, stop tokens, lengths, a completed
grammar, stop strings, aborts; the scheduler only frees what finished), detokenizes, holds back
text that may begin a stop string, splits reasoning from content and tool calls from what is left
(for a request that names a tool parser), and builds the request's output in the form its
consumer asked for (``OutputKind``): the cumulative ``RequestOutput`` every step (in-process
streaming), the final one only (offline), or the step's delta (the engine-core process, whose
front end rebuilds outputs with ``fastllm.engine.output_deltas.DeltaDecoder``).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from fastllm.chat.interface import ToolCallDelta, ToolParser, add_tool_calls
from fastllm.chat.parsers import tool_parser
from fastllm.engine.detokenizer import new_detokenizer
from fastllm.engine.request_state import RequestState, SampleState, ToolCallSplit
from fastllm.engine.sequence import Sequence
from fastllm.engine.stop_strings import find_stop, partial_stop_len
from fastllm.outputs import CompletionOutput, RequestMetrics, RequestOutput


class OutputKind(enum.Enum):
    """What ``step()`` returns for a request that advanced (vLLM's ``RequestOutputKind``)."""

    CUMULATIVE = "cumulative"  # a RequestOutput with everything so far, every step
    FINAL_ONLY = "final_only"  # that output once, when the request finishes
    DELTA = "delta"  # a RequestDelta: only what changed since the last, every step


class RequestDelta(NamedTuple):
    """One step of a request as plain data; ``payload`` is what ``DeltaDecoder.decode`` takes."""

    request_id: str
    finished: bool
    payload: tuple


class OutputProcessor:
    """Stateless across requests: everything per request lives in its ``RequestState``."""

    def __init__(self, tokenizer: Any, reasoning_parser_cls: Any = None):
        self.tokenizer = tokenizer
        self.reasoning_parser_cls = reasoning_parser_cls
        self.tool_parsers: dict[str, ToolParser] = {}  # by name; stateless, shared by the requests

    def new_request(self, request_id: str, prompt: Optional[str], seqs: list[Sequence], arrival_time: float,
                    thinking: bool, output_kind: OutputKind, tool_call_parser: Optional[str] = None,
                    consumer_has_prompt_ids: bool = False) -> RequestState:
        """The request's state: a detokenizer, a reasoning parser and (``tool_call_parser``: a
        ``tool_parsers`` entry) a tool parser per sample, seeded with the prompt. Deltas carry
        the prompt's token ids once, unless their consumer has them (it sent them)."""
        call_parser = self._tool_parser(tool_call_parser) if tool_call_parser else None
        samples = []
        for seq in seqs:
            detokenizer = (new_detokenizer(self.tokenizer, seq.prompt_token_ids,
                                           seq.sampling_params.skip_special_tokens)
                           if self.tokenizer is not None else None)
            parser = (self.reasoning_parser_cls(self.tokenizer, enable_thinking=thinking).stream()
                      if self.reasoning_parser_cls else None)
            samples.append(SampleState(seq, detokenizer, parser,
                                       tools=ToolCallSplit(call_parser.stream()) if call_parser else None))
        return RequestState(request_id, prompt, list(seqs[0].prompt_token_ids), samples,
                            RequestMetrics(arrival_time=arrival_time), output_kind,
                            SentOutput(prompt_ids_sent=consumer_has_prompt_ids)
                            if output_kind is OutputKind.DELTA else None)

    def _tool_parser(self, name: str) -> ToolParser:
        """The ``tool_parsers`` entry ``name``, built once; an unknown name lists the registered ones."""
        parser = self.tool_parsers.get(name)
        if parser is None:
            parser = self.tool_parsers[name] = tool_parser(name, self.tokenizer)
        return parser

    # ---- the finish decision -----------------------------------------------------------------
    @staticmethod
    def check_token(seq: Sequence, grammar_terminated: bool = False) -> None:
        """Finish on eos, a stop token, max_tokens, max_model_len or a completed grammar: every
        finish the latest token decides (stop strings: ``detokenize``, once it is text)."""
        params = seq.sampling_params
        num_output = len(seq.output_token_ids)
        token = seq.output_token_ids[-1]
        if num_output >= params.min_tokens:
            if not params.ignore_eos and token in seq.eos_token_ids:
                seq.finish("stop")
                return
            if token in params.stop_token_ids:
                seq.finish("stop", stop_reason=token)
                return
        if params.max_tokens is not None and num_output >= params.max_tokens:
            seq.finish("length")
        elif seq.num_tokens >= seq.max_model_len:
            seq.finish("length")
        elif grammar_terminated:
            seq.finish("stop")

    @staticmethod
    def detokenize(state: RequestState, sample: SampleState, new_token_ids: list[int]) -> None:
        """Detokenize new tokens; a stop string ends the sample and trims the text."""
        seq = sample.seq
        if state.metrics.first_token_time is None:
            state.metrics.first_token_time = time.time()
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

    @staticmethod
    def abort(state: RequestState) -> None:
        for sample in state.samples:
            if not sample.seq.is_finished:
                sample.seq.finish("abort")

    # ---- text --------------------------------------------------------------------------------
    @staticmethod
    def texts(sample: SampleState) -> tuple[str, str]:
        """The sample's (content, reasoning content) safe to show now: a possible start of a stop
        string is held back until decided, reasoning is split off as far as parsed, and tool
        calls (into ``sample.tools``) from the content after it."""
        if sample.detokenizer is None:
            return "", ""
        seq, text = sample.seq, sample.detokenizer.text
        if not seq.is_finished and seq.sampling_params.stop:
            text = text[: len(text) - partial_stop_len(text, seq.sampling_params.stop)]
        content, reasoning = text, ""
        if sample.reasoning_stream is not None or sample.parsed_chars:
            if len(text) > sample.parsed_chars:
                sample.take(sample.reasoning_stream.feed(text[sample.parsed_chars:]))
                sample.parsed_chars = len(text)
            if seq.is_finished and sample.reasoning_stream is not None:
                sample.take(sample.reasoning_stream.finish())
                sample.reasoning_stream = None
            content, reasoning = sample.content, sample.reasoning_content
        if sample.tools is not None:
            content = OutputProcessor._split_calls(sample.tools, content, seq.is_finished)
        return content, reasoning

    @staticmethod
    def _split_calls(tools: ToolCallSplit, content: str, finished: bool) -> str:
        """Feed the content the tool parser has not seen; what is not a call so far."""
        deltas = []
        if len(content) > tools.fed_chars:
            deltas.append(tools.stream.feed(content[tools.fed_chars:]))
            tools.fed_chars = len(content)
        if finished and tools.stream is not None:
            deltas.append(tools.stream.finish())
            tools.stream = None
        for delta in deltas:
            tools.content += delta.content
            tools.parts += delta.tool_calls
        return tools.content

    # ---- outputs -----------------------------------------------------------------------------
    def emit(self, state: RequestState) -> Optional[RequestOutput | RequestDelta]:
        """The request's output after a step that advanced it, in its ``OutputKind``; None for
        a final-only request not done (building an output copies its tokens: O(length) a step
        for nobody). Every call, built or not, numbers a step in ``send_idx``."""
        finished = state.finished
        if finished:
            metrics = state.metrics
            metrics.finished_time = time.time()
            metrics.model_execute_time = metrics.finished_time - (metrics.inference_start_time or metrics.arrival_time)
        if state.output_kind is OutputKind.DELTA:
            return RequestDelta(state.request_id, finished, self._delta(state, finished))
        if state.output_kind is OutputKind.FINAL_ONLY and not finished:
            for sample in state.samples:
                sample.send_idx += 1
            return None
        return self.output(state)

    def output(self, state: RequestState) -> RequestOutput:
        """The request's cumulative output."""
        completions = []
        for sample in state.samples:
            seq = sample.seq
            text, reasoning = self.texts(sample)
            completions.append(CompletionOutput(
                index=seq.index, send_idx=sample.send_idx, token_ids=list(seq.output_token_ids),
                text=text, reasoning_content=reasoning, cumulative_logprob=seq.cumulative_logprob,
                logprobs=list(seq.output_logprobs) if seq.sampling_params.logprobs is not None else None,
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
                tool_calls=add_tool_calls([], sample.tools.parts) if sample.tools is not None else None))
            sample.send_idx += 1
        first = state.samples[0].seq
        return RequestOutput(
            request_id=state.request_id, prompt=state.prompt, prompt_token_ids=state.prompt_token_ids,
            outputs=completions[0], completions=completions, finished=state.finished,
            metrics=state.metrics, num_cached_tokens=first.num_cached_tokens,
            prompt_logprobs=first.prompt_logprobs if first.sampling_params.prompt_logprobs is not None else None,
            error_code=state.error_code, error_msg=state.error_msg)

    def _delta(self, state: RequestState, finished: bool) -> tuple:
        """What changed since the request's last delta, without building its output (which
        copies every token so far): the engine core does this for every request that advanced."""
        sent = state.sent
        completions = []
        for sample in state.samples:
            seq = sample.seq
            text, reasoning = self.texts(sample)
            logprobs = seq.output_logprobs if seq.sampling_params.logprobs is not None else None
            completions.append(sent.completion(seq.index, sample.send_idx, seq.output_token_ids, text, reasoning,
                                               seq.cumulative_logprob, logprobs, seq.finish_reason, seq.stop_reason,
                                               sample.tools.parts if sample.tools is not None else None))
            sample.send_idx += 1
        first = state.samples[0].seq
        prompt_logprobs = first.prompt_logprobs if first.sampling_params.prompt_logprobs is not None else None
        return sent.request(state.prompt_token_ids, prompt_logprobs, completions, finished,
                            first.num_cached_tokens, state.metrics, state.error_code, state.error_msg)


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
    num_tool_parts: int = 0


@dataclass
class SentOutput:
    """What one request's consumer already has, so that each delta carries only what is new (the
    prompt's text never: the consumer sent it). Deltas are plain tuples: pickling dataclasses costs
    several times more, on the engine's process."""

    samples: dict[int, _SentSample] = field(default_factory=dict)
    num_prompt_logprobs: int = -1
    prompt_ids_sent: bool = False

    def completion(self, index: int, send_idx: int, token_ids: list[int], text: str, reasoning: str,
                   cumulative_logprob: float, logprobs: Optional[list], finish_reason: Optional[str],
                   stop_reason: Any, tool_parts: Optional[list[ToolCallDelta]]) -> tuple:
        """One sample's delta; remembers what it sends. Tool-call parts go as tuples, the new ones only."""
        sent = self.samples.setdefault(index, _SentSample())
        new_logprobs = new_tool_parts = None
        if logprobs is not None:
            new_logprobs = logprobs[sent.num_logprobs:]
            sent.num_logprobs = len(logprobs)
        if tool_parts is not None:
            new_tool_parts = [(p.index, p.id, p.name, p.arguments) for p in tool_parts[sent.num_tool_parts:]]
            sent.num_tool_parts = len(tool_parts)
        delta = (index, send_idx, token_ids[sent.num_tokens:], _text_delta(sent.text, text),
                 _text_delta(sent.reasoning, reasoning), cumulative_logprob, new_logprobs, finish_reason, stop_reason,
                 new_tool_parts)
        sent.num_tokens, sent.text, sent.reasoning = len(token_ids), text, reasoning
        return delta

    def request(self, prompt_token_ids: list[int], prompt_logprobs: Optional[list], completions: list[tuple],
                finished: bool, num_cached_tokens: int, metrics: RequestMetrics, error_code: int,
                error_msg: str) -> tuple:
        """The request's delta: the prompt's token ids the first time, unless already sent,
        prompt logprobs when they grew."""
        new_prompt_ids = None
        if not self.prompt_ids_sent:
            new_prompt_ids, self.prompt_ids_sent = prompt_token_ids, True
        if prompt_logprobs is not None and len(prompt_logprobs) != self.num_prompt_logprobs:
            self.num_prompt_logprobs = len(prompt_logprobs)
            prompt_logprobs = list(prompt_logprobs)
        else:
            prompt_logprobs = None
        metrics = metrics if finished else None  # only a finished request's are read
        return (new_prompt_ids, prompt_logprobs, completions, finished, num_cached_tokens, metrics, error_code,
                error_msg)
