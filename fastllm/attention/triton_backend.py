"""The CUDA default: fastllm-kernels' paged attention, one decode launch and one extend launch a step.

The decode path reads only tensors whose shapes are fixed by the batch size, so a decode step
can be captured into a CUDA graph (``cuda_graph_safe``).
"""

from __future__ import annotations

import torch

from fastllm.attention.metadata import AttentionMetadata
from fastllm.attention.torch_backend import TorchAttentionBackend


class TritonAttentionBackend:
    name = "triton"
    cuda_graph_safe = True

    def __init__(self) -> None:
        try:
            import fastllm_kernels
        except ImportError as exc:
            raise ImportError("the triton attention backend needs fastllm-kernels: "
                              "pip install -e kernels (or attention_backend='torch')") from exc
        self.kernels = fastllm_kernels
        self.fp8_fallback = TorchAttentionBackend()  # the kernels read 16/32-bit caches only

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        if k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            return self.fp8_fallback.forward(query, key, value, k_cache, v_cache, meta, scale)
        kernels = self.kernels
        kernels.write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(query)
        nd = meta.num_decodes
        if nd:
            kernels.paged_decode_attention(query[:nd], k_cache, v_cache, meta.block_tables[:nd],
                                           meta.seq_lens[:nd], scale, out=out[:nd])
        if nd < meta.num_seqs:
            first = meta.query_start_loc[nd:] - nd  # decodes hold one token each
            kernels.paged_extend_attention(query[nd:], k_cache, v_cache, meta.block_tables[nd:], first,
                                           meta.seq_lens[nd:], meta.max_query_len, scale, out=out[nd:])
        return out
