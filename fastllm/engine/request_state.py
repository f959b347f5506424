"""Everything the engine tracks about one request beyond its sequences' tokens (plain data;
``fastllm.engine.output_processor`` acts on it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from fastllm.engine.detokenizer import Detokenizer
from fastllm.engine.sequence import Sequence
from fastllm.outputs import RequestMetrics

if TYPE_CHECKING:
    from fastllm.engine.output_processor import OutputKind, SentOutput


@dataclass
class ToolCallSplit:
    """One sample's content through its request's tool parser: what is not a call, and the calls
    as the parser streamed them (``fastllm.chat.ToolCallDelta``; ``add_tool_calls`` sums them)."""

    stream: Any  # the parser's ParserStream; None once finished
    fed_chars: int = 0
    content: str = ""
    parts: list = field(default_factory=list)


@dataclass
class SampleState:
    """Detokenized text and parsed parts of one of the request's samples."""

    seq: Sequence
    detokenizer: Optional[Detokenizer]
    reasoning_stream: Any = None
    reasoning_content: str = ""
    content: str = ""
    parsed_chars: int = 0
    tools: Optional[ToolCallSplit] = None  # None: the request parses no tool calls
    send_idx: int = 0

    def take(self, delta: Any) -> None:
        """Add a reasoning parser's output (``fastllm.engine.output_processor.texts`` feeds it)."""
        self.reasoning_content += delta.reasoning_content or ""
        self.content += delta.content or ""


@dataclass
class RequestState:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    samples: list[SampleState]
    metrics: RequestMetrics
    output_kind: OutputKind
    sent: Optional[SentOutput] = None  # what the consumer of its deltas has (OutputKind.DELTA)
    error_code: int = 200
    error_msg: str = ""

    @property
    def num_draft_tokens(self) -> int:
        return self.metrics.num_draft_tokens

    @property
    def num_accepted_tokens(self) -> int:
        return self.metrics.num_accepted_tokens

    @property
    def finished(self) -> bool:
        samples = self.samples
        if len(samples) == 1:  # most requests: no generator a step
            return samples[0].seq.is_finished
        return all(s.seq.is_finished for s in samples)
