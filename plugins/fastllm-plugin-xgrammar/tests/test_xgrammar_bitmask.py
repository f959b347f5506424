"""The batched bitmask on a small fake vocabulary: masked rows keep exactly the tokens their
matcher accepts, unguided rows are left bit-for-bit alone."""

from __future__ import annotations

import pytest
import torch
import xgrammar as xgr

from fastllm.sampling_params import GuidedDecodingParams
from fastllm_xgrammar.backend import XGrammarBackend
from fastllm_xgrammar.bitmask import BatchFiller

VOCAB = ["a", "b", "c", "ab", "bc", "{", "}", '"', ":", ",", " ", "1", "2", "</s>"]
STOP = VOCAB.index("</s>")
LOGITS_WIDTH = 48  # wider than the vocabulary, as with padded embeddings


@pytest.fixture(scope="module")
def backend() -> XGrammarBackend:
    info = xgr.TokenizerInfo(VOCAB, vocab_size=LOGITS_WIDTH, stop_token_ids=[STOP])
    return XGrammarBackend(info)


def allowed_reference(matcher: xgr.GrammarMatcher) -> set[int]:
    """The tokens ``matcher`` accepts next, found by trying each one on a fork."""
    return {token for token in range(LOGITS_WIDTH) if matcher.fork().accept_token(token)}


def matchers_at(backend: XGrammarBackend, prefixes: list[str | None]) -> list[xgr.GrammarMatcher | None]:
    """One matcher of the regex ``ab?c(12)*`` per prefix, advanced past it (None: unguided row)."""
    compiled = backend.compile(GuidedDecodingParams(regex="ab?c(12)*"))
    matchers = []
    for prefix in prefixes:
        matcher = None
        if prefix is not None:
            matcher = backend.new_matcher(compiled)
            assert matcher.accept_string(prefix)
        matchers.append(matcher)
    return matchers


def check_masked(before: torch.Tensor, after: torch.Tensor, matchers: list) -> None:
    for row, matcher in enumerate(matchers):
        if matcher is None:
            assert torch.equal(after[row], before[row])
            continue
        kept = set(torch.isfinite(after[row]).nonzero().flatten().tolist())
        assert kept == allowed_reference(matcher)
        assert torch.equal(after[row, sorted(kept)], before[row, sorted(kept)])


def test_guided_rows_keep_exactly_the_allowed_tokens(backend):
    matchers = matchers_at(backend, ["", None, "a", "ab", None, "abc", "ac12"])
    logits = torch.randn(len(matchers), LOGITS_WIDTH, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    backend.apply_bitmask(logits, matchers)
    check_masked(before, logits, matchers)
    assert set(torch.isfinite(logits[0]).nonzero().flatten().tolist()) == {VOCAB.index("a"), VOCAB.index("ab")}


def test_complete_grammar_allows_the_stop_token_then_terminates(backend):
    [matcher] = matchers_at(backend, ["abc"])
    logits = torch.zeros(1, LOGITS_WIDTH)
    backend.apply_bitmask(logits, [matcher])
    assert STOP in torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert not matcher.is_terminated()
    assert matcher.accept_token(STOP)
    assert matcher.is_terminated()


def test_padded_logits_beyond_the_vocabulary_are_masked(backend):
    matchers = matchers_at(backend, [""])
    logits = torch.zeros(1, LOGITS_WIDTH)
    backend.apply_bitmask(logits, matchers)
    assert torch.isinf(logits[0, len(VOCAB):]).all()


def test_batches_larger_than_the_preallocated_mask(backend):
    prefixes = [["", "a", "ab", "abc1"][i % 4] if i % 3 else None for i in range(150)]
    matchers = matchers_at(backend, prefixes)
    logits = torch.randn(len(matchers), LOGITS_WIDTH, generator=torch.Generator().manual_seed(1))
    before = logits.clone()
    backend.apply_bitmask(logits, matchers)
    check_masked(before, logits, matchers)
    assert backend.bitmask.host.shape[0] >= 150


def test_unguided_batch_is_untouched(backend):
    logits = torch.randn(4, LOGITS_WIDTH)
    before = logits.clone()
    backend.apply_bitmask(logits, [None] * 4)
    assert torch.equal(logits, before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_logits_match_the_cpu_result(backend):
    matchers = matchers_at(backend, ["a", None, "abc", "ab", None])
    logits = torch.randn(len(matchers), LOGITS_WIDTH, generator=torch.Generator().manual_seed(2))
    on_cpu, on_gpu = logits.clone(), logits.cuda()
    backend.apply_bitmask(on_cpu, matchers)
    backend.apply_bitmask(on_gpu, matchers)
    assert torch.equal(on_gpu.cpu(), on_cpu)
    check_masked(logits, on_cpu, matchers)


def test_steady_batches_reuse_one_buffer_and_stale_rows_do_not_leak(backend):
    """A row guided last step and unguided now keeps its logits, though its old mask is still there."""
    first = matchers_at(backend, ["", "a", "ab"])
    backend.apply_bitmask(torch.zeros(3, LOGITS_WIDTH), first)
    buffer = backend.bitmask.host.data_ptr()
    second = matchers_at(backend, [None, "abc", None])
    logits = torch.randn(3, LOGITS_WIDTH, generator=torch.Generator().manual_seed(3))
    before = logits.clone()
    backend.apply_bitmask(logits, second)
    check_masked(before, logits, second)
    assert backend.bitmask.host.data_ptr() == buffer


def test_accept_reports_termination_and_the_matcher_that_goes_on_masks_as_before(backend):
    done, going = matchers_at(backend, ["abc", "abc"])
    assert backend.accept_tokens([done, going], [STOP, VOCAB.index("1")]) == [True, False]
    assert done.is_terminated() and not going.is_terminated()
    logits = torch.zeros(1, LOGITS_WIDTH)
    backend.apply_bitmask(logits, [going])
    check_masked(torch.zeros(1, LOGITS_WIDTH), logits, [going])


def test_the_fill_takes_threads_as_its_last_fill_time_asks_and_fills_the_same(backend):
    matchers = matchers_at(backend, ["", "a", "ab", "abc", "ac12", "abc1"] * 4)
    rows = list(range(len(matchers)))
    single = xgr.allocate_token_bitmask(len(matchers), LOGITS_WIDTH)
    xgr.BatchGrammarMatcher(1).batch_fill_next_token_bitmask(matchers, single, rows)
    filler = BatchFiller(max_threads=2, chunk_s=1e-9)  # any fill is worth every thread
    assert filler.threads == 1
    for threads in (2, 2):  # the first fill raised it to the cap, which it keeps
        mask = xgr.allocate_token_bitmask(len(matchers), LOGITS_WIDTH)
        filler.fill(matchers, mask, rows)
        assert filler.threads == threads and torch.equal(mask, single)
    filler.chunk_s = 10.0  # nothing is: back to one thread
    filler.fill(matchers, mask, rows)
    assert filler.threads == 1 and torch.equal(mask, single)
