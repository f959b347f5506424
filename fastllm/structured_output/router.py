"""``auto``: every other registered structured-output backend behind one, chosen per request.

A request goes to the first backend, in the order of their factories' ``preference`` (lower
first), that enforces its spec exactly; a request that is not strict and that no backend enforces exactly goes to the
first that compiles it at all; otherwise it is refused with every backend's reason. The router
names no backend: it builds whatever the registry holds, each on its first use (building one
can take seconds: a tokenizer's vocabulary is indexed).
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from fastllm import registry
from fastllm.sampling_params import GuidedDecodingParams
from fastllm.structured_output.interface import CompiledGrammar, GrammarMatcher, StructuredOutputBackend

logger = logging.getLogger("fastllm")


@dataclass(frozen=True)
class RoutedGrammar:
    backend: StructuredOutputBackend
    compiled: CompiledGrammar


@dataclass(frozen=True)
class RoutedMatcher:
    backend: StructuredOutputBackend
    matcher: GrammarMatcher


class BackendRouter:
    """Follows ``StructuredOutputBackend``; its matchers remember which backend made them, so a
    batch of mixed rows is advanced and masked by each backend for its own rows."""

    name = "auto"

    def __init__(self, factories: dict[str, Callable[[], StructuredOutputBackend]]):
        """``factories``: name -> backend builder, in the order to try them."""
        self._factories = factories
        self._built: dict[str, Optional[StructuredOutputBackend]] = {}
        self._building = threading.Lock()  # compiles may run on several threads

    def backends(self) -> Iterator[tuple[str, StructuredOutputBackend]]:
        """Each backend in preference order, built now if not yet; one that fails to build is
        left out from then on, with a warning."""
        for name, factory in self._factories.items():
            with self._building:
                if name not in self._built:
                    try:
                        self._built[name] = factory()
                    except Exception as exc:  # a plugin's own failure must not take the engine down
                        logger.warning("structured-output backend %r is unavailable: %s", name, exc)
                        self._built[name] = None
            if self._built[name] is not None:
                yield name, self._built[name]

    def compile(self, params: GuidedDecodingParams) -> RoutedGrammar:
        refusals: list[str] = []
        for strict in (True, False) if params.strict is False else (True,):
            for name, backend in self.backends():
                try:
                    return RoutedGrammar(backend, backend.compile(params.model_copy(update={"strict": strict})))
                except ValueError as exc:
                    if strict:
                        refusals.append(f"{name}: {exc}")
        if not refusals:
            raise ValueError("no structured-output backend plugin is installed")
        raise ValueError("no backend both compiles it and enforces it exactly; " + " | ".join(refusals))

    def _live(self) -> list[StructuredOutputBackend]:
        return [backend for backend in self._built.values() if backend is not None]

    def new_matcher(self, compiled: RoutedGrammar) -> RoutedMatcher:
        return RoutedMatcher(compiled.backend, compiled.backend.new_matcher(compiled.compiled))

    def accept_tokens(self, matchers: Sequence[RoutedMatcher], token_ids: Sequence[int]) -> list[bool]:
        terminated = [False] * len(matchers)
        for backend in self._live():
            rows = [i for i, routed in enumerate(matchers) if routed.backend is backend]
            if rows:
                done = backend.accept_tokens([matchers[i].matcher for i in rows], [token_ids[i] for i in rows])
                for i, flag in zip(rows, done):
                    terminated[i] = flag
        return terminated

    def apply_bitmask(self, logits: torch.Tensor, matchers: Sequence[Optional[RoutedMatcher]]) -> None:
        for backend in self._live():
            own = [routed.matcher if routed is not None and routed.backend is backend else None
                   for routed in matchers]
            if any(matcher is not None for matcher in own):
                backend.apply_bitmask(logits, own)

    def accept_prefix(self, matcher: RoutedMatcher, token_ids: Sequence[int]) -> int:
        return matcher.backend.accept_prefix(matcher.matcher, token_ids)

    def rollback(self, matcher: RoutedMatcher, num_tokens: int) -> None:
        matcher.backend.rollback(matcher.matcher, num_tokens)


def auto_backend(tokenizer: Any, vocab_size: int) -> BackendRouter:
    """The engine's factory call: a router over every other registered backend."""
    entries = sorted((entry for entry in registry.entries("structured_output_backends").values()
                      if entry.factory is not auto_backend),
                     key=lambda entry: getattr(entry.factory, "preference", 100))
    return BackendRouter({entry.name: functools.partial(entry.factory, tokenizer, vocab_size) for entry in entries})
