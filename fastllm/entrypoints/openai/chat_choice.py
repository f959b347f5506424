"""One chat choice's cumulative engine output turned into OpenAI deltas (or, in one go, a message).

The engine already splits reasoning and, for ``auto``, tool calls from the
content (``fastllm.engine.output_processor``); this turns those calls into
OpenAI deltas, and adds what the other tool choices ask for: the content as a
named function's arguments, or the content read back as ``required`` calls at
the end. Sending a whole output as one delta gives the non-streamed message, so
both paths share this code.
"""

from __future__ import annotations

from typing import Optional, Union

from fastllm.chat.interface import ToolCall as ParsedToolCall
from fastllm.entrypoints.openai.chat_tools import new_tool_call_id, required_tool_calls
from fastllm.entrypoints.openai.protocol_chat import ChatMessage, FunctionCall, NamedToolChoice, ToolCall
from fastllm.outputs import CompletionOutput


class ChoiceStream:
    def __init__(self, tool_choice: Union[str, NamedToolChoice]):
        self.tool_choice = tool_choice
        self.reasoning_chars = 0
        self.content_chars = 0
        self.required_text = ""
        self.arguments_chars: list[int] = []  # of each parsed call, as far as sent
        self.num_tool_call_parts = 0
        self.finished = False

    def delta(self, completion: CompletionOutput) -> ChatMessage:
        """What ``completion`` adds since the last call."""
        reasoning = completion.reasoning_content[self.reasoning_chars:]
        content = completion.text[self.content_chars:]
        self.reasoning_chars, self.content_chars = len(completion.reasoning_content), len(completion.text)
        self.finished = completion.finish_reason is not None
        tool_calls: list[ToolCall] = []
        if completion.tool_calls is not None:
            tool_calls = self._parsed(completion.tool_calls)
        elif isinstance(self.tool_choice, NamedToolChoice) and content:
            if self.num_tool_call_parts == 0:  # the first delta names the call, later ones only extend arguments
                call = ToolCall(index=0, id=new_tool_call_id(),
                                function=FunctionCall(name=self.tool_choice.function.name, arguments=content))
            else:
                call = ToolCall(index=0, type=None, function=FunctionCall(arguments=content))
            tool_calls = [call]
            content = ""
        elif self.tool_choice == "required":
            self.required_text += content
            content = ""
            if self.finished:
                calls = required_tool_calls(self.required_text)
                content, tool_calls = ("", calls) if calls else (self.required_text, [])
        self.num_tool_call_parts += len(tool_calls)
        return ChatMessage(reasoning_content=reasoning or None, content=content or None,
                           tool_calls=tool_calls or None)

    def message(self, completion: CompletionOutput) -> ChatMessage:
        """The whole of a finished ``completion`` as a response message: tool-call fragments joined."""
        whole = self.delta(completion)
        calls: dict[int, ToolCall] = {}
        for part in whole.tool_calls or []:
            call = calls.setdefault(part.index, ToolCall(function=FunctionCall(arguments="")))
            call.id = call.id or part.id or new_tool_call_id()
            call.function.name = call.function.name or part.function.name
            call.function.arguments += part.function.arguments or ""
        return ChatMessage(role="assistant", content=whole.content if whole.content or calls else "",
                           reasoning_content=whole.reasoning_content, tool_calls=list(calls.values()) or None)

    def finish_reason(self, completion: CompletionOutput) -> Optional[str]:
        """OpenAI says ``tool_calls`` when the model chose to call (auto, required), ``stop`` for a named call."""
        if completion.finish_reason is None:
            return None
        if self.num_tool_call_parts and not isinstance(self.tool_choice, NamedToolChoice):
            return "tool_calls"
        return completion.finish_reason

    def _parsed(self, calls: list[ParsedToolCall]) -> list[ToolCall]:
        """The engine's parsed calls as deltas: a new call with its id and name, then what its
        arguments grew by."""
        deltas = []
        for index, call in enumerate(calls):
            if index == len(self.arguments_chars):
                deltas.append(ToolCall(index=index, id=call.id or None, type="function" if call.id else None,
                                       function=FunctionCall(name=call.name or None, arguments=call.arguments)))
                self.arguments_chars.append(len(call.arguments))
            elif len(call.arguments) > self.arguments_chars[index]:
                deltas.append(ToolCall(index=index, type=None,
                                       function=FunctionCall(arguments=call.arguments[self.arguments_chars[index]:])))
                self.arguments_chars[index] = len(call.arguments)
        return deltas
