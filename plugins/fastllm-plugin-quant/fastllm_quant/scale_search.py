"""Group scales that minimise the weights' reconstruction error, without calibration data.

Min-max (affine) and absmax (codebook) scales spend the whole code range on each group's one
or two largest weights, so the many small ones fall on a coarse grid. Shrinking the range
clips those few outliers but rounds everything else more finely; which wins depends on the
group. Each group therefore tries a handful of candidate scales and keeps the one with the
lowest error, as llama.cpp's ``make_qkx2_quants`` (k-quants) and AWQ's clip search do. With
no activations to weigh the error by, it is weighted by ``importance``, as llama.cpp does
without an importance matrix.

For fixed codes the best scale (and offset) is a least-squares fit, so each candidate's codes
are refitted before they are scored, and the winner is re-rounded and refitted a few times
more (each step can only lower the error). Only per-group sums are kept between candidates;
everything runs on all groups at once, over row slices that bound the temporaries' memory.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

SHRINK_FACTORS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7)  # affine ranges tried, fractions of min-max
REFINEMENTS = 2
SLICE_ELEMENTS = 1 << 24
# Scales stay above this fraction of the group's absmax, so a flat group's real-valued zero
# point stays within fp16/bf16 range.
MIN_SCALE_FRACTION = 2.0 ** -12


def by_row_slices(weight: torch.Tensor, fit: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
                  ) -> tuple[torch.Tensor, ...]:
    """``fit`` applied to slices of ``weight``'s rows, its results concatenated along rows."""
    rows = max(1, SLICE_ELEMENTS // weight[0].numel())
    parts = [fit(chunk) for chunk in weight.split(rows)]
    return tuple(torch.cat(column) for column in zip(*parts))


def fit_affine(w: torch.Tensor, levels: int, weights: Optional[torch.Tensor] = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Groups ``[..., G, group]`` -> (codes 0..levels, scales, zeros ``[..., G]``), w ~ (q - z) * s.

    The zero points are real numbers: the fit places the grid wherever the group's weights are.
    ``weights`` (broadcast to ``w``) multiply ``importance``: calibrated methods pass how loud
    each input channel is.
    """
    low, high = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
    min_scale = (torch.maximum(-low, high) * MIN_SCALE_FRACTION).clamp(min=1e-12)
    a = importance(w, weights)
    n, sum_w, sum_ww = a.sum(-1, keepdim=True), (a * w).sum(-1, keepdim=True), (a * w * w).sum(-1, keepdim=True)
    best = None
    for step in range(len(SHRINK_FACTORS) + REFINEMENTS):
        if step < len(SHRINK_FACTORS):
            scale = torch.maximum((high - low) * (SHRINK_FACTORS[step] / levels), min_scale)
            offset = (high + low - scale * levels) / 2
        else:
            scale, offset = best[1:]
        codes = affine_codes(w, scale, offset, levels)
        weighted = a * codes
        sum_q = weighted.sum(-1, keepdim=True)
        sum_qq, sum_qw = (weighted * codes).sum(-1, keepdim=True), (weighted * w).sum(-1, keepdim=True)
        det = n * sum_qq - sum_q * sum_q
        fitted = (n * sum_qw - sum_q * sum_w) / det.clamp(min=1e-30)
        scale = torch.maximum(torch.where(det > 0, fitted, scale), min_scale)
        offset = (sum_w - scale * sum_q) / n.clamp(min=1e-30)  # the best offset for this scale
        error = (sum_ww + scale * scale * sum_qq + n * offset * offset
                 - 2 * (scale * sum_qw + offset * sum_w - scale * offset * sum_q))
        best = keep_better(best, (error, scale, offset))
    _, scale, offset = best
    return affine_codes(w, scale, offset, levels), scale.squeeze(-1), (-offset / scale).squeeze(-1)


def affine_codes(w: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, levels: int) -> torch.Tensor:
    """The nearest grid point ``offset + q * scale`` for each weight, as float q in 0..levels."""
    return (w - offset).div_(scale).round_().clamp_(0, levels)


def fit_scale(w: torch.Tensor, nearest: Callable[[torch.Tensor], torch.Tensor], grid_max: float,
              factors: tuple[float, ...], weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Groups ``[..., group]`` -> scales ``[..., 1]`` for ``w ~ nearest(w / s) * s``.

    ``nearest`` rounds to a symmetric grid whose largest value is ``grid_max`` (a codebook,
    float8); candidates start from ``absmax / grid_max * factor``, refitted by least squares.
    ``weights`` as in ``fit_affine``.
    """
    a = importance(w, weights)
    start = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / grid_max
    sum_ww = (a * w * w).sum(-1, keepdim=True)
    best = None
    for step in range(len(factors) + REFINEMENTS):
        scale = start * factors[step] if step < len(factors) else best[1]
        values = nearest(w / scale)
        weighted = a * values
        sum_vv, sum_vw = (weighted * values).sum(-1, keepdim=True), (weighted * w).sum(-1, keepdim=True)
        scale = torch.where(sum_vw > 0, sum_vw / sum_vv.clamp(min=1e-30), scale)
        best = keep_better(best, (sum_ww - 2 * scale * sum_vw + scale * scale * sum_vv, scale))
    return best[1]


def importance(w: torch.Tensor, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-weight weights of the error: ``rms(group) + |w|``, llama.cpp's k-quant choice without
    an importance matrix, so that large weights (which carry large products) are kept closer;
    times ``weights`` (the inputs' loudness) where given."""
    own = w.pow(2).mean(-1, keepdim=True).sqrt() + w.abs()
    return own if weights is None else own * weights


def keep_better(best: tuple[torch.Tensor, ...] | None, candidate: tuple[torch.Tensor, ...]
                ) -> tuple[torch.Tensor, ...]:
    """Per group, whichever of ``best`` and ``candidate`` (both led by their error) is lower."""
    if best is None:
        return candidate
    better = candidate[0] < best[0]
    return tuple(torch.where(better, new, old) for new, old in zip(candidate, best))
