"""The triton backend against the torch reference: packed batches, then whole greedy runs.

On CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1
before anything imports triton).
"""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from fastllm import LLM, SamplingParams
from fastllm.attention.metadata import AttentionMetadata
from fastllm.attention.torch_backend import TorchAttentionBackend
from fastllm.attention.triton_backend import TritonAttentionBackend
from fastllm.engine.llm_engine import select_platform
from fastllm.layers.rotary import RotaryEmbedding, Rotation

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PLATFORM = select_platform(None)  # the device's: it says whether Triton stores fp8 exactly
HEADS, KV_HEADS, DIM = 8, 2, 32  # GQA 4:1
SCALE = DIM ** -0.5


def _batch(query_lens: list[int], seq_lens: list[int], block_size: int, dtype: torch.dtype,
           cache_dtype: torch.dtype | None = None):
    """Random q/k/v and caches (earlier tokens' K/V already there), each sequence in its own blocks."""
    tables, next_block = [], 1
    for n in seq_lens:
        count = -(-n // block_size)
        tables.append(list(range(next_block, next_block + count)))
        next_block += count
    width = max(map(len, tables))
    slots = [tables[i][p // block_size] * block_size + p % block_size
             for i, (q, n) in enumerate(zip(query_lens, seq_lens)) for p in range(n - q, n)]
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)

    def tensor(values, kind):
        return torch.tensor(values, dtype=kind, device=DEVICE)

    meta = AttentionMetadata(
        slot_mapping=tensor(slots, torch.int64), query_start_loc=tensor(starts, torch.int32),
        seq_lens=tensor(seq_lens, torch.int32),
        block_tables=tensor([t + [0] * (width - len(t)) for t in tables], torch.int32),
        num_decodes=sum(q == 1 for q in query_lens), max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), query_lens_cpu=query_lens, seq_lens_cpu=seq_lens)
    cache_shape = (next_block, block_size, KV_HEADS, DIM)
    caches = [torch.randn(cache_shape, device=DEVICE).to(cache_dtype or dtype) for _ in range(2)]
    qkv = [torch.randn(sum(query_lens), h, DIM, dtype=dtype, device=DEVICE) for h in (HEADS, KV_HEADS, KV_HEADS)]
    return qkv, caches, meta


def _both(qkv, caches, meta):
    """(triton output, torch output), each backend on its own copy of the caches; the caches must match."""
    ref_caches = [c.clone() for c in caches]
    expected = TorchAttentionBackend().forward(*qkv, *ref_caches, meta, SCALE)
    got = TritonAttentionBackend(PLATFORM).forward(*qkv, *caches, meta, SCALE)
    for cache, ref in zip(caches, ref_caches):
        assert torch.equal(cache.view(torch.uint8), ref.view(torch.uint8))
    return got, expected


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# 3 decodes (contexts 1, 37, 130), then 2 extends over cached prefixes (5 on 20, 9 on 70).
MIXED = {"query_lens": [1, 1, 1, 5, 9], "seq_lens": [1, 37, 130, 25, 79]}


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-3), (torch.float16, 1e-2)])
def test_mixed_batch_matches_torch(block_size, dtype, tol):
    torch.manual_seed(block_size)
    got, expected = _both(*_batch(**MIXED, block_size=block_size, dtype=dtype))
    assert _rel_err(got, expected) < tol


def test_prefill_only_batch_matches_torch():
    torch.manual_seed(1)
    got, expected = _both(*_batch([5, 9], [25, 9], block_size=16, dtype=torch.float32))
    assert _rel_err(got, expected) < 1e-3


