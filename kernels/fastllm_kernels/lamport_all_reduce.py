"""All-reduce of decode-sized rows over GPUs that map each other's memory, with no barrier, and
optionally the residual add and RMSNorm that follow it in the same kernel.

A barrier-based one-shot all-reduce pays two cross-GPU round trips a call (ranks signal that the
inputs are staged, then that they are read) before and after the sum, and the norm after it is
one more launch that cannot start early. Here every rank pushes its partial rows straight into a
slot of each peer's buffer and polls its own buffer until every peer's slot holds data: an
element reads as ``-0.0`` until its writer's store lands (writers turn ``-0.0`` into ``+0.0``),
so the data is its own flag (Lamport's scheme, as in TensorRT-LLM's and FlashInfer's fused
all-reduce). Three buffer phases rotate, one a call: a rank empties the slots of the call
before while it reads this one, and no peer can write them again before it has read this
call's data, two calls on. A device counter holds the phase, so the kernel replays in CUDA
graphs; every rank must make the same sequence of calls.

Every rank sums the parts in rank order, so all ranks get the same bits. A peer whose data never
comes (its process died) stops the kernel with a trap after ``max_polls`` polls, a minute or more:
the next synchronisation raises a CUDA error instead of the engine hanging.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fastllm_kernels.host_math import next_power_of_2
from fastllm_kernels.pdl import pdl_launch, wait_for_inputs
from fastllm_kernels.rms_norm import as_rows

PHASES = 3
EMPTY_BITS = -32768  # -0.0 as a 16-bit float
MAX_HIDDEN = 16384  # a row lives in one program's registers
MAX_POLLS = 2 ** 27
_PHASES, _EMPTY_BITS = tl.constexpr(PHASES), tl.constexpr(EMPTY_BITS)  # as the kernel reads them


@triton.jit
def _give_up(waiting):
    """End the kernel with an error (PTX ``trap``): the peer it waits for is gone."""
    tl.inline_asm_elementwise("trap;", "=r,r", [waiting], dtype=tl.int32, is_pure=False, pack=1)


@dataclass
class PeerBuffers:
    """One rank's view of the group's buffers: ``pointers[r]`` is rank ``r``'s buffer (mapped
    here), each ``PHASES x world x slot_elements`` 16-bit elements, filled with -0.0 before the
    first call; ``state`` (int32 [2], zeros at first) holds the next call's phase and the count
    of this call's programs that have finished."""

    pointers: torch.Tensor
    state: torch.Tensor
    rank: int
    world: int
    slot_elements: int
    max_polls: int = MAX_POLLS  # of a peer's slot before the kernel gives up on that peer


