"""Incremental detokenization: new text per token without re-decoding the whole output.

Both forms decode new tokens together with a few tokens before them, so that byte-level and
SentencePiece merges across token boundaries come out as they would in a full decode, and
hold back text that ends inside a multi-byte character until the character is complete.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

REPLACEMENT_CHAR = "\ufffd"
WINDOW = 6


class Detokenizer(Protocol):
    text: str  # everything decoded so far (a stop string may trim it)

    def add(self, token_ids: list[int]) -> str:
        """Append tokens; return the text they completed (may be empty mid-character)."""
        ...


class WindowDetokenizer:
    """Through ``tokenizer.decode`` over a short window: any tokenizer (two decodes a step)."""

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


class StreamDetokenizer:
    """Through the Rust ``tokenizers.decoders.DecodeStream`` of a fast tokenizer: the same
    text for a fraction of the host time of the Python path, which a step pays once per running
    sequence."""

    def __init__(self, tokenizer: Any, stream: Any):
        self.backend, self.stream, self.text = tokenizer.backend_tokenizer, stream, ""

    def add(self, token_ids: list[int]) -> str:
        delta = "".join(chunk for chunk in (self.stream.step(self.backend, t) for t in token_ids) if chunk)
        self.text += delta
        return delta


def new_detokenizer(tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool) -> Detokenizer:
    """A ``StreamDetokenizer`` where it decodes as ``tokenizer.decode`` does: a fast tokenizer
    that does not clean up spaces after decoding (the stream cannot), with a ``tokenizers``
    recent enough to seed the stream with the prompt; otherwise the windowed form."""
    stream = _decode_stream(tokenizer, prompt_token_ids[-WINDOW:], skip_special_tokens)
    if stream is None:
        return WindowDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens)
    return StreamDetokenizer(tokenizer, stream)


def _decode_stream(tokenizer: Any, seed_ids: list[int], skip_special_tokens: bool) -> Optional[Any]:
    cleans_up = getattr(tokenizer, "clean_up_tokenization_spaces", False)
    if getattr(tokenizer, "backend_tokenizer", None) is None or cleans_up:
        return None
    try:
        from tokenizers.decoders import DecodeStream

        return DecodeStream(ids=seed_ids, skip_special_tokens=skip_special_tokens)
    except (ImportError, TypeError):
        return None
