"""GPTQ (Frantar et al., 2022): 4-bit codes chosen one input column at a time, with error feedback.

Round-to-nearest rounds every weight on its own. GPTQ minimises the layer's output error on
calibration activations ``X`` instead: after rounding column ``j`` it moves the columns not yet
rounded to cancel that column's error, along the inverse of the Hessian ``H = 2 X^T X / n``
(the Optimal Brain Surgeon update). The upper Cholesky factor of ``H^-1`` gives every update
at once; columns go in blocks of 128 whose updates to the rest are applied as one matrix
product (the paper's lazy batch updates).

The output is ``weight_only_int4``'s format: codes 0..15 with a scale and real-valued zero point
per group of inputs, ``w ~ (q - z) * s``. A group's scale and zero are fitted
(``scale_search.fit_affine``, each weight's error weighted by its input's loudness) when its
first column comes up, on the weights as the earlier columns' errors have left them. With
``act_order`` columns go in order of decreasing ``H`` diagonal (the loudest inputs first, while
the most columns are left to absorb their error); the groups stay contiguous in the original
order, fitted before any update (AutoGPTQ's ``static_groups``), so the checkpoint needs no
permutation.
"""

from __future__ import annotations

from typing import Optional

import torch

from fastllm.layers.linear import LinearBase
from fastllm.quantization import LinearSpec

from fastllm_quant.int4 import Int4Linear
from fastllm_quant.loudness import relative_loudness
from fastllm_quant.scale_search import fit_affine

BLOCK_SIZE = 128
DAMPING = 0.01  # of the mean Hessian diagonal, added to the diagonal: keeps H invertible
LEVELS = 15


def fit_groups(columns: torch.Tensor, group_size: int, loudness: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[K', N]`` input columns (K' a multiple of ``group_size``) -> scales, zeros ``[N, K'/group]``.

    Each weight's error counts in proportion to its input's mean square (``loudness``, the
    Hessian diagonal), as llama.cpp's importance matrix weighs it.
    """
    weights = loudness.unflatten(0, (-1, group_size))
    _, scales, zeros = fit_affine(columns.t().unflatten(1, (-1, group_size)), LEVELS, weights)
    return scales, zeros


def inverse_hessian_factor(hessian: torch.Tensor) -> torch.Tensor:
    """Upper triangular ``U`` with ``U^T U = H^-1`` for the damped ``H``, without forming ``H^-1``.

    With ``J`` the reversal, ``J H J = M M^T`` (lower Cholesky) gives ``H = R R^T`` for the upper
    ``R = J M J``, so ``U = R^-1``: one factorisation and one triangular solve.
    """
    h = hessian.float().clone()
    dead = h.diagonal() == 0  # inputs that were always zero: no error feedback through them
    h[dead, dead] = 1.0
    h.diagonal().add_(DAMPING * h.diagonal().mean())
    r = torch.linalg.cholesky(h.flip(0, 1)).flip(0, 1)
    return torch.linalg.solve_triangular(r, torch.eye(len(h), device=h.device), upper=True)


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, act_order: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``weight [N, K]``, ``hessian [K, K]`` -> (codes uint8 ``[N, K]``, scales, zeros ``[N, K/group]``)."""
    k = weight.shape[1]
    if k % group_size:
        raise ValueError(f"group_size {group_size} does not divide {k} input features")
    block = max(BLOCK_SIZE // group_size, 1) * group_size  # a group never straddles two blocks
    columns = weight.float().t().contiguous()  # [K, N]: one input column per row, updated in place
    loudness = relative_loudness(hessian.diagonal())
    perm: Optional[torch.Tensor] = None
    scales = zeros = None
    if act_order:
        scales, zeros = fit_groups(columns, group_size, loudness)
        perm = torch.argsort(hessian.diagonal(), descending=True)
        columns, hessian = columns[perm], hessian[perm][:, perm]
    else:
        scales = columns.new_empty(columns.shape[1], k // group_size)
        zeros = torch.empty_like(scales)
    factor = inverse_hessian_factor(hessian)
    groups = (perm if perm is not None else torch.arange(k, device=weight.device)) // group_size
    codes = torch.empty_like(columns)
    for start in range(0, k, block):
        end = min(start + block, k)
        errors = columns.new_empty(end - start, columns.shape[1])
        for j in range(start, end):
            if perm is None and j % group_size == 0:
                now = slice(j, j + group_size)
                scale, zero = fit_groups(columns[now], group_size, loudness[now])
                scales[:, j // group_size], zeros[:, j // group_size] = scale[:, 0], zero[:, 0]
            s, z = scales[:, groups[j]], zeros[:, groups[j]]
            codes[j] = (columns[j] / s + z).round_().clamp_(0, LEVELS)
            error = (columns[j] - (codes[j] - z) * s) / factor[j, j]
            columns[j + 1:end].addmm_(factor[j, j + 1:end, None], error[None], alpha=-1)  # BLAS: beats addr_
            errors[j - start] = error
        columns[end:].addmm_(factor[start:end, end:].t(), errors, alpha=-1)
    if perm is not None:
        codes = codes[torch.argsort(perm)]
    return codes.t().to(torch.uint8), scales, zeros


def gptq_linear(layer: LinearBase, hessian: torch.Tensor, group_size: int, act_order: bool) -> Int4Linear:
    """``layer`` as an ``Int4Linear`` whose codes GPTQ chose for the activations behind ``hessian``."""
    module = Int4Linear(LinearSpec.of(layer), group_size)
    module.copy_bias(layer)
    return module.set_weights(*gptq_quantize(layer.weight.data, hessian, module.group_size, act_order))
