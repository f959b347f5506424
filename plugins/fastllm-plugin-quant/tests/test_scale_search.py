"""The searched quantizers against plain min-max / absmax scales, on random weights.

Weights are Gaussian and heavy-tailed (Student t, 3 degrees of freedom: a few large
outliers per group, as in real checkpoints). The search minimises an importance-weighted
error (``scale_search.importance``): on that error every group must come out no worse than
with the plain scale, and on the plain squared error the total must be clearly lower. Given
the inputs' loudness, the 4-bit fits must lower the error of the layer's output.
"""

from __future__ import annotations

import pytest
import torch
from fastllm_kernels.quant import NF4_CODES

from fastllm_quant.fp8 import quantize_fp8_rows, quantize_fp8_weight
from fastllm_quant.int4 import quantize_int4
from fastllm_quant.loudness import relative_loudness
from fastllm_quant.nf4 import quantize_nf4
from fastllm_quant.scale_search import importance

CODEBOOK = torch.tensor(NF4_CODES)


def random_weight(kind: str, rows: int = 256, cols: int = 512) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    if kind == "normal":
        return torch.randn(rows, cols, generator=gen) * 0.02
    chi2 = torch.randn(3, rows, cols, generator=gen).pow(2).mean(0)
    return torch.randn(rows, cols, generator=gen) / chi2.sqrt() * 0.02


def assert_better(weight: torch.Tensor, searched: torch.Tensor, plain: torch.Tensor, group: int,
                  total_ratio: float) -> None:
    """Per group no worse on the searched objective; in total lower plain squared error."""
    w = weight.unflatten(1, (-1, group))
    errors = [(d.unflatten(1, (-1, group)) - w).pow(2) for d in (searched, plain)]
    weighted = [(importance(w) * e).sum(-1) for e in errors]
    assert (weighted[0] <= weighted[1] * (1 + 1e-4)).all()
    assert errors[0].sum() < total_ratio * errors[1].sum()


def min_max_int4(weight: torch.Tensor, group: int) -> torch.Tensor:
    """Round-to-nearest with each group's [min, max] over 16 levels (the previous quantizer)."""
    w = weight.unflatten(1, (-1, group))
    low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    scale = (high - low) / 15
    return (torch.round((w - low) / scale).clamp(0, 15) * scale + low).flatten(1)


def absmax_nf4(weight: torch.Tensor, group: int) -> torch.Tensor:
    w = weight.unflatten(1, (-1, group))
    absmax = w.abs().amax(-1, keepdim=True)
    index = (w / absmax)[..., None].sub(CODEBOOK).abs().argmin(-1)
    return (CODEBOOK[index] * absmax).flatten(1)


def dequantize_int4(codes, scales, zeros, group):
    return ((codes.float().unflatten(1, (-1, group)) - zeros[..., None]) * scales[..., None]).flatten(1)


def dequantize_nf4(codes, scales, group):
    return (CODEBOOK[codes.long()].unflatten(1, (-1, group)) * scales[..., None]).flatten(1)


@pytest.mark.parametrize("kind", ["normal", "heavy_tailed"])
@pytest.mark.parametrize("group", [32, 128])
def test_int4_search_beats_min_max(kind, group):
    weight = random_weight(kind)
    codes, scales, zeros = quantize_int4(weight, group)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert scales.shape == zeros.shape == (weight.shape[0], weight.shape[1] // group)
    assert_better(weight, dequantize_int4(codes, scales, zeros, group), min_max_int4(weight, group), group, 0.9)


@pytest.mark.parametrize("kind", ["normal", "heavy_tailed"])
@pytest.mark.parametrize("group", [32, 64])
def test_nf4_search_beats_absmax(kind, group):
    weight = random_weight(kind)
    codes, scales = quantize_nf4(weight, group)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert_better(weight, dequantize_nf4(codes, scales, group), absmax_nf4(weight, group), group, 0.99)


@pytest.mark.parametrize("kind", ["normal", "heavy_tailed"])
def test_fp8_search_beats_absmax(kind):
    weight = random_weight(kind)
    values, scales = quantize_fp8_weight(weight)
    assert values.dtype == torch.float8_e4m3fn and scales.shape == (weight.shape[0],)
    plain_values, plain_scales = quantize_fp8_rows(weight)
    assert_better(weight, values.float() * scales[:, None], plain_values.float() * plain_scales,
                  weight.shape[1], 0.97)


def test_constant_and_zero_groups_stay_exact():
    weight = torch.zeros(4, 64)
    weight[1] = 0.5
    weight[2, :32] = -3.0
    codes, scales, zeros = quantize_int4(weight, 32)
    assert torch.allclose(dequantize_int4(codes, scales, zeros, 32), weight, atol=1e-5)
    assert zeros.abs().max() < 65504  # representable in fp16 checkpoints
    codes, scales = quantize_nf4(weight, 32)
    assert torch.allclose(dequantize_nf4(codes, scales, 32), weight)


def loud_inputs(k: int, tokens: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """``[tokens, k]`` inputs where one channel in 16 is 8x louder, and those channels' indices."""
    gen = torch.Generator().manual_seed(1)
    loud = torch.randperm(k, generator=gen)[:k // 16]
    gain = torch.ones(k)
    gain[loud] = 8.0
    return torch.randn(tokens, k, generator=gen) * gain, loud


@pytest.mark.parametrize("method, group, bound", [("int4", 32, 0.6), ("int4", 128, 0.8), ("nf4", 32, 0.85),
                                                  ("nf4", 64, 0.9)])
def test_loud_inputs_lower_the_output_error(method, group, bound):
    """Inputs where one channel in 16 is 8x louder (the residual stream's outliers): fits weighted
    by the measured loudness cut the output error ``|X (W_q - W)^T|^2`` (measured 0.42 / 0.66 for
    int4, 0.77 / 0.81 for nf4 with its loudness squared, of the unweighted fits')."""
    weight = random_weight("heavy_tailed")
    x, _ = loud_inputs(weight.shape[1])
    loudness = relative_loudness(x.square().mean(0))

    def output_error(loudness):
        if method == "int4":
            dequantized = dequantize_int4(*quantize_int4(weight, group, loudness), group)
        else:
            dequantized = dequantize_nf4(*quantize_nf4(weight, group, loudness), group)
        return (x @ (dequantized - weight).t()).square().sum()

    assert output_error(loudness) < bound * output_error(None)


@pytest.mark.parametrize("group", [32, 64])
def test_nf4_fits_weigh_loudness_squared(group):
    """nf4 weighs its fits by the loudness squared (``nf4.LOUDNESS_POWER``): the loud inputs'
    weights come out clearly closer than under the plain mean-square weighting (measured 0.75 /
    0.84 of its squared error)."""
    weight = random_weight("heavy_tailed")
    x, loud = loud_inputs(weight.shape[1])
    loudness = relative_loudness(x.square().mean(0))

    def loud_error(**power: float) -> torch.Tensor:
        dequantized = dequantize_nf4(*quantize_nf4(weight, group, loudness, **power), group)
        return (dequantized - weight)[:, loud].square().sum()

    assert loud_error() < 0.9 * loud_error(loudness_power=1.0)