def test_padded_decode_rows_change_nothing():
    """A CUDA-graph batch: 2 real decodes padded to 4 (slot -1, seq_len 1, empty table) with the
    capture-time host fields (every sequence at max_model_len), which the decode path must ignore."""
    torch.manual_seed(2)
    (q, k, v), caches, meta = _batch([1, 1], [37, 130], block_size=16, dtype=torch.float32)
    expected = TorchAttentionBackend().forward(q, k, v, *[c.clone() for c in caches], meta, SCALE)
    before = [c.clone() for c in caches]
    pad = torch.randn(2, HEADS, DIM, device=DEVICE)
    padded = AttentionMetadata(
        slot_mapping=torch.cat([meta.slot_mapping, meta.slot_mapping.new_full((2,), -1)]),
        query_start_loc=torch.arange(5, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.cat([meta.seq_lens, meta.seq_lens.new_ones(2)]),
        block_tables=torch.cat([meta.block_tables, torch.zeros_like(meta.block_tables)]),
        num_decodes=4, max_query_len=1, max_seq_len=512, query_lens_cpu=[1] * 4, seq_lens_cpu=[512] * 4)

    got = TritonAttentionBackend(PLATFORM).forward(torch.cat([q, pad]), torch.cat([k, k]), torch.cat([v, v]),
                                           *caches, padded, SCALE)

    assert _rel_err(got[:2], expected) < 1e-3 and torch.isfinite(got).all()
    written = meta.slot_mapping.tolist()
    for cache, old in zip(caches, before):  # only the real rows' slots changed
        flat, old_flat = cache.view(-1, KV_HEADS, DIM), old.view(-1, KV_HEADS, DIM)
        keep = torch.ones(flat.shape[0], dtype=torch.bool)
        keep[written] = False
        assert torch.equal(flat[keep.to(DEVICE)], old_flat[keep.to(DEVICE)])


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-3), (torch.float16, 1e-2)])
def test_fp8_cache_matches_torch(cache_dtype, dtype, tol, caplog):
    """Unscaled fp8 stores (byte-identical to torch's; saturation is tested with the kernel), read
    back by the kernels. Off CUDA the stores fall back to torch (the interpreter rounds fp8
    inexactly), with one warning."""
    torch.manual_seed(3)
    qkv, caches, meta = _batch(**MIXED, block_size=16, dtype=dtype, cache_dtype=cache_dtype)
    backend, ref_caches = TritonAttentionBackend(PLATFORM), [c.clone() for c in caches]
    expected = TorchAttentionBackend().forward(*qkv, *ref_caches, meta, SCALE)
    with caplog.at_level(logging.WARNING, logger="fastllm.attention.triton_backend"):
        got = backend.forward(*qkv, *caches, meta, SCALE)
        backend.forward(*qkv, *caches, meta, SCALE)
    for cache, ref in zip(caches, ref_caches):
        assert torch.equal(cache.view(torch.uint8), ref.view(torch.uint8))
    assert _rel_err(got, expected) < tol
    assert len(caplog.records) == (0 if DEVICE == "cuda" else 1)


@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn])
def test_rotation_fused_into_the_cache_write(cache_dtype):
    """Handed the step's rotation, the backend rotates q and k in place as it writes the cache
    (one kernel; off CUDA an fp8 cache is written by torch): the same as rotating first."""
    torch.manual_seed(5)
    (q, k, v), caches, meta = _batch(**MIXED, block_size=16, dtype=torch.float32, cache_dtype=cache_dtype)
    rotary = RotaryEmbedding(DIM, 256, 10000.0).to(DEVICE)
    positions = torch.tensor([0, 36, 129, *range(20, 25), *range(70, 79)], device=DEVICE)
    q_ref, k_ref = rotary(positions, q.clone(), k.clone())
    ref_caches = [c.clone() for c in caches]
    expected = TorchAttentionBackend().forward(q_ref, k_ref, v, *ref_caches, meta, SCALE)

    got = TritonAttentionBackend(PLATFORM).forward(q, k, v, *caches, meta, SCALE, rotation=Rotation(positions, rotary))

    assert torch.allclose(q, q_ref, atol=1e-5) and torch.allclose(k, k_ref, atol=1e-5)
    tol = 1e-5 if cache_dtype is None else 0.07  # an fp8 step where fp32 rounding differs
    for cache, ref in zip(caches, ref_caches):
        assert torch.allclose(cache.float(), ref.float(), rtol=tol, atol=1e-5)
    assert _rel_err(got, expected) < (1e-4 if cache_dtype is None else 1e-2)


def test_missing_kernels_name_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastllm_kernels", None)
    with pytest.raises(ImportError, match="pip install -e kernels"):
        TritonAttentionBackend(PLATFORM)


def test_greedy_output_equals_torch_backend(tiny_llama_dir):
    """Chunked prefill (24-token budget) and prefix-cache hits (a shared 40-token prefix) included."""
    shared = list(range(10, 50))
    prompts = [{"prompt_token_ids": shared + tail} for tail in ([7, 8, 9], [60] * 17, [3])]
    prompts.append({"prompt_token_ids": [5, 6]})
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

    def greedy(backend: str) -> list[list[int]]:
        llm = LLM(tiny_llama_dir, load_format="dummy", dtype="float32", attention_backend=backend,
                  block_size=16, max_model_len=128, max_num_batched_tokens=24, num_gpu_blocks_override=32,
                  enable_prefix_caching=True, seed=0)
        first = llm.generate(prompts[:1], params, use_tqdm=False)  # fills the prefix cache
        rest = llm.generate(prompts[1:], params, use_tqdm=False)
        assert [o.num_cached_tokens for o in rest] == [32, 32, 0]
        return [o.outputs.token_ids for o in first + rest]

    assert greedy("triton") == greedy("torch")
