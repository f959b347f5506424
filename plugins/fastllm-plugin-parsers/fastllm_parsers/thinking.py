"""Reasoning parsers for models that think inside ``<think> ... </think>``.

The thought runs until ``</think>``; the opening ``<think>`` is optional
because many chat templates put it in the prompt.  A generation that never
closes its thought is all reasoning (it was cut off while thinking).  The
newlines a model writes right after ``<think>`` and ``</think>`` are layout and
are dropped.  When the request disabled thinking, the template already closed
the thought in the prompt and the whole output is the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from fastllm.chat import DeltaMessage, ReasoningParser

from fastllm_parsers.markers import MarkerStream


class Phase(Enum):
    """Where a generation is: its parts come in this order."""

    START = "start"  # nothing seen yet: an opening <think> may come
    THINK = "think"
    ANSWER = "answer"
    RESPONSE = "response"  # inside <response> ... </response> (ERNIE X1)


class ThinkingStream(MarkerStream):
    """One request's progress through thought, answer and, for ERNIE X1, its <response> block."""

    def __init__(self, parser: ThinkTagReasoningParser, thinking: bool):
        super().__init__()
        self.parser = parser
        self.phase = Phase.START if thinking else Phase.ANSWER

    def active_markers(self) -> Sequence[str]:
        p = self.parser
        return {
            Phase.START: (p.start_tag, p.end_tag),
            Phase.THINK: (p.end_tag,),
            Phase.ANSWER: p.response_open,
            Phase.RESPONSE: p.response_close,
        }[self.phase]

    def on_text(self, text: str, out: DeltaMessage) -> None:
        if self.phase in (Phase.START, Phase.THINK):
            self.phase = Phase.THINK
            out.reasoning_content += text
        else:
            out.content += text

    def on_marker(self, marker: str, out: DeltaMessage) -> None:
        if marker == self.parser.start_tag and self.phase is Phase.START:
            self.phase = Phase.THINK
        elif marker in self.parser.response_open:
            self.phase = Phase.RESPONSE
            return
        else:
            self.phase = Phase.ANSWER
        self.skip_newlines = True


class ThinkTagReasoningParser(ReasoningParser):
    """``[<think>]reasoning</think>answer``; subclasses name the models and their quirks."""

    start_tag = "<think>"
    end_tag = "</think>"
    response_open: tuple[str, ...] = ()
    response_close: tuple[str, ...] = ()
    honours_enable_thinking = True
    markers = (start_tag, end_tag)

    def stream(self) -> ThinkingStream:
        return ThinkingStream(self, thinking=self.enable_thinking or not self.honours_enable_thinking)


class DeepSeekR1ReasoningParser(ThinkTagReasoningParser):
    """DeepSeek-R1: always thinks (its template has no switch), so ``enable_thinking`` is ignored."""

    honours_enable_thinking = False


class Qwen3ReasoningParser(ThinkTagReasoningParser):
    """Qwen3: ``<think>\\n...\\n</think>\\n\\n`` then the answer; the 2507 thinking models omit ``<think>``."""


class Ernie45VLReasoningParser(ThinkTagReasoningParser):
    """ERNIE-4.5-VL: its template opens ``<think>`` in the prompt, so output starts inside the thought."""


class ErnieX1ReasoningParser(ThinkTagReasoningParser):
    """ERNIE X1 / ERNIE-4.5 thinking: ``...\\n</think>\\n\\n<response>\\nanswer\\n</response>\\n``.

    The answer is the ``<response>`` block without its tags and the one newline
    inside each; text outside any block (tool calls) stays answer content.
    """

    response_open = ("<response>\n", "<response>")
    response_close = ("\n</response>", "</response>")
    markers = ThinkTagReasoningParser.markers + ("<response>", "</response>")
