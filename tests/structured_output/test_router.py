"""The ``auto`` router: per request the first backend that is exact, approximations only when the
request allows them, a refusal with every backend's reason, and mixed batches split by backend."""

from __future__ import annotations

import pytest
import torch

from fastllm import registry
from fastllm.sampling_params import GuidedDecodingParams
from fastllm.structured_output.router import BackendRouter


class FakeBackend:
    """Exact for regexes in ``exact``, approximate for those in ``loose``; masks to its own token."""

    def __init__(self, name: str, exact: set[str], loose: set[str] = frozenset(), token: int = 0):
        self.name, self.exact, self.loose, self.token = name, exact, loose, token
        self.accepted: list[tuple[list, list]] = []

    def compile(self, params: GuidedDecodingParams):
        if params.regex in self.exact or (params.strict is False and params.regex in self.loose):
            return (self.name, params.regex)
        raise ValueError(f"{self.name} refuses {params.regex}")

    def new_matcher(self, compiled):
        return [compiled]

    def accept_tokens(self, matchers, token_ids):
        self.accepted.append((matchers, list(token_ids)))
        return [token == 99 for token in token_ids]

    def apply_bitmask(self, logits, matchers):
        for row, matcher in enumerate(matchers):
            if matcher is not None:
                keep = logits[row, self.token].clone()
                logits[row] = float("-inf")
                logits[row, self.token] = keep


def router(*backends) -> BackendRouter:
    return BackendRouter({backend.name: (lambda backend=backend: backend) for backend in backends})


def spec(regex: str, strict=None) -> GuidedDecodingParams:
    return GuidedDecodingParams(regex=regex, strict=strict)


def test_the_first_exact_backend_in_order_wins():
    first, second = FakeBackend("first", {"a"}, loose={"b"}), FakeBackend("second", {"a", "b"})
    auto = router(first, second)
    assert auto.compile(spec("a")).backend is first
    assert auto.compile(spec("b")).backend is second  # first would only approximate it


def test_approximation_only_when_the_request_is_not_strict():
    loose = FakeBackend("loose", set(), loose={"c"})
    auto = router(loose, FakeBackend("other", set()))
    with pytest.raises(ValueError) as info:
        auto.compile(spec("c"))
    assert str(info.value) == "no backend both compiles it and enforces it exactly; loose: loose refuses c | other: other refuses c"
    assert auto.compile(spec("c", strict=False)).backend is loose


def test_a_backend_that_fails_to_build_is_left_out():
    def broken():
        raise RuntimeError("no tokenizer support")

    working = FakeBackend("working", {"a"})
    auto = BackendRouter({"broken": broken, "working": lambda: working})
    assert auto.compile(spec("a")).backend is working
    with pytest.raises(ValueError, match="no structured-output backend"):
        BackendRouter({"broken": broken}).compile(spec("a"))


def test_a_mixed_batch_is_advanced_and_masked_by_each_backend_for_its_rows():
    first, second = FakeBackend("first", {"a"}, token=1), FakeBackend("second", {"b"}, token=2)
    auto = router(first, second)
    rows = [auto.new_matcher(auto.compile(spec(r))) for r in ("a", "b", "a")]
    assert auto.accept_tokens(rows, [5, 99, 99]) == [False, True, True]
    assert first.accepted == [([[("first", "a")]] * 2, [5, 99])]
    assert [tokens for _, tokens in second.accepted] == [[99]]
    logits = torch.zeros(4, 4)
    auto.apply_bitmask(logits, rows[:2] + [None] + rows[2:])
    allowed = [set(torch.nonzero(row != float("-inf")).flatten().tolist()) for row in logits]
    assert allowed == [{1}, {2}, {0, 1, 2, 3}, {1}]


def test_auto_is_registered_by_the_core_and_is_the_default():
    from fastllm.config import EngineConfig

    assert registry.entries("structured_output_backends")["auto"].distribution.startswith("fastllm ")
    assert EngineConfig(model="m").structured_output_backend == "auto"
