"""Split work that meets again in one launch: each program parks its fp32 partial in a shared
workspace and bumps an arrival counter; the last program to arrive combines the partials in
split order and stores the result. Deterministic, no zeroed buffer, no second launch; the
counters reset themselves, so the kernels replay inside CUDA graphs.

Every user (the split-K GEMMs, the MoE down GEMM's sum over a token's experts, the one-token
router's logits) touches the workspace only after ``wait_for_inputs``: a dependent launch cannot
reach it while the kernel before is still using it. The arrival costs a GPU-scope release and
the last program's reload: decode attention's merge over context pieces, tried this way, was
slower than its own small merge launch (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

WORKSPACE_FLOATS = 1 << 22  # fp32 partials of one launch
TILE_COUNTERS = 1 << 16  # arrival counters: one a tile (or a group of programs that meet)


def scratch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial-sum workspace and the arrival counters (zero between launches) of the current
    stream: launches on one stream follow each other, but kernels on two streams run at once
    (a MoE block's shared experts beside its routed ones) and must not share them."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    return _scratch(device, stream)


@functools.lru_cache(maxsize=None)
def _scratch(device: torch.device, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(WORKSPACE_FLOATS, dtype=torch.float32, device=device),
            torch.zeros(TILE_COUNTERS, dtype=torch.int32, device=device))


@triton.jit
def write_split_output(acc, rows, cols, M, N, y_ptr, stride_ym, ws_ptr, lock_ptr, tile, pid_k,
                       SPLIT_K: tl.constexpr, addend_ptr=None, HAS_ADDEND: tl.constexpr = False):
    """Store ``acc [R, C]`` (fp32), or, split along K, park it and let the last split add them all;
    ``HAS_ADDEND``: plus ``addend`` (laid out as y), added to the float32 sum."""
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    y_offsets = rows[:, None] * stride_ym + cols[None, :]
    if SPLIT_K == 1:
        _store_sum(acc, y_ptr, y_offsets, mask, addend_ptr, HAS_ADDEND)
    else:
        ws_ptrs = ws_ptr + rows[:, None] * N + cols[None, :]
        tl.store(ws_ptrs + pid_k * M * N, acc, mask=mask)
        tl.debug_barrier()  # every thread's partials are out before the release below
        arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros_like(acc)
            for split in range(SPLIT_K):
                total += tl.load(ws_ptrs + split * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            _store_sum(total, y_ptr, y_offsets, mask, addend_ptr, HAS_ADDEND)
            tl.atomic_xchg(lock_ptr + tile, 0)


@triton.jit
def _store_sum(total, y_ptr, y_offsets, mask, addend_ptr, HAS_ADDEND: tl.constexpr):
    if HAS_ADDEND:
        total += tl.load(addend_ptr + y_offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + y_offsets, total.to(y_ptr.dtype.element_ty), mask=mask)
