"""Triton kernels for fastllm; each module pairs a kernel with the plain torch reference it
is tested against."""

from fastllm_kernels.activation import silu_and_mul
from fastllm_kernels.decode_attention import paged_decode_attention
from fastllm_kernels.extend_attention import paged_extend_attention
from fastllm_kernels.fused_moe import fused_experts
from fastllm_kernels.kv_cache import rotary_write_kv_cache, write_kv_cache
from fastllm_kernels.linear import linear
from fastllm_kernels.moe_align import one_pair_a_block
from fastllm_kernels.moe_routing import bfloat16_terms, float32_router_logits, router_topk, topk_softmax
from fastllm_kernels.lora import lora_expand, lora_expand_tokens, lora_shrink, lora_shrink_tokens, lora_tiles
from fastllm_kernels.rms_norm import fused_add_rms_norm, rms_norm
from fastllm_kernels.rotary import rotary_embedding
from fastllm_kernels.sampling import combine_greedy_stats, greedy_stats, logsumexp_argmax, sample_top_k_top_p

__all__ = [
    "bfloat16_terms",
    "combine_greedy_stats",
    "float32_router_logits",
    "fused_add_rms_norm",
    "fused_experts",
    "greedy_stats",
    "linear",
    "logsumexp_argmax",
    "lora_expand",
    "lora_expand_tokens",
    "lora_shrink",
    "lora_shrink_tokens",
    "lora_tiles",
    "one_pair_a_block",
    "paged_decode_attention",
    "paged_extend_attention",
    "rms_norm",
    "rotary_embedding",
    "rotary_write_kv_cache",
    "router_topk",
    "sample_top_k_top_p",
    "silu_and_mul",
    "topk_softmax",
    "write_kv_cache",
]
