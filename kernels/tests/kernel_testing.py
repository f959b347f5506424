"""What the kernel tests share: the device, dtypes and tolerances, and random paged caches."""

from __future__ import annotations

import random

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# The interpreter gets bfloat16 wrong, so bf16 is only tested on a GPU.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere (an unwritten output) gives inf."""
    out, ref = out.double().cpu(), ref.double().cpu()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm()).item()


def randn(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float32, device=DEVICE).to(dtype)


def nan_like(x: torch.Tensor) -> torch.Tensor:
    """An output buffer that shows every element the kernel fails to write."""
    return torch.full_like(x, float("nan"))


def paged_kv(seq_lens: list[int], block_size: int, num_kv_heads: int, head_dim: int,
             dtype: torch.dtype, spare_blocks: int = 3) -> tuple[torch.Tensor, ...]:
    """Random caches (spare blocks hold garbage too) and shuffled block tables padded with 0,
    which is another sequence's block: reading past a table's end shows up as a wrong answer."""
    needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needed) + spare_blocks
    k_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    v_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    ids = list(range(num_blocks))
    random.shuffle(ids)
    block_tables = torch.zeros(len(seq_lens), max(needed) + 1, dtype=torch.int32)
    for row, n in enumerate(needed):
        block_tables[row, :n] = torch.tensor(ids[:n], dtype=torch.int32)
        ids = ids[n:]
    return k_cache, v_cache, block_tables.to(DEVICE)


def fp8_per_channel(w):
    """e4m3 weights and float32 scales ``[E, rows]``: each row's absmax at the format's top."""
    scale = (w.float().abs().amax(dim=-1) / torch.finfo(torch.float8_e4m3fn).max).clamp(min=1e-12)
    return (w.float() / scale[..., None]).to(torch.float8_e4m3fn), scale


def four_bit(w, group, book=None):
    """Codes two a byte (even input low), float32 scales ``[E, rows, K / group]`` and zeros (int4:
    the group's min at code 0, its max at 15), or nf4 codes of ``book`` by absmax (zeros None);
    with the weights they stand for, in float64."""
    groups = w.double().unflatten(-1, (-1, group))
    if book is None:
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp(min=1e-8)
        zero = -low / scale
        codes = (groups / scale[..., None] + zero[..., None]).round().clamp(0, 15)
        values = (codes - zero[..., None]) * scale[..., None]
    else:
        scale = groups.abs().amax(-1)
        codes = (groups / scale[..., None])[..., None].sub(book.double()).abs().argmin(-1).double()
        values = book.double()[codes.long()] * scale[..., None]
        zero = None
    codes = codes.flatten(-2).to(torch.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, scale.float(), None if zero is None else zero.float(), values.flatten(-2)
