"""The sampler's Exp(1) noise recomputed with NumPy (Philox-4x32-10, as Triton's
``tl.philox``), so a test can predict every token the kernel draws."""

from __future__ import annotations

import numpy as np

_MASK = np.uint64(0xFFFFFFFF)
_ROUND_A, _ROUND_B = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_KEY_A, _KEY_B = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)


def _philox(seed: int, c0: np.ndarray, c1: np.ndarray, c2: np.ndarray,
            c3: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First two outputs; uint32 values held in uint64 so products do not overflow."""
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)
    for _ in range(10):
        c0, c1, c2, c3 = (((_ROUND_B * c2) >> np.uint64(32)) ^ c1 ^ k0, (_ROUND_B * c2) & _MASK,
                          ((_ROUND_A * c0) >> np.uint64(32)) ^ c3 ^ k1, (_ROUND_A * c0) & _MASK)
        k0, k1 = (k0 + _KEY_A) & _MASK, (k1 + _KEY_B) & _MASK
    return c0, c1


def exponential_noise(seed: int, offsets: int | np.ndarray, vocab: int) -> np.ndarray:
    """E ~ Exp(1) for tokens ``0..vocab-1`` of a row with this seed, per offset: ``[vocab]``
    for one offset, ``[len(offsets), vocab]`` for an array (float64)."""
    offsets = np.asarray(offsets, dtype=np.uint64)[..., None]
    tokens = np.arange(vocab, dtype=np.uint64) + offsets * np.uint64(0)
    zeros = np.zeros_like(tokens)
    r0, r1 = _philox(seed, tokens, zeros + (offsets & _MASK), zeros + (offsets >> np.uint64(32)), zeros)
    w = r0.astype(np.float32) * np.float32(2.0 ** -32) + r1.astype(np.float32) * np.float32(2.0 ** -64)
    return -np.log1p(-w.astype(np.float64))
