"""The CUDA default: fastllm-kernels' paged attention, one decode and one extend launch a step.

The decode path reads only device tensors and launches grids fixed by their shapes (no host
lists, no ``.item()``), so a pure-decode step can be captured into a CUDA graph. Padded graph
rows (slot -1, seq_len 1, block table of zeros) write nothing and attend to one junk key.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from fastllm.attention.metadata import AttentionMetadata
from fastllm.attention.torch_backend import write_kv_cache as torch_write_kv_cache
from fastllm.layers.rotary import Rotation
from fastllm.platforms.interface import Platform

logger = logging.getLogger(__name__)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


class TritonAttentionBackend:
    name = "triton"
    cuda_graph_safe = True
    fuses_rotation = True  # rotary embedding and cache write in one launch
    fuses_head_norms = True  # with the query and key head norms before it

    def __init__(self, platform: Platform) -> None:
        try:
            import fastllm_kernels
        except ImportError as exc:
            raise ImportError("the triton attention backend needs fastllm-kernels: run "
                              "`pip install -e kernels` (or use attention_backend='torch')") from exc
        self.kernels = fastllm_kernels
        self.kernels_store_fp8 = platform.triton_rounds_fp8_exactly
        self._warned_fp8_store = False

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, rotation: Optional[Rotation] = None) -> torch.Tensor:
        self._write(query, key, value, k_cache, v_cache, meta.slot_mapping, rotation)
        out = torch.empty_like(query)
        nd = meta.num_decodes
        if nd:
            block_tables, seq_lens = meta.decode_rows
            self.kernels.paged_decode_attention(query[:nd], k_cache, v_cache, block_tables, seq_lens, scale,
                                                out=out[:nd])
        if nd < meta.num_seqs:
            block_tables, query_start_loc, seq_lens = meta.extend_rows
            self.kernels.paged_extend_attention(query[nd:], k_cache, v_cache, block_tables, query_start_loc,
                                                seq_lens, meta.max_query_len, scale, out=out[nd:])
        return out

    def _write(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, slot_mapping: torch.Tensor, rotation: Optional[Rotation]) -> None:
        """``rotation`` of query and key (in place), then the kernel's store of key and value; fp8
        stores with torch where the platform's Triton rounds fp8 wrongly (the CPU interpreter)."""
        if self.kernels_store_fp8 or k_cache.dtype not in FP8_DTYPES:
            if rotation is None:
                self.kernels.write_kv_cache(key, value, k_cache, v_cache, slot_mapping)
            else:
                self.kernels.rotary_write_kv_cache(rotation.positions, query, key, value,
                                                   rotation.rotary.cos_sin_cache, k_cache, v_cache, slot_mapping,
                                                   norms=rotation.norm_weights)
            return
        if rotation is not None:
            query[...], key[...] = rotation(query, key)  # in place, as the kernels rotate
        if not self._warned_fp8_store:
            logger.warning("fp8 KV cache: the triton backend stores K/V with torch here "
                           "(this platform's Triton rounds fp8 inexactly)")
            self._warned_fp8_store = True
        torch_write_kv_cache(key, value, k_cache, v_cache, slot_mapping)
