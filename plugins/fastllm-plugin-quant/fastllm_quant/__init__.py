"""Quantization methods for fastllm: int8, fp8, nf4, int4 online; AWQ, GPTQ and SmoothQuant checkpoints."""
