"""Turns user prompts into validated token ids; bad input raises RequestError for that request."""

from __future__ import annotations

from typing import Any, Optional

from fastllm.sampling_params import SamplingParams


class RequestError(ValueError):
    """A request the engine refuses; ``code`` is the HTTP-style status to report."""

    def __init__(self, message: str, code: int = 400):
        super().__init__(message)
        self.code = code


class InputProcessor:
    def __init__(self, tokenizer: Optional[Any], max_model_len: int, vocab_size: int):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    def tokenize(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise RequestError("this model has no tokenizer: pass prompt token ids")
        return self.tokenizer(prompt, add_special_tokens=True)["input_ids"]

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not prompt_token_ids:
            raise RequestError("the prompt is empty")
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise RequestError(f"prompt token ids must be integers in [0, {self.vocab_size})")
        if len(prompt_token_ids) >= self.max_model_len:
            raise RequestError(
                f"the prompt has {len(prompt_token_ids)} tokens; max_model_len is {self.max_model_len}, "
                "which must also leave room for at least one generated token")
        if (params.stop or params.bad_words) and self.tokenizer is None:
            raise RequestError("stop strings and bad_words need a tokenizer")

    def bad_words_token_ids(self, params: SamplingParams) -> list[list[int]]:
        """Each bad word as tokens, both as written and with a leading space (mid-sentence form)."""
        words: list[list[int]] = []
        for word in params.bad_words:
            for variant in {word, " " + word.lstrip()}:
                ids = self.tokenizer(variant, add_special_tokens=False)["input_ids"]
                if ids and ids not in words:
                    words.append(ids)
        return words
