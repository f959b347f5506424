"""Copy-engine sums over two gloo ranks, their transport swapped for an all-gather: a row-parallel
MLP writes its partial in row chunks into the slot it sends from, and the norm after it adds the
ranks' slots as summands; the result must equal one process's MLP, residual add and norm, sum after
sum (the buffers alternate), and a partial that is not in a slot (or does not fit) must sum too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.multiprocessing as mp

from fastllm.distributed.parallel_state import all_reduce, set_layout, settled, sums_by_copy
from fastllm.layers.layernorm import RMSNorm
from fastllm.layers.linear import ColumnParallelLinear
from fastllm.models.llama import LlamaMLP
from fastllm.platforms import copy_engine_sums
from fastllm.platforms.copy_engine_sums import CopyEngineSums

HIDDEN, INTER, TOKENS, MAX_TOKENS, SUMS = 16, 24, 11, 16, 3


class GlooSums(CopyEngineSums):
    """The same bookkeeping, with plain buffers and gloo for the transport: each send is recorded
    with the rows it copies, and a barrier delivers every rank's recorded sends to their peers."""

    def _buffers(self, group: dist.ProcessGroup, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        self.group, self.sends, self.queued = group, [], []
        return (torch.full((2, self.world, self.max_tokens, self.hidden), float("nan"), dtype=self.dtype),
                torch.full((2, self.max_tokens, self.hidden), float("nan"), dtype=self.dtype))

    def _send(self, parity: int, rows: slice, peers: tuple[int, ...]) -> None:
        self.sends.append(("sum", parity, rows.start, rows.stop, peers))
        self.queued.append(("sum", parity, rows, peers, self.buffer[parity, self.rank, rows].clone()))

    def _send_gathered(self, parity: int, rows: slice) -> None:
        self.sends.append(("gather", parity, rows.start, rows.stop, self.peers))
        self.queued.append(("gather", parity, rows, self.peers, self.gathered[parity, rows].clone()))

    def _barrier(self) -> None:
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, (self.rank, self.queued), group=self.group)
        self.queued = []
        for sender, sends in everyone:
            for kind, parity, rows, peers, rows_data in sends:
                if self.rank in peers:
                    target = self.buffer[parity, sender, rows] if kind == "sum" else self.gathered[parity, rows]
                    target.copy_(rows_data)

    def _wait_side(self) -> None:
        pass


def _weights() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    gate, up = (torch.randn(INTER, HIDDEN, generator=gen) / 4 for _ in range(2))
    down = torch.randn(HIDDEN, INTER, generator=gen) / 4
    norm = 1 + torch.rand(HIDDEN, generator=gen)
    inputs = [torch.randn(TOKENS, HIDDEN, generator=gen) for _ in range(SUMS)]
    residuals = [torch.randn(TOKENS, HIDDEN, generator=gen) for _ in range(SUMS)]
    return gate, up, down, norm, inputs, residuals


def _mlp(tp: bool) -> tuple[LlamaMLP, RMSNorm]:
    gate, up, down, norm_weight, _, _ = _weights()
    mlp = LlamaMLP(SimpleNamespace(hidden_size=HIDDEN, intermediate_size=INTER), reduce_results=False)
    mlp.gate_up_proj.weight_loader(mlp.gate_up_proj.weight, gate, 0)
    mlp.gate_up_proj.weight_loader(mlp.gate_up_proj.weight, up, 1)
    mlp.down_proj.weight_loader(mlp.down_proj.weight, down)
    norm = RMSNorm(HIDDEN, sums_partials=tp)
    norm.weight.data.copy_(norm_weight)
    return mlp, norm


def _rank(rank: int, init: str, results: dict) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        set_layout(2, 1)
        copy_engine_sums.CHUNK_ROWS, copy_engine_sums.ROW_ALIGN = 2, 1  # 11 rows: chunks of 3, 5 and 3
        _, _, _, _, inputs, residuals = _weights()
        mlp, norm = _mlp(tp=True)
        sums = GlooSums(dist.group.WORLD, torch.device("cpu"), MAX_TOKENS, HIDDEN, torch.float32, min_bytes=0)
        outputs = []
        with torch.inference_mode(), sums_by_copy(sums, TOKENS):
            for x, residual in zip(inputs, residuals):
                outputs.append(norm(mlp(x), residual))
            # a partial made elsewhere is copied into the slot; one of another dtype takes the all-reduce
            outputs.append((all_reduce(inputs[0] * (rank + 1)), all_reduce(inputs[0].double() * (rank + 1))))
        results[rank] = (outputs, sums.sends, sums.sums_done)
    finally:
        dist.destroy_process_group()


