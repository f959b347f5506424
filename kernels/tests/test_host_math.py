"""The host's grid arithmetic equals Triton's constexpr functions it stands in for."""

import triton

from fastllm_kernels.host_math import cdiv, next_power_of_2


def test_next_power_of_2_equals_tritons():
    for n in list(range(0, 5000)) + [2**20 - 1, 2**20, 2**20 + 1, 128256, 151936]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n


def test_cdiv_equals_tritons():
    for a in list(range(0, 300)) + [40960, 131072 + 5]:
        for b in (1, 3, 16, 64, 100, 4096):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
