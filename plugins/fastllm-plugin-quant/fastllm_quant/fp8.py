"""``fp8``: W8A8 with float8 e4m3 weights (a scale per output channel) and activations quantized
per token at run time.

Float8 keeps about the same relative precision at any scale, but which weights land near a
grid point depends on the scale: each channel tries eight scales over one octave (the e4m3
grid repeats every factor of two; none clips), refits each by least squares and keeps the one
with the lowest weight error (``scale_search``). Activations keep the plain per-token absmax:
their scale is computed at run time, on the hot path.

On CUDA, decode-sized batches (``fused``: up to 64 rows) skip the activation quantization: the
W8A16 kernel widens the e4m3 weights in registers and streams them once, as weight-only int8
does. Larger batches on GPUs with FP8 tensor cores (compute capability >= 8.9) quantize the
activations in one fused kernel and call ``torch._scaled_mm`` with both scales in its epilogue;
the weight ``[N, K]`` row-major is already the column-major ``[K, N]`` operand it wants, so
``weight.t()`` is a view, never a copy. Elsewhere a torch path performs the same roundings
(activations to e4m3, weights as stored) and multiplies in float32.

MoE models' routed experts (``FusedMoE``'s stacked ``w13``/``w2``) become e4m3 too, with a scale
per expert and output channel searched the same way; fastllm-kernels' grouped expert kernel
widens them in registers (W8A16 at every batch size), the torch reference dequantizes one expert
at a time. The router stays in the model dtype.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from fastllm_kernels.quant import fp8_linear, quantize_fp8_rows
from fastllm_kernels.quant.common import fused

from fastllm.layers.fused_moe import FusedMoE
from fastllm.layers.linear import LinearBase
from fastllm.quantization import Calibration, LinearSpec, QuantizedLinear, Quantizer

from fastllm_quant.scale_search import by_row_slices, fit_scale

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
OCTAVE = tuple(2.0 ** (i / 8) for i in range(8))


def nearest_fp8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8).float()


def quantize_fp8_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` -> (e4m3 ``[N, K]``, float32 scale ``[N]``), the scale searched per channel."""
    def fit(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = rows.float()
        scale = fit_scale(w, nearest_fp8, FP8_MAX, OCTAVE)
        return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale.squeeze(1)

    return by_row_slices(weight, fit)


def quantize_fp8_experts(moe: FusedMoE) -> None:
    """``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` to e4m3 in place, with ``w13_scale [E, 2I]`` and
    ``w2_scale [E, H]``: every expert's output channels scaled as ``Fp8Linear``'s are."""
    for name in ("w13", "w2"):
        weight = getattr(moe, name).data
        experts, rows, cols = weight.shape
        codes, scale = quantize_fp8_weight(weight.reshape(experts * rows, cols))
        setattr(moe, name, nn.Parameter(codes.view(experts, rows, cols), requires_grad=False))
        setattr(moe, f"{name}_scale", nn.Parameter(scale.view(experts, rows), requires_grad=False))


@functools.lru_cache(maxsize=None)
def has_fp8_tensor_cores(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def fp8_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """``x [M, K]`` -> ``[M, N]`` in x's dtype; ``weight`` e4m3 ``[N, K]``, ``weight_scale`` ``[N]`` float32."""
    if fused(x):
        return fp8_linear(x, weight, weight_scale)
    x_fp8, x_scale = quantize_fp8_rows(x)
    if has_fp8_tensor_cores(x.device):
        return torch._scaled_mm(x_fp8, weight.t(), scale_a=x_scale, scale_b=weight_scale[None, :],
                                out_dtype=x.dtype)
    return (F.linear(x_fp8.float(), weight.float()) * x_scale * weight_scale).to(x.dtype)


class Fp8Linear(QuantizedLinear):
    """``weight`` e4m3 ``[N, K]``, ``weight_scale`` float32 ``[N]``."""

    def __init__(self, spec: LinearSpec):
        super().__init__(spec)
        self.add_tensor("weight", spec.empty(spec.input_size, dtype=FP8))
        self.add_tensor("weight_scale", spec.empty(dtype=torch.float32))

    @classmethod
    def from_float(cls, layer: LinearBase) -> "Fp8Linear":
        module = cls(LinearSpec.of(layer))
        module.copy_bias(layer)
        weight, scale = quantize_fp8_weight(layer.weight.data)
        module.weight.data.copy_(weight)
        module.weight_scale.data.copy_(scale)
        return module

    def apply_weights(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_gemm(x, self.weight, self.weight_scale)


class Fp8Quantizer(Quantizer):
    name = "fp8"

    def prepare_model(self, model: nn.Module) -> None:
        """Pre-quantized checkpoints: the routed experts load e4m3 codes and their scales too."""
        super().prepare_model(model)
        if self.prequantized:
            for moe in model.modules():
                if isinstance(moe, FusedMoE):
                    for name in ("w13", "w2"):
                        experts, rows, cols = getattr(moe, name).shape
                        moe.expect_checkpoint_tensor(name, (experts, rows, cols), FP8)
                        moe.expect_checkpoint_tensor(f"{name}_scale", (experts, rows), torch.float32)

    def quantize_model(self, model: nn.Module, calibrate: Calibration | None = None) -> None:
        """Every linear layer, then (quantizing online) the routed experts of each MoE layer."""
        super().quantize_model(model, calibrate)
        if not self.prequantized:
            for module in model.modules():
                if isinstance(module, FusedMoE):
                    quantize_fp8_experts(module)

    def quantize_layer(self, layer: LinearBase) -> Fp8Linear:
        return Fp8Linear.from_float(layer)

    def checkpoint_layer(self, layer: LinearBase) -> Fp8Linear:
        return Fp8Linear(LinearSpec.of(layer))

    def checkpoint_config_to_save(self) -> dict:
        return {"quant_method": self.name, "activation_scheme": "dynamic", "weight_scheme": "per_channel"}