def test_chunked_partials_sum_like_one_process(tmp_path):
    _, _, _, _, inputs, residuals = _weights()
    mlp, norm = _mlp(tp=False)
    with torch.inference_mode():
        expected = [norm(mlp(x), residual) for x, residual in zip(inputs, residuals)]
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(f"file://{tmp_path}/rendezvous", results), nprocs=2)
    for rank in (0, 1):
        outputs, sends, sums_done = results[rank]
        for (out, new_residual), (want, want_residual) in zip(outputs[:SUMS], expected):
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(new_residual, want_residual, rtol=1e-5, atol=1e-5)
        copied, other_dtype = outputs[SUMS]
        torch.testing.assert_close(copied, inputs[0] * 3)
        torch.testing.assert_close(other_dtype, inputs[0].double() * 3)
        # each MLP sum: three chunks sent by the GEMM, in alternating buffers; then the copied partial whole
        chunks = [(0, 3), (3, 8), (8, 11)]
        peer = (1 - rank,)
        assert sends == [("sum", parity, *rows, peer) for parity in (0, 1, 0) for rows in chunks] + [
            ("sum", 1, 0, 11, peer)]
        assert sums_done == SUMS + 1


def _sequence_parallel_rank(rank: int, world: int, init: str, results: dict) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        set_layout(world, 1)
        copy_engine_sums.ROW_ALIGN = 1  # 11 rows: blocks 0-5 / 6-10 at two ranks, 0-3 / 4-6 / 7-10 at three
        _, _, _, _, inputs, residuals = _weights()
        mlp, norm = _mlp(tp=True)
        sums = GlooSums(dist.group.WORLD, torch.device("cpu"), MAX_TOKENS, HIDDEN, torch.float32, min_bytes=0)
        sums.sequence_parallel = True
        hidden, residual = inputs[0], residuals[0].clone()
        with torch.inference_mode(), sums_by_copy(sums, TOKENS):
            for index in range(SUMS):  # each MLP's gate/up takes the last norm's rows while the peers' land
                partial = mlp(hidden)  # the last one copied out of its slot: the norm copies it back and sends it
                hidden, residual = norm(partial if index < SUMS - 1 else partial.clone(), residual)
            assert sums.rows_in_flight(hidden) == sums.blocks(TOKENS)[rank]
            projection = ColumnParallelLinear(HIDDEN, 6, bias=True)  # with a bias, as Qwen2's qkv_proj
            gen = torch.Generator().manual_seed(rank)
            projection.weight.copy_(torch.randn(projection.weight.shape, generator=gen))
            projection.bias.copy_(torch.randn(projection.bias.shape, generator=gen))
            projected = projection(hidden)  # this rank's rows, then the peers' once they land
            assert sums.rows_in_flight(hidden) is None
            hidden = settled(hidden)
        torch.testing.assert_close(projected, F.linear(hidden, projection.weight, projection.bias))
        results[rank] = (hidden, residual, sums.sends)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world, bounds", [(2, [0, 6, 11]), (3, [0, 4, 7, 11])])
def test_sequence_parallel_norms_sum_like_one_process(tmp_path, world, bounds):
    """Each norm adds and normalises only its rank's rows and gathers the rest: three MLP + norm
    blocks in a chain equal one process's, every rank ending with all rows of the output and its
    own rows of the residual; each rank sent each peer only that peer's rows of its partials, the
    peers' blocks from the next rank round (the last partial twice: once by the GEMM, once by the
    norm that found it outside the slot), and its own rows of each norm's output to every peer."""
    _, _, _, _, inputs, residuals = _weights()
    mlp, norm = _mlp(tp=False)
    hidden, residual = inputs[0], residuals[0]
    with torch.inference_mode():
        for _ in range(SUMS):
            hidden, residual = norm(mlp(hidden), residual)
    results = mp.Manager().dict()
    mp.spawn(_sequence_parallel_rank, args=(world, f"file://{tmp_path}/rendezvous", results), nprocs=world)
    for rank in range(world):
        out, new_residual, sends = results[rank]
        own = slice(bounds[rank], bounds[rank + 1])
        torch.testing.assert_close(out, hidden, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(new_residual[own], residual[own], rtol=1e-5, atol=1e-5)
        owners = [(rank + step) % world for step in range(1, world)]
        peers = tuple(peer for peer in range(world) if peer != rank)

        def scatter(parity: int) -> list[tuple]:
            return [("sum", parity, bounds[owner], bounds[owner + 1], (owner,)) for owner in owners]

        gather = [("gather", parity, own.start, own.stop, peers) for parity in (0, 1)]
        assert sends == scatter(0) + gather[:1] + scatter(1) + gather[1:] + scatter(0) * 2 + gather[:1]


@pytest.mark.parametrize("tokens, max_chunks, bounds", [
    (8192, 3, [0, 2048, 6144, 8192]),  # the ends half as tall as the middle
    (8192, 2, [0, 4096, 8192]),
    (8192, 4, [0, 1408, 4096, 6784, 8192]),  # on whole 128-row tiles
    (3000, 3, [0, 1536, 3000]),  # a third chunk would be under 1024 rows
    (2047, 3, [0, 2047]),
    (8192, 1, [0, 8192]),
])
def test_row_chunks(tokens, max_chunks, bounds):
    chunks = copy_engine_sums.row_chunks(tokens, max_chunks)
    assert [c.start for c in chunks] + [chunks[-1].stop] == bounds
