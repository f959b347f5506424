"""The LM head in weight-only int8 (``quantize_lm_head=True``, registered as the
``lm_head_quantizers`` plugin ``int8``), whatever the rest of the model uses.

At batch 1 a decode step reads every weight once, and the head is one of its largest reads:
128256 x 4096 on Llama-3, 1 GB in bf16, an eighth of what an 8-bit model reads a token and a
fifth of a 4-bit one. Every token is chosen from its output, so it gets the most faithful
8-bit format rather than the body's (a head in the body's fp8 or int4 costs far more
perplexity than the body does; benchmarks/RESULTS.md). Off by default, as in
vLLM; a head tied to the embedding (SmolLM2) keeps its float weight for the lookup, so there
the int8 copy adds bytes.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from fastllm.layers.embedding import ParallelLMHead
from fastllm.layers.linear import ReplicatedLinear

from fastllm_quant.int8 import WeightOnlyInt8Quantizer


def quantize_lm_head(model: nn.Module) -> None:
    """Give ``model.lm_head`` an int8 twin of its (this rank's) weight; drop the float weight
    unless another module shares it."""
    head = getattr(model, "lm_head", None)
    if not isinstance(head, ParallelLMHead):
        raise ValueError(f"quantize_lm_head: {type(model).__name__} has no ParallelLMHead named lm_head")
    with torch.device("meta"):
        float_head = ReplicatedLinear(head.weight.shape[1], head.weight.shape[0])
    float_head.weight = head.weight
    head.quantized = WeightOnlyInt8Quantizer(None).quantize_layer(float_head)
    tied = any(param is head.weight for module in model.modules() if module is not head
               for param in module.parameters(recurse=False))
    if not tied:
        head.weight = None
