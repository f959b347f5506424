"""The reference attention backend: plain torch, correct on any device; others are tested against it."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from fastllm.attention.metadata import AttentionMetadata
from fastllm.platforms.interface import Platform


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter this step's keys and values into their slots; negative slots are padding."""
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    for x, cache in ((key, k_cache), (value, v_cache)):
        x = x.to(cache.dtype) if not _is_fp8(cache) else _saturate(x, cache.dtype)
        _bytes_if_fp8(cache.view(-1, *cache.shape[2:])).index_copy_(0, slot_mapping, _bytes_if_fp8(x))


def gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """``cache[blocks]`` for any cache dtype (fp8 blocks are gathered as bytes).

    ``index_select`` on the flattened ids: about twice as fast on CPU as advanced indexing.
    """
    rows = _bytes_if_fp8(cache).index_select(0, blocks.flatten())
    return rows.view(*blocks.shape, *cache.shape[1:]).view(cache.dtype)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of one sequence as ``[length, KVH, D]``."""
    num_blocks = -(-length // cache.shape[1])
    return gather_blocks(cache, block_table[:num_blocks].long()).flatten(0, 1)[:length]


# fp8 caches (kv_cache_dtype="fp8*"): values are stored unscaled, clamped to the format's range
# (a plain cast overflows to NaN on some devices); index kernels lack fp8, so fp8 moves as bytes.
def _is_fp8(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def _saturate(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    limit = torch.finfo(dtype).max
    return x.clamp(-limit, limit).to(dtype)


def _bytes_if_fp8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if _is_fp8(t) else t


class TorchAttentionBackend:
    name = "torch"

    def __init__(self, platform: Platform | None = None) -> None:
        """Plain torch runs on any platform: it asks the platform nothing."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(query)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(query[:nd], k_cache, v_cache, meta, scale)
        start = nd
        for i in range(nd, meta.num_seqs):
            qlen, kvlen = meta.query_lens_cpu[i], meta.seq_lens_cpu[i]
            q = query[start:start + qlen].transpose(0, 1)[None]
            k = gather_kv(k_cache, meta.block_tables[i], kvlen).transpose(0, 1)[None].to(q.dtype)
            v = gather_kv(v_cache, meta.block_tables[i], kvlen).transpose(0, 1)[None].to(q.dtype)
            mask = None if qlen == kvlen else _causal_mask(qlen, kvlen, q.device)
            o = _attention(q, k, v, mask, scale)
            out[start:start + qlen] = o[0].transpose(0, 1)
            start += qlen
        return out

    @staticmethod
    def _decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """All single-token queries at once: gather padded K/V and mask past each length."""
        nd = query.shape[0]
        max_len = max(meta.seq_lens_cpu[:nd])
        block_size = k_cache.shape[1]
        tables = meta.block_tables[:nd, : -(-max_len // block_size)].long()
        k = gather_blocks(k_cache, tables).flatten(1, 2)[:, :max_len].transpose(1, 2).to(query.dtype)
        v = gather_blocks(v_cache, tables).flatten(1, 2)[:, :max_len].transpose(1, 2).to(query.dtype)
        lens = meta.seq_lens[:nd].to(query.device)
        mask = torch.arange(max_len, device=query.device)[None, :] < lens[:, None]
        return _attention(query.unsqueeze(2), k, v, mask[:, None, None, :], scale).squeeze(2)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               scale: float) -> torch.Tensor:
    """SDPA in float32 whatever the activations' dtype, rounded once at the end; ``q [B, H, Lq, D]``
    (four dimensions, or torch takes its unfused math path: several times slower on CPU), ``mask``
    None for a square causal one.

    In bf16 torch's math path rounds the scores to bf16 before the softmax; the Triton kernels
    keep them in fp32. The reference should be the most exact of the two, so a backend
    compared against it is judged by its own rounding, not by the reference's."""
    dtype = q.dtype
    if dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale,
                                       enable_gqa=q.shape[-3] != k.shape[-3])
    return o.to(dtype)


def _causal_mask(query_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """Query i sits at position kv_len - query_len + i and sees keys up to there."""
    q_pos = torch.arange(kv_len - query_len, kv_len, device=device)[:, None]
    return torch.arange(kv_len, device=device)[None, :] <= q_pos
