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
    """The one admission check, shared by the server and ``LLM.generate``: whatever passes it
    cannot make the engine loop raise."""

    def __init__(self, tokenizer: Optional[Any], max_model_len: int, vocab_size: int):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self._max_text_chars: Optional[int] = None

    @property
    def max_text_chars(self) -> int:
        """The longest text that could still fit ``max_model_len`` tokens: no token covers more
        characters than the longest vocabulary entry (counted generously, twice over), so a
        longer text is refused before tokenizing it costs anything."""
        if self._max_text_chars is None:
            longest = max(map(len, self.tokenizer.get_vocab()), default=1) if self.tokenizer is not None else 1
            self._max_text_chars = 2 * max(longest, 1) * self.max_model_len
        return self._max_text_chars

    def check_text_length(self, text: str) -> None:
        if len(text) > self.max_text_chars:
            raise RequestError(f"the prompt has {len(text)} characters, more than max_model_len="
                               f"{self.max_model_len} tokens can hold")

    def tokenize(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise RequestError("this model has no tokenizer: pass prompt token ids")
        self.check_text_length(prompt)
        return self.tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]

    def check_max_tokens(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """The server's rule (OpenAI's and vLLM's): the prompt plus ``max_tokens`` must fit."""
        if num_prompt_tokens + max_tokens > self.max_model_len:
            raise RequestError(
                f"max_model_len is {self.max_model_len} tokens, but this request needs "
                f"{num_prompt_tokens + max_tokens} ({num_prompt_tokens} in the prompt, {max_tokens} to "
                "generate); shorten the prompt or lower max_tokens")

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not prompt_token_ids:
            raise RequestError("the prompt is empty")
        # set, min and max run in C: no Python step per token of a long prompt
        if (set(map(type, prompt_token_ids)) != {int} or min(prompt_token_ids) < 0
                or max(prompt_token_ids) >= self.vocab_size):
            raise RequestError(f"prompt token ids must be integers in [0, {self.vocab_size})")
        for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias)):
            if any(not 0 <= t < self.vocab_size for t in ids):
                raise RequestError(f"{name} token ids must be in [0, {self.vocab_size})")
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
                if ids and ids not in words and all(0 <= t < self.vocab_size for t in ids):
                    words.append(ids)
        return words
