"""The barrier-free all-reduce, its ranks simulated in one process on one device: every rank's
buffer is an ordinary tensor, and the ranks' kernels run one after another. A rank's kernel
waits for data from the ranks after it, so the test stores their parts first, as their
kernels would; what the earlier ranks' kernels push arrives for real. Four calls in a row turn
the buffers' phases over once, so a slot left unemptied or a phase that does not advance
shows up as a wrong sum or a rank that never finishes (the interpreter would loop forever:
the earlier ranks' pushes are what lets the later ranks through)."""

from __future__ import annotations

import pytest
import torch

from fastllm_kernels.lamport_all_reduce import (EMPTY_BITS, PHASES, PeerBuffers, fits, lamport_all_reduce,
                                                lamport_all_reduce_add_rms_norm)
from fastllm_kernels.rms_norm import fused_add_rms_norm_ref
from kernel_testing import DEVICE, TOLERANCE, randn, rel_err

SLOT = 3 * 64  # elements a rank's part may take


class SimulatedGroup:
    """``world`` ranks' buffers and states on one device."""

    def __init__(self, world: int):
        self.world = world
        self.buffers = [torch.full((PHASES * world * SLOT,), EMPTY_BITS, dtype=torch.int16, device=DEVICE)
                        for _ in range(world)]
        pointers = torch.tensor([b.data_ptr() for b in self.buffers], dtype=torch.int64, device=DEVICE)
        self.peers = [PeerBuffers(pointers, torch.zeros(2, dtype=torch.int32, device=DEVICE), rank, world, SLOT)
                      for rank in range(world)]

    def pre_push(self, parts: list[torch.Tensor]) -> None:
        """Store each later rank's part into each earlier rank's buffer, as its kernel would."""
        phase = int(self.peers[0].state[0])
        for rank in range(self.world):
            for source in range(rank + 1, self.world):
                part = parts[source].reshape(-1)
                part = torch.where(part == 0, torch.zeros_like(part), part)
                start = (phase * self.world + source) * SLOT
                self.buffers[rank][start:start + part.numel()].copy_(part.view(torch.int16))

    def slots_empty(self, phase: int) -> bool:
        """Whether every rank's slots of ``phase`` for its peers' parts read as empty again."""
        return all(bool((self.buffers[rank][phase * self.world * SLOT:(phase + 1) * self.world * SLOT]
                         .view(self.world, SLOT)[[s for s in range(self.world) if s != rank]] == EMPTY_BITS).all())
                   for rank in range(self.world))


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("rows,hidden", [(1, 64), (3, 40)])
def test_all_reduce_add_rms_norm_over_calls(world, rows, hidden):
    dtype = torch.float16
    group = SimulatedGroup(world)
    weight = randn(hidden, dtype=dtype)
    for call in range(PHASES + 1):
        parts = [randn(rows, hidden, dtype=dtype) for _ in range(world)]
        parts[0][0, :4] = -0.0  # must not read as "not written" on the other ranks
        residual = randn(rows, hidden, dtype=dtype)
        group.pre_push(parts)

        outs = [lamport_all_reduce_add_rms_norm(parts[r], residual, weight, 1e-6, group.peers[r])
                for r in range(world)]

        summed = sum(p.double() for p in parts).to(dtype).double()  # rounded as the all-reduce output is
        ref, ref_residual = fused_add_rms_norm_ref(summed, residual.double(), weight.double(), 1e-6)
        for out, new_residual in outs:
            assert rel_err(out, ref) < TOLERANCE[dtype]
            assert rel_err(new_residual, ref_residual) < TOLERANCE[dtype]
            assert torch.equal(out, outs[0][0]) and torch.equal(new_residual, outs[0][1])  # the same bits
        assert all(p.state.tolist() == [(call + 1) % PHASES, 0] for p in group.peers)
        assert group.slots_empty((call + PHASES - 1) % PHASES)  # the call before's, emptied for the next turn


def test_all_reduce_alone():
    dtype, world = torch.float16, 2
    group = SimulatedGroup(world)
    for _ in range(2):
        parts = [randn(2, 7, 8, dtype=dtype) for _ in range(world)]
        group.pre_push(parts)

        outs = [lamport_all_reduce(parts[r], group.peers[r]) for r in range(world)]

        assert outs[0].shape == (2, 7, 8)
        assert rel_err(outs[0], sum(p.double() for p in parts)) < TOLERANCE[dtype]
        assert torch.equal(outs[0], outs[1])


def test_fits_only_16_bit_rows_within_a_slot():
    peers = SimulatedGroup(2).peers[0]
    assert fits(torch.empty(3, 64, dtype=torch.float16), peers)
    assert not fits(torch.empty(4, 64, dtype=torch.float16), peers)  # more than a slot
    assert not fits(torch.empty(2, 64, dtype=torch.float32), peers)
    assert not fits(torch.empty(0, 64, dtype=torch.float16), peers)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="a trap ends this process's CUDA context")
def test_a_peer_that_never_writes_ends_the_wait():
    """The wait for a gone peer is bounded: past ``max_polls`` the kernel gives up (a PTX trap on a
    GPU; the interpreter, which has no inline assembly, raises at the same place) instead of
    spinning forever."""
    group = SimulatedGroup(2)
    group.peers[0].max_polls = 8
    with pytest.raises(Exception, match="inline_asm"):
        lamport_all_reduce(randn(1, 16, dtype=torch.float16), group.peers[0])
