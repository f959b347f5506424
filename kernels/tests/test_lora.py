import pytest
import torch

from fastllm_kernels.lora import lora_expand, lora_expand_ref, lora_shrink, lora_shrink_ref
from kernel_testing import DEVICE, DTYPES, TOLERANCE, randn, rel_err

# Tokens of the base model (-1), of slots 0 and 2, interleaved as a mixed batch packs them.
SLOTS = [-1, 0, 2, 0, -1, 2, 2, 1, -1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inner,rank,outputs", [(200, 16, 150), (64, 5, 300)])
def test_shrink_then_expand_match_the_per_token_reference(dtype, inner, rank, outputs):
    slots = torch.tensor(SLOTS, dtype=torch.int32, device=DEVICE)
    x = randn(len(SLOTS), inner, dtype=dtype)
    a = randn(3, rank, inner, dtype=dtype) / inner ** 0.5
    b = randn(3, outputs, rank, dtype=dtype)
    scale = torch.tensor([0.5, 2.0, 1.25], device=DEVICE)
    y = randn(len(SLOTS), outputs, dtype=dtype)
    base = y.clone()

    xa = lora_shrink(x, a, slots)
    xa_ref = lora_shrink_ref(x, a, slots)
    lora_expand(y, xa, b, scale, slots)

    assert xa.dtype == torch.float32 and rel_err(xa, xa_ref) < TOLERANCE[dtype]
    assert (xa[slots < 0] == 0).all()
    assert rel_err(y, lora_expand_ref(base, xa_ref, b, scale, slots)) < TOLERANCE[dtype]
    assert torch.equal(y[slots < 0], base[slots < 0])  # base-model tokens are untouched
    assert rel_err(y[slots >= 0], base[slots >= 0]) > 0.1  # and the others did change


def test_a_strided_input_and_an_empty_batch():
    slots = torch.tensor([1, 0], dtype=torch.int32, device=DEVICE)
    x = randn(2, 128, dtype=torch.float32)[:, ::2]
    a = randn(2, 4, 64, dtype=torch.float32)
    assert rel_err(lora_shrink(x, a, slots), lora_shrink_ref(x, a, slots)) < 1e-5
    empty = torch.empty(0, dtype=torch.int32, device=DEVICE)
    assert lora_shrink(x[:0], a, empty).shape == (0, 4)