@triton.jit
def _lamport_all_reduce_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr, pointers_ptr, state_ptr,
    eps, hidden, num_rows, rank, slot_elements, max_polls,
    stride_x, stride_residual, stride_out, stride_new_residual,
    WORLD: tl.constexpr, BLOCK: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    dtype = out_ptr.dtype.element_ty
    own = tl.load(pointers_ptr + rank).to(tl.pointer_type(dtype))  # no kernel writes these two:
    if NORM:  # loaded while the kernel before finishes
        weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    wait_for_inputs(PDL, RELEASE_FIRST=True)
    phase = tl.load(state_ptr)
    phase_elements = WORLD * slot_elements
    mine = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=mask, other=0.0)
    mine = tl.where(mine == 0.0, 0.0, mine)  # -0.0 would read as "not written"
    into_slot = phase * phase_elements + rank * slot_elements + row * hidden + cols
    for peer in tl.static_range(WORLD):
        if peer != rank:
            peer_buffer = tl.load(pointers_ptr + peer).to(tl.pointer_type(dtype))
            tl.store(peer_buffer + into_slot, mine, mask=mask)
    if NORM:  # under the peers' latency
        residual = tl.load(residual_ptr + row.to(tl.int64) * stride_residual + cols, mask=mask, other=0.0)
    # the call before's slots, read by this rank then, written again only two calls on
    previous = (phase + _PHASES - 1) % _PHASES
    empty = tl.full([BLOCK], _EMPTY_BITS, tl.int16).to(dtype, bitcast=True)
    for source in tl.static_range(WORLD):
        if source != rank:
            tl.store(own + previous * phase_elements + source * slot_elements + row * hidden + cols, empty,
                     mask=mask)

    total = tl.zeros([BLOCK], dtype=tl.float32)
    for source in tl.static_range(WORLD):
        if source == rank:
            total += mine.to(tl.float32)
        else:
            row_at = own + phase * phase_elements + source * slot_elements + row * hidden
            # spin on the row's last element alone first: a whole row re-read by every waiting
            # program takes the memory system from the peers' incoming stores
            last_at = (row_at + hidden - 1).to(tl.pointer_type(tl.int16))
            polls = 0
            while tl.load(last_at, volatile=True) == _EMPTY_BITS:
                polls += 1
                if polls > max_polls:
                    _give_up(polls)
            part_at = row_at + cols
            part = tl.load(part_at, mask=mask, other=0.0, volatile=True)
            waiting = tl.sum((part.to(tl.int16, bitcast=True) == _EMPTY_BITS).to(tl.int32), 0)
            while waiting > 0:
                part = tl.load(part_at, mask=mask, other=0.0, volatile=True)
                waiting = tl.sum((part.to(tl.int16, bitcast=True) == _EMPTY_BITS).to(tl.int32), 0)
                polls += 1
                if polls > max_polls:
                    _give_up(waiting)
            total += part.to(tl.float32)

    summed = total.to(dtype)
    if NORM:
        new_residual = (summed.to(tl.float32) + residual.to(tl.float32)).to(dtype)
        tl.store(new_residual_ptr + row.to(tl.int64) * stride_new_residual + cols, new_residual, mask=mask)
        x = new_residual.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, 0) / hidden + eps)
        summed = (x * rstd * weight).to(dtype)
    tl.store(out_ptr + row.to(tl.int64) * stride_out + cols, summed, mask=mask)

    if num_rows == 1:  # the phase moves on once every program has read it
        tl.store(state_ptr, (phase + 1) % _PHASES)
    else:
        finished = tl.atomic_add(state_ptr + 1, 1, sem="relaxed")
        if finished == num_rows - 1:
            tl.store(state_ptr + 1, 0)
            tl.store(state_ptr, (phase + 1) % _PHASES)


def fits(x: torch.Tensor, peers: PeerBuffers) -> bool:
    """Whether ``x`` (rows of its last dimension) goes through ``peers``' slots."""
    return (x.dtype in (torch.bfloat16, torch.float16) and x.dim() >= 1 and 0 < x.shape[-1] <= MAX_HIDDEN
            and 0 < x.numel() <= peers.slot_elements)


def _launch(x: torch.Tensor, peers: PeerBuffers, out: torch.Tensor, residual: torch.Tensor | None = None,
            weight: torch.Tensor | None = None, new_residual: torch.Tensor | None = None, eps: float = 0.0) -> None:
    rows, hidden = x.shape
    block = next_power_of_2(hidden)
    norm = residual is not None
    _lamport_all_reduce_kernel[(rows,)](
        x, residual if norm else x, weight if norm else x, out, new_residual if norm else out,
        peers.pointers, peers.state, eps, hidden, rows, peers.rank, peers.slot_elements, peers.max_polls,
        x.stride(0), residual.stride(0) if norm else 0, out.stride(0), new_residual.stride(0) if norm else 0,
        WORLD=peers.world, BLOCK=block, NORM=norm, num_warps=min(16, max(4, block // 512)),
        **pdl_launch(x.device),
    )


def lamport_all_reduce(x: torch.Tensor, peers: PeerBuffers) -> torch.Tensor:
    """The sum of ``x`` over the group, in a new tensor."""
    rows = as_rows(x)
    out = torch.empty_like(rows)
    _launch(rows, peers, out)
    return out.view(x.shape)


def lamport_all_reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                                    peers: PeerBuffers) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(s + residual), s + residual)`` for ``s`` the sum of ``x`` over the group, the
    sum rounded to ``x.dtype`` first (as an all-reduce followed by the fused norm would)."""
    rows, residual_rows = as_rows(x), as_rows(residual)
    out, new_residual = torch.empty_like(rows), torch.empty_like(residual_rows)
    _launch(rows, peers, out, residual_rows, weight, new_residual, eps)
    return out.view(x.shape), new_residual.view(residual.shape)
