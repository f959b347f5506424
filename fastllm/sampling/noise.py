"""Exp(1) noise keyed by (seed, output position, token), for the torch sampler's seeded rows.

Philox-4x32-10 exactly as Triton's ``tl.philox`` and the fastllm-kernels sampler key it (key:
the seed; counter: token, position), so a seeded row races the same noise on either path, and
the token at output position p depends only on the seed, p and the distribution there. That is
what lets a step that verifies drafts draw exactly the tokens a step without them would.
uint32 values are held in int64, with every product split so that none overflows.
"""

from __future__ import annotations

import torch

_MASK = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUNDS = 10


def _mul_high_low(constant: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The high and low 32 bits of ``constant * x`` (both below 2**32), products below 2**49."""
    low = x * (constant & 0xFFFF)
    middle = x * (constant >> 16) + (low >> 16)
    return middle >> 16, ((middle & 0xFFFF) << 16) | (low & 0xFFFF)


def philox_exponential(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[rows, vocab]`` float32 Exp(1) noise; row i keyed by ``seeds[i]`` and ``positions[i]`` (int64).

    The uniform takes 64 bits (Philox's first two words), so it resolves 2**-64 near 0, where
    the race is decided; ``-log(1 - w)`` keeps small ``w`` exact by Kahan's correction, as the
    kernel does."""
    seeds, positions = seeds[:, None], positions[:, None]
    c0 = torch.arange(vocab, device=seeds.device)[None, :]
    c1, c2, c3 = positions & _MASK, (positions >> 32) & _MASK, torch.zeros_like(positions)
    k0, k1 = seeds & _MASK, (seeds >> 32) & _MASK
    for _ in range(_ROUNDS):
        high_b, low_b = _mul_high_low(_ROUND_B, c2)
        high_a, low_a = _mul_high_low(_ROUND_A, c0)
        c0, c1, c2, c3 = high_b ^ c1 ^ k0, low_b, high_a ^ c3 ^ k1, low_a
        k0, k1 = (k0 + _KEY_A) & _MASK, (k1 + _KEY_B) & _MASK
    w = c0.float() * 2.0 ** -32 + c1.float() * 2.0 ** -64
    u = 1.0 - w
    return torch.where(u == 1.0, w, -torch.log(u) * w / (1.0 - u))
