import pytest

from fastllm_kernels.activation import silu_and_mul, silu_and_mul_ref
from kernel_testing import DTYPES, TOLERANCE, randn, rel_err


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,inner", [(7, 1500), (1, 256)])
def test_silu_and_mul_matches_reference(dtype, tokens, inner):
    x = 3 * randn(tokens, 2 * inner, dtype=dtype)

    out = silu_and_mul(x)

    assert out.shape == (tokens, inner) and out.dtype == dtype
    assert rel_err(out, silu_and_mul_ref(x.double())) < TOLERANCE[dtype]
