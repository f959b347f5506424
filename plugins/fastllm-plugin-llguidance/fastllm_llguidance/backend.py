"""The llguidance structured-output backend: compile specs (cached), hand out matchers, advance
and mask a batch."""

from __future__ import annotations

import functools
import json
import re
from typing import Optional, Sequence

import torch
from llguidance import LLExecutor, LLMatcher, LLTokenizer
from llguidance.torch import fill_next_token_bitmask_par

from fastllm.sampling_params import GuidedDecodingParams
from fastllm.structured_output.coverage import subschemas
from fastllm_llguidance.specs import grammar_text

_UNKNOWN_FORMAT = re.compile(r"Unknown format: ([^\n]+)")
_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[(.*?)\]')
_MAX_DROPPED_FORMATS = 16


class LLGuidanceBackend:
    """Follows ``fastllm.structured_output.StructuredOutputBackend``.

    llguidance refuses a JSON schema keyword it does not implement (unless the request is not
    strict), so a schema it compiles is enforced as written. A compiled grammar is a matcher at
    its start, kept in an LRU keyed by the grammar text; each sample gets a copy of it.
    """

    name = "llguidance"

    def __init__(self, tokenizer: LLTokenizer, vocab_size: int, cache_size: int = 128,
                 max_threads: Optional[int] = None):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.stop_token_ids = frozenset([tokenizer.eos_token])
        self.executor = LLExecutor(max_threads)
        self._compile_cached = functools.lru_cache(maxsize=cache_size)(self._compile_grammar)
        self._bitmask = torch.empty(0, (vocab_size + 31) // 32, dtype=torch.int32)
        self._bits = torch.arange(32, dtype=torch.int32)

    def compile(self, params: GuidedDecodingParams) -> LLMatcher:
        dropped: frozenset[str] = frozenset()
        while True:
            try:
                return self._compile_cached(grammar_text(params, dropped))
            except ValueError as exc:
                unknown = _UNKNOWN_FORMAT.search(str(exc))
                if unknown is None or unknown.group(1) in dropped or len(dropped) >= _MAX_DROPPED_FORMATS:
                    raise ValueError(self._located(params, str(exc))) from None
                dropped |= {unknown.group(1)}

    def new_matcher(self, compiled: LLMatcher) -> LLMatcher:
        return compiled.deep_copy()

    def accept_tokens(self, matchers: Sequence[LLMatcher], token_ids: Sequence[int]) -> list[bool]:
        """``try_consume_tokens`` leaves a matcher as it was on a token its grammar rejects
        (``consume_token`` would put it in an error state for good)."""
        for matcher, token in zip(matchers, token_ids):
            matcher.try_consume_tokens([token])
        return [token in self.stop_token_ids and matcher.is_stopped() and not matcher.is_error()
                for matcher, token in zip(matchers, token_ids)]

    def apply_bitmask(self, logits: torch.Tensor, matchers: Sequence[Optional[LLMatcher]]) -> None:
        """Fill the guided rows' masks on llguidance's threads, then unpack the bits on the
        logits' device and set the refused tokens to -inf."""
        indices = [i for i, matcher in enumerate(matchers) if matcher is not None]
        if not indices:
            return
        if self._bitmask.shape[0] < len(matchers):
            self._bitmask = torch.empty(max(len(matchers), 2 * self._bitmask.shape[0]), self._bitmask.shape[1],
                                        dtype=torch.int32)
        fill_next_token_bitmask_par(self.executor, [(matchers[i], i) for i in indices], self._bitmask)
        rows = torch.as_tensor(indices, device=logits.device)
        masks = self._bitmask[indices].to(logits.device, non_blocking=True)
        bits = self._bits.to(logits.device)
        allowed = ((masks.unsqueeze(-1) >> bits) & 1).bool().flatten(1)[:, :logits.shape[1]]
        logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))

    def accept_prefix(self, matcher: LLMatcher, token_ids: Sequence[int]) -> int:
        """A complete grammar stops by itself: its stop token then counts as accepted but is not
        consumed (so it is not rolled back either)."""
        count = matcher.try_consume_tokens(list(token_ids))
        if count < len(token_ids) and token_ids[count] in self.stop_token_ids and matcher.is_stopped():
            count += 1
        return count

    def rollback(self, matcher: LLMatcher, num_tokens: int) -> None:
        if num_tokens:
            matcher.rollback(num_tokens)

    def cache_info(self) -> functools._CacheInfo:
        """Hits and misses of the grammar cache."""
        return self._compile_cached.cache_info()

    def _compile_grammar(self, grammar: str) -> LLMatcher:
        """A grammar that allows no first token (``a ::= a``, a schema that only refers to itself)
        is refused here: its matcher errs on the first mask, and the request would end empty."""
        matcher = LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error() or "llguidance could not compile it")
        probe = matcher.deep_copy()
        fill_next_token_bitmask_par(self.executor, [(probe, 0)], torch.empty(1, self._bitmask.shape[1],
                                                                            dtype=torch.int32))
        if probe.is_error():
            raise ValueError("the grammar accepts no output")
        return matcher

    @staticmethod
    def _located(params: GuidedDecodingParams, message: str) -> str:
        """llguidance's message, plus the JSON pointers of the keywords it does not implement."""
        kind = "json_schema" if params.json_schema is not None else next(
            k for k in ("json_object", "regex", "grammar", "choice") if getattr(params, k))
        unimplemented = _UNIMPLEMENTED.search(message)
        if unimplemented is None or params.json_schema is None:
            return f"{kind}: {message}"
        keywords = json.loads(f"[{unimplemented.group(1)}]")
        schema = json.loads(params.json_schema) if isinstance(params.json_schema, str) else params.json_schema
        places = [f"'{keyword}' at {pointer or '/'}" for pointer, node in subschemas(schema)
                  for keyword in keywords if keyword in node]
        return f"{kind}: {message} ({'; '.join(places[:5])})" if places else f"{kind}: {message}"
