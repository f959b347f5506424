"""Registers the quantization methods of this distribution, under the seeds' names and aliases."""

from fastllm.registry import hookimpl

from fastllm_quant.checkpoint_int4 import AwqQuantizer, GptqQuantizer
from fastllm_quant.fp8 import Fp8Quantizer
from fastllm_quant.int4 import WeightOnlyInt4Quantizer
from fastllm_quant.int8 import WeightOnlyInt8Quantizer
from fastllm_quant.lm_head import quantize_lm_head
from fastllm_quant.nf4 import Nf4Quantizer
from fastllm_quant.smooth_quant import SmoothQuantQuantizer


@hookimpl
def register_quantizers():
    return {
        "weight_only_int8": WeightOnlyInt8Quantizer, "ifq": WeightOnlyInt8Quantizer,
        "wint8": WeightOnlyInt8Quantizer,  # FastDeploy's name
        "fp8": Fp8Quantizer,
        "nf4": Nf4Quantizer, "ifq_nf4": Nf4Quantizer,
        "weight_only_int4": WeightOnlyInt4Quantizer, "wint4": WeightOnlyInt4Quantizer,  # FastDeploy's name
        "awq": AwqQuantizer, "gptq": GptqQuantizer,
        "smooth_quant": SmoothQuantQuantizer,
    }


@hookimpl
def register_lm_head_quantizers():
    return {"int8": quantize_lm_head}


@hookimpl
def register_cli_commands():
    from fastllm_quant.cli import register

    return {"quantize": register}
