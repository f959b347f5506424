"""FastDeploy's weight-only names on an MoE model: ``wint8`` / ``wint4`` are the int8 / int4
quantizers, and they quantize every linear layer outside the routed experts (attention, dense
and shared-expert MLPs); the router stays in the model dtype, and so do the stacked expert
weights under int8, while int4 and nf4 pack them into 4-bit codes for the grouped kernel."""

from __future__ import annotations

import pytest
import torch

from fastllm import LLM, SamplingParams
from fastllm.engine.in_process import engine_model
from fastllm.layers.fused_moe import FusedMoE
from fastllm.quantization import QuantizedLinear
from fastllm.registry import registry
from tests.models.tiny_checkpoints import save_tiny_checkpoint

PROMPT = [5, 17, 42, 99, 3, 8, 100, 200, 31, 64, 77, 12, 13, 14]
QUANTIZED = {"self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj",
             "mlp.shared_experts.gate_up_proj", "mlp.shared_experts.down_proj"}


@pytest.fixture(scope="module")
def ernie_moe(tmp_path_factory):
    folder, _ = save_tiny_checkpoint("ernie4_5_moe", tmp_path_factory.mktemp("ernie4_5_moe"))
    return folder, _prompt_logprobs(LLM(folder, dtype="float32", num_gpu_blocks_override=16))


def _prompt_logprobs(llm: LLM) -> torch.Tensor:
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    output = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
    return torch.tensor([step[token] for token, step in zip(PROMPT[1:], output.prompt_logprobs[1:])])


def test_fastdeploy_names_are_aliases():
    assert registry.get("quantizers", "wint8") is registry.get("quantizers", "weight_only_int8")
    assert registry.get("quantizers", "wint4") is registry.get("quantizers", "weight_only_int4")


# mean |logprob error| per prompt token: twice what these loud random weights measured
@pytest.mark.parametrize("method, mean_error, expert_dtype", [("wint8", 0.05, torch.float32),
                                                               ("wint4", 1.0, torch.uint8),
                                                               ("nf4", 1.0, torch.uint8)])
def test_quantizes_every_linear_layer_and_4_bit_the_routed_experts(ernie_moe, method, mean_error, expert_dtype):
    folder, expected = ernie_moe
    llm = LLM(folder, dtype="float32", quantization=method, num_gpu_blocks_override=16)
    model = engine_model(llm)
    quantized = {name.split(".", 3)[-1] for name, module in model.named_modules()
                 if isinstance(module, QuantizedLinear)}
    assert quantized == QUANTIZED
    moe = model.model.layers[1].mlp
    assert isinstance(moe, FusedMoE) and moe.gate.weight.dtype == torch.float32
    assert moe.w13.dtype == moe.w2.dtype == expert_dtype
    assert (moe.w13_zero is None) == (method != "wint4") and (moe.book is None) == (method != "nf4")
    assert (_prompt_logprobs(llm) - expected).abs().mean().item() < mean_error
