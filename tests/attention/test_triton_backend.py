"""The triton backend against the torch reference: one mixed batch, then whole greedy runs.

On CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1).
"""

from __future__ import annotations

import pytest
import torch

from fastllm import LLM, SamplingParams
from fastllm.attention.metadata import AttentionMetadata
from fastllm.attention.torch_backend import TorchAttentionBackend
from fastllm.attention.triton_backend import TritonAttentionBackend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _mixed_batch(block_size: int, heads: int, kv_heads: int, dim: int, dtype: torch.dtype):
    """3 decodes (contexts 1, 37, 130), then 2 extends (5 new on 20 cached, a 9-token prompt)."""
    query_lens, seq_lens = [1, 1, 1, 5, 9], [1, 37, 130, 25, 9]
    tables, next_block = [], 1
    for n in seq_lens:
        count = -(-n // block_size)
        tables.append(list(range(next_block, next_block + count)))
        next_block += count
    width = max(map(len, tables))
    slots = [tables[i][p // block_size] * block_size + p % block_size
             for i, (q, n) in enumerate(zip(query_lens, seq_lens)) for p in range(n - q, n)]
    tokens = sum(query_lens)
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)

    def tensor(values, kind):
        return torch.tensor(values, dtype=kind, device=DEVICE)

    meta = AttentionMetadata(
        slot_mapping=tensor(slots, torch.int64), query_start_loc=tensor(starts, torch.int32),
        seq_lens=tensor(seq_lens, torch.int32),
        block_tables=tensor([t + [0] * (width - len(t)) for t in tables], torch.int32),
        num_decodes=3, max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        query_lens_cpu=query_lens, seq_lens_cpu=seq_lens)
    cache_shape = (next_block, block_size, kv_heads, dim)
    k_cache = torch.randn(cache_shape, dtype=dtype, device=DEVICE)  # earlier tokens' K/V
    v_cache = torch.randn(cache_shape, dtype=dtype, device=DEVICE)
    qkv = [torch.randn(tokens, h, dim, dtype=dtype, device=DEVICE) for h in (heads, kv_heads, kv_heads)]
    return qkv, k_cache, v_cache, meta


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-3), (torch.float16, 1e-2)])
def test_mixed_batch_matches_torch(block_size, dtype, tol):
    torch.manual_seed(block_size)
    (q, k, v), k_cache, v_cache, meta = _mixed_batch(block_size, 8, 2, 32, dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    expected = TorchAttentionBackend().forward(q, k, v, k_ref, v_ref, meta, 32 ** -0.5)
    got = TritonAttentionBackend().forward(q, k, v, k_cache, v_cache, meta, 32 ** -0.5)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    assert _rel_err(got, expected) < tol


def test_greedy_output_equals_torch_backend(tiny_llama_dir):
    """Chunked prefill (budget 24) and prefix-cache hits (a shared 40-token prefix) included."""
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
        assert rest[0].num_cached_tokens > 0
        return [o.outputs.token_ids for o in first + rest]

    assert greedy("triton") == greedy("torch")
