"""``awq`` and ``gptq``: 4-bit checkpoints made by AutoAWQ / AutoGPTQ, run by ``Int4Linear``;
``gptq`` also quantizes a float model offline (``fastllm quantize --quant-type gptq``, ``gptq.py``).

Both store ``qweight``, ``qzeros`` (int32, eight 4-bit values each) and ``scales``; GPTQ adds
``g_idx``. While loading, each tensor is unpacked to output-rows-first codes, so fused layers
and tensor-parallel shards load through the shared loader; ``finish_loading`` repacks the whole
layer into ``Int4Linear``'s layout (and, for act-order GPTQ, sorts input channels by group).

Layouts (K inputs, N outputs, G groups):

* GPTQ: ``qweight [K/8, N]`` packed along K; ``qzeros [G, N/8]`` packed along N and stored
  minus one (``checkpoint_format`` "gptq"; "gptq_v2" stores the zero itself); ``scales [G, N]``;
  ``g_idx [K]``, the group of each input channel.
* AWQ (GEMM): ``qweight [K, N/8]`` and ``qzeros [G, N/8]`` packed along N in the order
  0, 2, 4, 6, 1, 3, 5, 7; ``scales [G, N]``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn as nn

from fastllm.layers.linear import LinearBase
from fastllm.quantization import Calibration, LinearSpec, QuantizedLinear, Quantizer
from fastllm.quantization.linear import CheckpointLayoutError

from fastllm_quant.common import option, require
from fastllm_quant.gptq import gptq_linear
from fastllm_quant.int4 import Int4Linear, WeightOnlyInt4Quantizer
from fastllm_quant.sequential import quantize_sequentially

SEQUENTIAL = (0, 1, 2, 3, 4, 5, 6, 7)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ_ORDER[i]: the column held by nibble i


def unpack_int32(packed: torch.Tensor, dim: int, order: tuple[int, ...] = SEQUENTIAL) -> torch.Tensor:
    """Eight 4-bit values per int32 along ``dim`` -> uint8 values, ``dim`` eight times longer."""
    shifts = torch.tensor([4 * order.index(i) for i in range(8)], dtype=torch.int32, device=packed.device)
    moved = packed.movedim(dim, -1).to(torch.int32)
    values = (moved[..., None] >> shifts) & 0xF
    return values.flatten(-2).movedim(-1, dim).to(torch.uint8)


class PackedInt4CheckpointLinear(QuantizedLinear):
    """Holds one layer's AWQ/GPTQ tensors as unpacked codes until the whole layer is loaded."""

    def __init__(self, spec: LinearSpec, group_size: int, awq: bool, zero_offset: int):
        super().__init__(spec)
        k = spec.input_size
        self.group_size = k if group_size == -1 else group_size
        if k % self.group_size:
            raise CheckpointLayoutError(f"group_size {group_size} does not divide {k} input features")
        self.awq, self.zero_offset = awq, zero_offset
        groups = k // self.group_size
        self.add_tensor("qweight", spec.empty(k, dtype=torch.uint8))
        self.add_tensor("qzeros", spec.empty(groups, dtype=torch.uint8))
        self.add_tensor("scales", spec.empty(groups))
        if not awq:
            self.add_tensor("g_idx", torch.empty(k, dtype=torch.int32, device=spec.device),
                            layout="input", required=False)

    def convert_loaded(self, name: str, loaded: torch.Tensor) -> torch.Tensor:
        if loaded.dtype == torch.int32 and name in ("qweight", "qzeros"):
            if self.awq:
                loaded = unpack_int32(loaded, 1, AWQ_ORDER)
            else:
                loaded = unpack_int32(loaded, 0 if name == "qweight" else 1)
        elif name in ("qweight", "qzeros"):
            raise CheckpointLayoutError(f"{name} must be int32 (eight 4-bit values each), got {loaded.dtype}")
        return loaded if name == "g_idx" else loaded.t()

    def apply_weights(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a 4-bit checkpoint layer runs only after finish_loading repacks it")

    def finish_loading(self, prefix: str) -> Int4Linear:
        super().finish_loading(prefix)
        codes, scales = self.qweight.data, self.scales.data
        zeros = self.qzeros.data.to(scales.dtype) + self.zero_offset
        perm = self.act_order_permutation(prefix)
        if perm is not None:
            codes = codes[:, perm]
        module = Int4Linear(self.spec, self.group_size)
        repeat = self.group_size // module.group_size
        module.set_weights(codes, scales.repeat_interleave(repeat, 1), zeros.repeat_interleave(repeat, 1))
        module.copy_bias(self)
        if perm is not None:
            module.input_perm = perm
        return module

    def act_order_permutation(self, prefix: str) -> Optional[torch.Tensor]:
        """Input order that makes each group contiguous, or None when it already is."""
        if "g_idx" not in self.loaded_shards:
            return None
        g_idx = self.g_idx.data.long()
        in_order = torch.arange(g_idx.numel(), device=g_idx.device) // self.group_size
        if torch.equal(g_idx, in_order):
            return None
        perm = torch.argsort(g_idx, stable=True)
        if not torch.equal(g_idx[perm], in_order):
            raise CheckpointLayoutError(f"{prefix}.g_idx does not give every group {self.group_size} inputs")
        return perm


CHECKPOINT_GROUP_SIZE = 128  # AutoGPTQ's and AutoAWQ's default, for configs that leave it out


class _Int4CheckpointQuantizer(Quantizer):
    """Shared by AWQ and GPTQ: 4-bit only, read from checkpoints (they are calibrated offline)."""

    awq = False

    def __init__(self, checkpoint_config: Optional[dict[str, Any]] = None, **options: Any):
        super().__init__(checkpoint_config, **options)
        config = checkpoint_config or {}
        require(config, "bits", 4, self.name)
        self.group_size = option(self, "group_size", CHECKPOINT_GROUP_SIZE)

    def zero_offset(self) -> int:
        return 0

    def checkpoint_layer(self, layer: LinearBase) -> PackedInt4CheckpointLinear:
        return PackedInt4CheckpointLinear(LinearSpec.of(layer), self.group_size, self.awq, self.zero_offset())


class AwqQuantizer(_Int4CheckpointQuantizer):
    name = "awq"
    awq = True

    def __init__(self, checkpoint_config: Optional[dict[str, Any]] = None, **options: Any):
        super().__init__(checkpoint_config, **options)
        require(checkpoint_config or {}, "zero_point", True, self.name)
        require(checkpoint_config or {}, "version", "gemm", self.name)


class GptqQuantizer(_Int4CheckpointQuantizer):
    """Loads AutoGPTQ checkpoints; given calibration (``fastllm quantize``), runs GPTQ itself.

    Options when quantizing: ``group_size`` (default 128) and ``act_order`` (default False).
    """

    name = "gptq"

    def zero_offset(self) -> int:
        """AutoGPTQ's original format stores each zero point minus one."""
        return 0 if (self.checkpoint_config or {}).get("checkpoint_format") == "gptq_v2" else 1

    def quantize_model(self, model: nn.Module, calibrate: Optional[Calibration] = None) -> None:
        if self.prequantized:
            return super().quantize_model(model)
        if calibrate is None:
            raise ValueError("gptq quantizes a float model with calibration activations: make a checkpoint "
                             "with `fastllm quantize --quant-type gptq` and load that")
        act_order = bool(self.options.get("act_order", False))
        quantize_sequentially(model, calibrate,
                              lambda layer, hessian: gptq_linear(layer, hessian, self.group_size, act_order))

    def checkpoint_config_to_save(self) -> dict[str, Any]:
        """``weight_only_int4``'s config: GPTQ only chooses the codes, so the saved directory loads
        through ``Int4Linear`` as is; the extra keys record how the codes were made."""
        saved = WeightOnlyInt4Quantizer(None, group_size=self.group_size).checkpoint_config_to_save()
        return {**saved, "calibration": "gptq", "act_order": bool(self.options.get("act_order", False))}
