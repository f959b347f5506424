"""Integer arithmetic for launch grids and block sizes, done on the host as plain Python.

Triton's ``next_power_of_2`` and ``cdiv`` are constexpr functions: called from host code each
goes through a wrapper that costs more than the arithmetic, and an eager step (prefill, mixed,
tensor-parallel) sizes a few hundred launches with them on a CPU that already bounds it.
"""

from __future__ import annotations


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (0 for 0, as Triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
