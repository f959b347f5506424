"""Copy-engine sums over two gloo ranks, their transport swapped for an all-gather: a row-parallel
MLP writes its partial in row chunks into the slot it sends from, and the norm after it adds the
ranks' slots as summands; the result must equal one process's MLP, residual add and norm, sum after
sum (the buffers alternate), and a partial that is not in a slot (or does not fit) must sum too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastllm.distributed.parallel_state import all_reduce, set_layout, sums_by_copy
from fastllm.layers.layernorm import RMSNorm
from fastllm.models.llama import LlamaMLP
from fastllm.platforms import copy_engine_sums
from fastllm.platforms.copy_engine_sums import CopyEngineSums

HIDDEN, INTER, TOKENS, MAX_TOKENS, SUMS = 16, 24, 11, 16, 3


class GlooSums(CopyEngineSums):
    """The same bookkeeping, with plain buffers and an all-gather of the slot for the transport."""

    def _buffers(self, group: dist.ProcessGroup, device: torch.device) -> torch.Tensor:
        self.group, self.sends = group, []
        return torch.full((2, self.world, self.max_tokens, self.hidden), float("nan"), dtype=self.dtype)

    def _send(self, parity: int, rows: slice) -> None:
        self.sends.append((parity, rows.start, rows.stop))

    def _arrive(self, parity: int, tokens: int) -> None:
        slots = list(self.buffer[parity, :, :tokens].unbind(0))
        gathered = [torch.empty_like(slot) for slot in slots]
        dist.all_gather(gathered, slots[self.rank].clone(), group=self.group)
        for slot, received in zip(slots, gathered):
            slot.copy_(received)


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
        assert sends == [(parity, *rows) for parity in (0, 1, 0) for rows in chunks] + [(1, 0, 11)]
        assert sums_done == SUMS + 1


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
