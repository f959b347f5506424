"""Every online method passes the conformance kit's round trip at the bound its format allows."""

from __future__ import annotations

import pytest

from fastllm.testing.quantizers import assert_quantized_linear_close

# Relative output error bounds: int8 keeps ~8 bits per weight, fp8 e4m3 a 3-bit mantissa, the
# 4-bit formats 16 levels per group.
BOUNDS = {"weight_only_int8": 0.01, "ifq": 0.01, "fp8": 0.05, "nf4": 0.11, "ifq_nf4": 0.11,
          "weight_only_int4": 0.11}


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_quantized_linear_computes_the_float_linear(name):
    assert_quantized_linear_close(name, BOUNDS[name])
