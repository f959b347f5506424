"""The chat input stage ``LLM.chat`` and the server's chat endpoint share: the template and the
tool parser chosen once, the sampling changes they ask for, and the prompt's tokens."""

from __future__ import annotations

from typing import Any, Optional

from fastllm.chat.parsers import tool_parser
from fastllm.chat.template import ResolvedTemplate, resolve_chat_template
from fastllm.sampling_params import SamplingParams


class ChatInputs:
    """The template resolved from ``chat_template`` (else the model's), and the tool parser named
    by ``tool_call_parser`` or brought by that template (None when neither names one)."""

    def __init__(self, tokenizer: Any, model: str, chat_template: Optional[str] = None,
                 tool_call_parser: Optional[str] = None):
        self.tokenizer = tokenizer
        self.template = resolve_chat_template(tokenizer, model, chat_template)
        self.parser_name = tool_call_parser or self.template.tool_call_parser
        self.tool_parser = tool_parser(self.parser_name, tokenizer) if self.parser_name else None

    def sampling_params(self, params: SamplingParams, template: ResolvedTemplate, parses_tools: bool) -> SamplingParams:
        """``params`` plus the template's extra stop ids (after the request's own), and special
        tokens kept in the text when the tool parser reads them."""
        update: dict[str, Any] = {}
        if template.extra_stop_token_ids:
            update["stop_token_ids"] = list(params.stop_token_ids) + list(template.extra_stop_token_ids)
        if parses_tools and self.tool_parser is not None and self.tool_parser.requires_special_tokens:
            update["skip_special_tokens"] = False
        return params.model_copy(update=update) if update else params

    def tokenize(self, prompt: str) -> list[int]:
        """A rendered prompt's tokens: the template already wrote the special tokens it wants."""
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
