"""Quantization's place in the core: the ``Quantizer`` contract and helpers that know no method.

Concrete methods (int8, fp8, nf4, int4, AWQ, GPTQ, SmoothQuant) live in plugins that register
``Quantizer`` subclasses through the ``register_quantizers`` hook.
"""

from fastllm.quantization.interface import Calibration, PromptRunner, Quantizer
from fastllm.quantization.linear import CheckpointLayoutError, LinearSpec, QuantizedLinear, replace_linear_layers
from fastllm.quantization.loading import build_quantizer, checkpoint_quantization, load_weights, weight_bytes

__all__ = [
    "Calibration", "CheckpointLayoutError", "LinearSpec", "PromptRunner", "QuantizedLinear", "Quantizer",
    "build_quantizer",
    "checkpoint_quantization", "load_weights", "replace_linear_layers", "weight_bytes",
]
