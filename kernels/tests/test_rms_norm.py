import pytest
import torch

from fastllm_kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_ref, rms_norm, rms_norm_ref
from kernel_testing import DEVICE, DTYPES, TOLERANCE, randn, rel_err

SHAPES = [(5, 1000), (3, 4096)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", SHAPES)
def test_rms_norm_matches_reference(dtype, rows, hidden):
    x, weight = randn(rows, hidden, dtype=dtype), randn(hidden, dtype=dtype)

    out = rms_norm(x, weight, 1e-6)

    assert out.dtype == dtype
    assert rel_err(out, rms_norm_ref(x.double(), weight.double(), 1e-6)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", SHAPES)
def test_fused_add_rms_norm_matches_reference(dtype, rows, hidden):
    x, residual = randn(rows, hidden, dtype=dtype), randn(rows, hidden, dtype=dtype)
    weight = randn(hidden, dtype=dtype)

    out, new_residual = fused_add_rms_norm(x, residual, weight, 1e-5)
    ref, ref_residual = fused_add_rms_norm_ref(x.double(), residual.double(), weight.double(), 1e-5)

    assert rel_err(out, ref) < TOLERANCE[dtype]
    assert rel_err(new_residual, ref_residual) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("summands", [2, 8])
def test_fused_add_rms_norm_adds_float32_summands_first(dtype, summands):
    """``x [rows, S, hidden]`` float32 (an MoE block's expert rows): summed, then added to the residual."""
    x = randn(3, summands, 1000, dtype=torch.float32)
    residual, weight = randn(3, 1000, dtype=dtype), randn(1000, dtype=dtype)

    out, new_residual = fused_add_rms_norm(x, residual, weight, 1e-5)
    ref, ref_residual = fused_add_rms_norm_ref(x.double(), residual.double(), weight.double(), 1e-5)

    assert out.dtype == new_residual.dtype == dtype and out.shape == residual.shape
    assert rel_err(out, ref) < TOLERANCE[dtype]
    assert rel_err(new_residual, ref_residual) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_writes_rows_of_given_tensors(dtype):
    """A sequence-parallel norm: the ranks' partials of some rows as strided summands (slots of a
    ``[ranks, tokens, hidden]`` buffer, transposed), the residual updated in place, the output
    written into those rows of a larger tensor; the other rows are left alone."""
    slots, residual = randn(2, 9, 1000, dtype=dtype), randn(9, 1000, dtype=dtype)
    weight, out = randn(1000, dtype=dtype), torch.full((9, 1000), float("nan"), dtype=dtype, device=DEVICE)
    rows, before = slice(4, 9), residual.clone()
    summands = slots[:, rows].transpose(0, 1)

    fused_add_rms_norm(summands, residual[rows], weight, 1e-5, out=out[rows], new_residual=residual[rows])
    ref, ref_residual = fused_add_rms_norm_ref(summands.double(), before[rows].double(), weight.double(), 1e-5)

    assert rel_err(out[rows], ref) < TOLERANCE[dtype]
    assert rel_err(residual[rows], ref_residual) < TOLERANCE[dtype]
    assert out[:4].isnan().all() and torch.equal(residual[:4], before[:4])
