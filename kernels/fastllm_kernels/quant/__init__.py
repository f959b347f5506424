"""Dequantize-GEMM kernels for quantized linear layers, each beside its torch reference.

``*_linear`` picks the fused Triton kernel for decode-sized batches on the GPU and the torch
path (dequantize, then matmul) for CPU tensors and large batches.
"""

from fastllm_kernels.quant.fp8_gemm import fp8_linear, quantize_fp8_rows
from fastllm_kernels.quant.int4_gemm import (
    NF4_CODES, dequantize_int4, dequantize_nf4, int4_linear, nf4_linear, pack_int4, unpack_int4,
)
from fastllm_kernels.quant.int8_gemm import int8_linear

__all__ = [
    "NF4_CODES", "dequantize_int4", "dequantize_nf4", "fp8_linear", "int4_linear", "int8_linear", "nf4_linear",
    "pack_int4", "quantize_fp8_rows", "unpack_int4",
]
