import pytest
import torch

from fastllm_kernels.lora import (TILE_TOKENS, lora_expand, lora_expand_ref, lora_expand_tokens, lora_shrink,
                                  lora_shrink_ref, lora_shrink_tokens, lora_tiles)
from kernel_testing import DEVICE, DTYPES, TOLERANCE, randn, rel_err

# Base-model tokens (-1) and slots 0..2 interleaved as a mixed batch packs decodes, then a prefill
# of slot 0 longer than one tile.
SLOTS = [-1, 0, 2, 0, -1, 2, 2, 1, -1] + [0] * (TILE_TOKENS + 5)


def _tiles(slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    order, tiles = lora_tiles(slots)
    return (torch.tensor(order, dtype=torch.int32, device=DEVICE),
            torch.tensor(tiles, dtype=torch.int32, device=DEVICE))


def test_tiles_group_tokens_by_slot():
    order, tiles = lora_tiles([1, -1, 0, 1, 0, 0], tile=2)
    assert order == [2, 4, 5, 0, 3]
    assert tiles == [0, 2, 0, 2, 1, 0, 3, 2, 1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inner,rank,outputs", [(200, 16, 150), (64, 5, 80), (1100, 12, 150)])
@pytest.mark.parametrize("kind", ["groups", "tokens"])
def test_shrink_then_expand_match_the_per_token_reference(dtype, inner, rank, outputs, kind):
    """``groups``: tiles of tokens by slot (eager steps); ``tokens``: each token's slot read on the
    device, inner features split over programs (captured graphs)."""
    slots = torch.tensor(SLOTS, dtype=torch.int32, device=DEVICE)
    x = randn(len(SLOTS), inner, dtype=dtype)
    a = randn(3, rank, inner, dtype=dtype) / inner ** 0.5
    b = randn(3, outputs, rank, dtype=dtype)
    scale = torch.tensor([0.5, 2.0, 1.25], device=DEVICE)
    y = randn(len(SLOTS), outputs, dtype=dtype)
    base = y.clone()
    used = slots >= 0

    if kind == "groups":
        order, tiles = _tiles(SLOTS)
        xa = lora_shrink(x, a, order, tiles)
        lora_expand(y, xa, b, scale, order, tiles)
    else:
        partials = lora_shrink_tokens(x, a, slots)
        lora_expand_tokens(y, partials, b, scale, slots)
        xa = partials[:, :, :rank].sum(0)  # the splits' sums, as the expand adds them
    xa_ref = lora_shrink_ref(x, a, slots)

    assert xa.dtype == torch.float32 and rel_err(xa[used], xa_ref[used]) < TOLERANCE[dtype]
    assert rel_err(y, lora_expand_ref(base, xa_ref, b, scale, slots)) < TOLERANCE[dtype]
    assert torch.equal(y[~used], base[~used])  # base-model tokens are untouched
    assert rel_err(y[used], base[used]) > 0.1  # and the others did change


def test_a_strided_input_and_no_adapter_tokens():
    order, tiles = _tiles([1, 0])
    slots = torch.tensor([1, 0], dtype=torch.int32, device=DEVICE)
    x = randn(2, 128, dtype=torch.float32)[:, ::2]
    a = randn(2, 4, 64, dtype=torch.float32)
    assert rel_err(lora_shrink(x, a, order, tiles), lora_shrink_ref(x, a, slots)) < 1e-5
    none_order, none_tiles = _tiles([-1, -1])
    y = randn(2, 8, dtype=torch.float32)
    assert torch.equal(lora_expand(y.clone(), lora_shrink(x, a, none_order, none_tiles), randn(2, 8, 4, dtype=torch.float32),
                                   torch.ones(2, device=DEVICE), none_order, none_tiles), y)

