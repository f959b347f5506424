"""Quantizer conformance: a quantized layer computes what its float layer computes, within a bound."""

from __future__ import annotations

import torch

from fastllm import registry
from fastllm.layers.linear import ReplicatedLinear


def assert_quantized_linear_close(name: str, rel_tol: float, in_features: int = 256,
                                  out_features: int = 128, num_tokens: int = 8, seed: int = 0) -> float:
    """Quantize a random float32 ``ReplicatedLinear`` online with the ``quantizers`` entry ``name``
    and check ``||q(x) - f(x)|| <= rel_tol * ||f(x)||`` on random inputs; return the relative error.

    Sizes are multiples of 128 so group-wise methods fit; a method whose error is not below the
    bound it advertises fails here before it reaches a model.
    """
    gen = torch.Generator().manual_seed(seed)
    layer = ReplicatedLinear(in_features, out_features).to(torch.float32)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_features, in_features, generator=gen) / in_features ** 0.5)
    x = torch.randn(num_tokens, in_features, generator=gen)
    with torch.no_grad():
        expected = layer(x)
        quantized = registry.get("quantizers", name)(None).quantize_layer(layer)
        actual = quantized(x).to(torch.float32)
    assert actual.shape == expected.shape, f"{name}: output shape {actual.shape} != {expected.shape}"
    error = float((actual - expected).norm() / expected.norm())
    assert error <= rel_tol, f"{name}: relative error {error:.4f} over the bound {rel_tol}"
    return error
