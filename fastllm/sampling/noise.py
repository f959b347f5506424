"""Exp(1) noise keyed by (seed, output position, token), for the torch sampler's seeded rows.

Philox-4x32-10 exactly as Triton's ``tl.philox`` and the fastllm-kernels sampler key it (key:
the seed; counter: token, position), so a seeded row races the same noise on either path, and
the token at output position p depends only on the seed, p and the distribution there. That is
what lets a step that verifies drafts draw exactly the tokens a step without them would.
uint32 values are held in int64; a product of two of them wraps modulo 2**64 (torch's integer
multiply wraps on every backend), and its high word is masked back to 32 bits after the shift.
"""

from __future__ import annotations

import torch

_MASK = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUNDS = 10


def philox_exponential(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[rows, vocab]`` float32 Exp(1) noise; row i keyed by ``seeds[i]`` and ``positions[i]`` (int64).

    The uniform takes 64 bits (Philox's first two words), so it resolves 2**-64 near 0, where
    the race is decided; ``-log(1 - w)`` keeps small ``w`` exact by Kahan's correction, as the
    kernel does. The counters are full-size from the start, so every round works in place."""
    shape = (seeds.shape[0], vocab)
    seeds, positions = seeds[:, None], positions[:, None]
    c0 = torch.arange(vocab, device=seeds.device).expand(shape).clone()
    c1 = (positions & _MASK).expand(shape).clone()
    c2 = ((positions >> 32) & _MASK).expand(shape).clone()
    c3 = torch.zeros(shape, dtype=torch.int64, device=seeds.device)
    k0, k1 = seeds & _MASK, (seeds >> 32) & _MASK
    for _ in range(_ROUNDS):
        product_b, product_a = c2.mul_(_ROUND_B), c0.mul_(_ROUND_A)
        high_b = (product_b >> 32).bitwise_xor_(c1).bitwise_xor_(k0).bitwise_and_(_MASK)
        high_a = (product_a >> 32).bitwise_xor_(c3).bitwise_xor_(k1).bitwise_and_(_MASK)
        c0, c1, c2, c3 = high_b, product_b.bitwise_and_(_MASK), high_a, product_a.bitwise_and_(_MASK)
        k0, k1 = (k0 + _KEY_A) & _MASK, (k1 + _KEY_B) & _MASK
    w = c0.float() * 2.0 ** -32 + c1.float() * 2.0 ** -64
    u = 1.0 - w
    return torch.where(u == 1.0, w, -torch.log(u) * w / (1.0 - u))
