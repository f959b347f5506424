"""The xgrammar structured-output backend: compile specs (cached), hand out matchers, advance and
mask a batch."""

from __future__ import annotations

import functools
import re
from typing import Optional, Sequence

import torch
import xgrammar as xgr

from fastllm.sampling_params import GuidedDecodingParams
from fastllm_xgrammar.bitmask import TokenBitmask
from fastllm_xgrammar.specs import GrammarSpec, grammar_spec

_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class XGrammarBackend:
    """Follows ``fastllm.structured_output.StructuredOutputBackend``.

    Compiled grammars sit in an LRU keyed by the reduced spec, so a schema sent with every
    request compiles once and its matchers start at once. xgrammar's own compiler cache
    stays on beneath it, bounded in bytes: a grammar the LRU evicted comes back from there
    while it fits.

    JSON is generated compactly (``any_whitespace=False``): free whitespace lets small
    models wander into endless newlines inside an object, and the output stays valid JSON.
    """

    def __init__(self, tokenizer_info: xgr.TokenizerInfo, cache_size: int = 128,
                 compiler_cache_bytes: int = 256 << 20, max_threads: int = 8):
        self.compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=max_threads, cache_enabled=True,
                                            cache_limit_bytes=compiler_cache_bytes)
        self._compile_cached = functools.lru_cache(maxsize=cache_size)(self._compile_spec)
        self.bitmask = TokenBitmask(tokenizer_info.vocab_size)
        self.stop_token_ids = frozenset(tokenizer_info.stop_token_ids)

    def compile(self, params: GuidedDecodingParams) -> xgr.CompiledGrammar:
        spec = grammar_spec(params)
        try:
            return self._compile_cached(spec)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"{spec.kind}: {_LOG_PREFIX.sub('', str(exc)).strip()}") from None

    def new_matcher(self, compiled: xgr.CompiledGrammar) -> xgr.GrammarMatcher:
        return xgr.GrammarMatcher(compiled)

    def accept_tokens(self, matchers: Sequence[xgr.GrammarMatcher], token_ids: Sequence[int]) -> list[bool]:
        """Accept each row's token. One ``accept_token`` a row: xgrammar 0.2.8's
        ``batch_accept_token`` is slower, as it reads its result back element by element. A
        matcher terminates only by accepting a stop token, so only those are asked.

        The next masks are filled in ``apply_bitmask``, not here on a worker thread: on the
        H100 (64 guided rows, 8B model) filling ahead on a worker made the fill 1.6x slower and
        the host's CPU time 6x higher (contention with xgrammar's own threads).

        A live sequence's token is rejected only when its mask allowed nothing (a grammar that
        leads into a dead end, ``root ::= "x" a  a ::= a``): that sequence ends there, instead of
        sampling from all-masked logits until max_tokens."""
        accepted = [matcher.accept_token(token) for matcher, token in zip(matchers, token_ids)]
        return [not ok or (token in self.stop_token_ids and matcher.is_terminated())
                for matcher, token, ok in zip(matchers, token_ids, accepted)]

    def apply_bitmask(self, logits: torch.Tensor, matchers: Sequence[Optional[xgr.GrammarMatcher]]) -> None:
        self.bitmask.apply(logits, matchers)

    def cache_info(self) -> functools._CacheInfo:
        """Hits and misses of the spec cache."""
        return self._compile_cached.cache_info()

    def _compile_spec(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        """A grammar that allows no first token (``a ::= a``, a schema that only refers to itself)
        is refused here: masked with it, every logit would be -inf."""
        compiled = self._compile_source(spec)
        first = xgr.allocate_token_bitmask(1, self.bitmask.vocab_size)
        xgr.GrammarMatcher(compiled).fill_next_token_bitmask(first)
        if not first.any():
            raise ValueError(f"{spec.kind}: the grammar accepts no output")
        return compiled

    def _compile_source(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        if spec.kind == "json_schema":
            return self.compiler.compile_json_schema(spec.source, any_whitespace=False)
        if spec.kind == "json_object":
            # the builtin JSON grammar also admits a top-level array; an open object schema does not
            return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False,
                                                     strict_mode=False)
        if spec.kind == "regex":
            return self.compiler.compile_regex(spec.source)
        return self.compiler.compile_grammar(spec.source)
