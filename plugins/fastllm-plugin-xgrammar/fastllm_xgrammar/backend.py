"""The xgrammar structured-output backend: compile specs (cached), hand out matchers, advance and
mask a batch."""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Optional, Sequence

import torch
import xgrammar as xgr

from fastllm.sampling_params import GuidedDecodingParams
from fastllm.structured_output.coverage import Gap, InexactSchema, ref_siblings_apply, schema_gaps, subschemas
from fastllm_xgrammar.bitmask import TokenBitmask
from fastllm_xgrammar.coverage import classify
from fastllm_xgrammar.specs import GrammarSpec, grammar_spec, lengths_as_patterns
from fastllm_xgrammar.warnings import converter_warnings

_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class XGrammarBackend:
    """Follows ``fastllm.structured_output.StructuredOutputBackend``.

    Compiled grammars sit in an LRU keyed by the reduced spec, beside the approximations
    xgrammar warned of while compiling them, so a schema sent with every request compiles
    once and its matchers start at once. xgrammar's own compiler cache stays off: a grammar
    served from it would come back without its warnings.

    JSON is generated compactly (``any_whitespace=False``): free whitespace lets small
    models wander into endless newlines inside an object, and the output stays valid JSON.
    """

    name = "xgrammar"

    def __init__(self, tokenizer_info: xgr.TokenizerInfo, cache_size: int = 256, max_threads: int = 8):
        self.compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=max_threads, cache_enabled=False)
        self._compile_cached = functools.lru_cache(maxsize=cache_size)(self._compile_spec)
        self.bitmask = TokenBitmask(tokenizer_info.vocab_size)
        self.stop_token_ids = frozenset(tokenizer_info.stop_token_ids)

    def compile(self, params: GuidedDecodingParams) -> xgr.CompiledGrammar:
        """With ``params.strict`` (None counts as strict), a JSON schema with a keyword xgrammar
        would not enforce as written is refused with every such keyword and its JSON pointer,
        before and (for its compile warnings) after compiling."""
        spec = grammar_spec(params)
        strict = params.strict is not False
        if strict and spec.kind == "json_schema":
            schema = json.loads(spec.source)
            if gaps := schema_gaps(schema, functools.partial(classify, ref_siblings_apply=ref_siblings_apply(schema))):
                raise InexactSchema(self.name, gaps)
        try:
            compiled, gaps = self._compile_cached(spec)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"{spec.kind}: {compile_error(exc)}") from None
        if strict and gaps:
            raise InexactSchema(self.name, located(json.loads(spec.source), gaps))
        return compiled

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

    def accept_prefix(self, matcher: xgr.GrammarMatcher, token_ids: Sequence[int]) -> int:
        for count, token in enumerate(token_ids):
            if not matcher.accept_token(token):
                return count
        return len(token_ids)

    def rollback(self, matcher: xgr.GrammarMatcher, num_tokens: int) -> None:
        if num_tokens:
            matcher.rollback(num_tokens)

    def cache_info(self) -> functools._CacheInfo:
        """Hits and misses of the spec cache."""
        return self._compile_cached.cache_info()

    def _compile_spec(self, spec: GrammarSpec) -> tuple[xgr.CompiledGrammar, tuple[Gap, ...]]:
        """The compiled grammar and the approximations xgrammar warned of while compiling it. A
        grammar that allows no first token (``a ::= a``, a schema that only refers to itself)
        is refused here: masked with it, every logit would be -inf."""
        compiled, gaps = self._compile_source(spec)
        first = xgr.allocate_token_bitmask(1, self.bitmask.vocab_size)
        xgr.GrammarMatcher(compiled).fill_next_token_bitmask(first)
        if not first.any():
            raise ValueError(f"{spec.kind}: the grammar accepts no output")
        return compiled, gaps

    def _compile_source(self, spec: GrammarSpec) -> tuple[xgr.CompiledGrammar, tuple[Gap, ...]]:
        if spec.kind == "json_schema":
            return self._compile_schema(spec.source)
        if spec.kind == "json_object":
            # the builtin JSON grammar also admits a top-level array; an open object schema does not
            return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False,
                                                     strict_mode=False), ()
        if spec.kind == "regex":
            return self.compiler.compile_regex(spec.source), ()
        return self.compiler.compile_grammar(spec.source), ()

    def _compile_schema(self, source: str) -> tuple[xgr.CompiledGrammar, tuple[Gap, ...]]:
        """The length-bound rewrite first (faster masks, see ``lengths_as_patterns``); when
        xgrammar refuses the rewritten schema, the schema as written."""
        rewritten = json.dumps(lengths_as_patterns(json.loads(source)), ensure_ascii=False)
        if rewritten != source:
            try:
                return self._compile_json(rewritten)
            except RuntimeError:
                pass  # the rewrite is only for speed: the schema as written decides
        return self._compile_json(source)

    def _compile_json(self, text: str) -> tuple[xgr.CompiledGrammar, tuple[Gap, ...]]:
        with converter_warnings() as warned:
            compiled = self.compiler.compile_json_schema(text, any_whitespace=False)
        return compiled, tuple(warned)


def located(schema: Any, gaps: tuple[Gap, ...]) -> list[Gap]:
    """Warned-of gaps at every subschema that holds their keyword (a warning names no place)."""
    found = [Gap(gap.keyword, pointer, gap.level) for gap in gaps for pointer, node in subschemas(schema)
             if gap.keyword in node]
    return found + [gap for gap in gaps if not any(f.keyword == gap.keyword for f in found)]


def compile_error(exc: RuntimeError) -> str:
    """xgrammar's message without its log prefix; never empty (an internal check may say nothing)."""
    message = _LOG_PREFIX.sub("", str(exc)).strip()
    return message or f"xgrammar could not compile it ({str(exc).strip() or type(exc).__name__})"
