"""AWQ and GPTQ int4 checkpoints packed here, independently of the plugin, then loaded by the engine.

Each is compared with a float checkpoint of the same dequantized weights: the engine must
compute the same function (prompt logprobs of a tiny random Llama).
"""

from __future__ import annotations

import torch
import pytest

from fastllm.quantization import CheckpointLayoutError

from quant_helpers import (LINEAR_SHAPES, prompt_logprobs, random_float_weights, tiny_llm, tiny_prompts,
                      write_checkpoint)

GROUP = 32
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def to_int32(values: torch.Tensor) -> torch.Tensor:
    """int64 bit patterns below 2**32 -> int32 with the same bits."""
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32)


def pack_along(codes: torch.Tensor, dim: int, order=tuple(range(8))) -> torch.Tensor:
    """Eight 4-bit values per int32 along ``dim``; nibble i holds element ``order[i]`` of each eight."""
    codes = codes.long().movedim(dim, -1)
    packed = torch.zeros(*codes.shape[:-1], codes.shape[-1] // 8, dtype=torch.long)
    for nibble, element in enumerate(order):
        packed |= codes[..., element::8] << (4 * nibble)
    return to_int32(packed.movedim(-1, dim))


def quantize(weight: torch.Tensor, g_idx: torch.Tensor):
    """Asymmetric 4-bit per group (groups given per input channel); fp16 scales as both tools save."""
    groups = int(g_idx.max()) + 1
    low = torch.stack([weight[:, g_idx == g].amin(1) for g in range(groups)], 1).clamp(max=0)
    high = torch.stack([weight[:, g_idx == g].amax(1) for g in range(groups)], 1).clamp(min=0)
    scales = ((high - low) / 15).half()
    zeros = torch.round(-low / scales.float()).clamp(0, 15)
    codes = torch.round(weight / scales.float()[:, g_idx] + zeros[:, g_idx]).clamp(0, 15)
    dequantized = (codes - zeros[:, g_idx]) * scales.float()[:, g_idx]
    return codes.long(), scales, zeros.long(), dequantized


def build_checkpoints(tmp_path, fmt: str, act_order: bool = False):
    weights = random_float_weights()
    packed, reference = {}, {}
    perms = {k: torch.randperm(k, generator=torch.Generator().manual_seed(k)) for k in (128, 256)}
    for name, tensor in weights.items():
        module = name.rsplit(".", 1)[0]
        if not any(module.endswith(linear) for linear in LINEAR_SHAPES):
            packed[name] = reference[name] = tensor
            continue
        k = tensor.shape[1]
        g_idx = torch.arange(k) // GROUP
        if act_order:  # GPTQ desc_act: columns quantized in a permuted order
            g_idx = torch.empty(k, dtype=torch.long)
            g_idx[perms[k]] = torch.arange(k) // GROUP
        codes, scales, zeros, dequantized = quantize(tensor, g_idx)
        reference[name] = dequantized
        if fmt == "awq":
            packed[module + ".qweight"] = pack_along(codes.T, 1, AWQ_ORDER)
            packed[module + ".qzeros"] = pack_along(zeros.T, 1, AWQ_ORDER)
        else:
            packed[module + ".qweight"] = pack_along(codes.T, 0)
            packed[module + ".qzeros"] = pack_along(zeros.T - 1, 1)
            packed[module + ".g_idx"] = g_idx.to(torch.int32)
        packed[module + ".scales"] = scales.T
    config = ({"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"}
              if fmt == "awq" else
              {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": act_order, "sym": False})
    quantized_dir = write_checkpoint(str(tmp_path / fmt), packed, config)
    return quantized_dir, write_checkpoint(str(tmp_path / "reference"), reference), packed, config


@pytest.mark.parametrize("fmt,act_order", [("awq", False), ("gptq", False), ("gptq", True)])
def test_int4_checkpoint_matches_dequantized_reference(tmp_path, fmt, act_order):
    quantized_dir, reference_dir, _, _ = build_checkpoints(tmp_path, fmt, act_order)
    prompts = tiny_prompts()
    expected = prompt_logprobs(tiny_llm(reference_dir), prompts)
    got = prompt_logprobs(tiny_llm(quantized_dir), prompts)
    assert (got - expected).abs().max() < 1e-3
    # asking for the method the checkpoint declares is the same as asking for nothing
    assert torch.allclose(prompt_logprobs(tiny_llm(quantized_dir, quantization=fmt), prompts), got)


def test_quantizing_a_quantized_checkpoint_is_refused(tmp_path):
    quantized_dir, *_ = build_checkpoints(tmp_path, "awq")
    with pytest.raises(ValueError, match="already quantized with 'awq'"):
        tiny_llm(quantized_dir, quantization="fp8")


def test_declared_method_with_float_tensors_is_refused(tmp_path):
    _, reference_dir, _, config = build_checkpoints(tmp_path, "gptq")
    folder = write_checkpoint(str(tmp_path / "mislabelled"), random_float_weights(), config)
    with pytest.raises(CheckpointLayoutError, match="do not match its declared quantization 'gptq'"):
        tiny_llm(folder)


def test_missing_tensor_is_refused(tmp_path):
    _, _, packed, config = build_checkpoints(tmp_path, "awq")
    del packed["model.layers.1.self_attn.k_proj.qzeros"]
    folder = write_checkpoint(str(tmp_path / "incomplete"), packed, config)
    with pytest.raises(CheckpointLayoutError, match=r"layers\.1\.self_attn\.qkv_proj\.qzeros is missing .*k"):
        tiny_llm(folder)


def test_wrong_packing_is_refused(tmp_path):
    _, _, packed, config = build_checkpoints(tmp_path, "awq")
    name = "model.layers.0.mlp.down_proj.qweight"
    packed[name] = packed[name].T.contiguous()  # GPTQ orientation under an AWQ label
    folder = write_checkpoint(str(tmp_path / "transposed"), packed, config)
    with pytest.raises(CheckpointLayoutError, match="down_proj|qweight"):
        tiny_llm(folder)


@pytest.mark.parametrize("config,match", [
    ({"quant_method": "gptq", "bits": 8, "group_size": 32}, "bits=8"),
    ({"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemv"}, "version='gemv'"),
    ({"quant_method": "squeezed", "bits": 4}, "no plugin registers"),
])
def test_unsupported_checkpoint_configs(tmp_path, config, match):
    folder = write_checkpoint(str(tmp_path / "ckpt"), random_float_weights(), config)
    with pytest.raises(ValueError, match=match):
        tiny_llm(folder)


def test_unknown_method_lists_the_registered_ones(tmp_path):
    folder = write_checkpoint(str(tmp_path / "float"), random_float_weights())
    with pytest.raises(ValueError, match=r"unknown quantizer 'int3'(.|\n)*weight_only_int8"):
        tiny_llm(folder, quantization="int3")


@pytest.mark.parametrize("method", ["smooth_quant", "gptq"])
def test_calibrated_methods_need_fastllm_quantize(tmp_path, method):
    folder = write_checkpoint(str(tmp_path / "float"), random_float_weights())
    with pytest.raises(ValueError, match="fastllm quantize"):
        tiny_llm(folder, quantization=method)
