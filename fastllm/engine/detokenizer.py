"""Incremental detokenization: new text per token without re-decoding the whole output.

Decodes a short window (a few tokens before the new ones) so that byte-level and
SentencePiece merges across token boundaries come out as they would in a full decode.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT_CHAR = "\ufffd"
WINDOW = 6


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids = list(prompt_token_ids[-WINDOW:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: list[int]) -> str:
        """Append tokens; return the text they completed (may be empty mid-character)."""
        self.token_ids.extend(token_ids)
        prefix = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith(REPLACEMENT_CHAR):
            return ""
        delta = full[len(prefix):]
        self.prefix_offset = max(self.read_offset, len(self.token_ids) - WINDOW)
        self.read_offset = len(self.token_ids)
        self.text += delta
        return delta
